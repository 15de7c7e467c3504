"""Which epoch a pass reads, agreed by every process that iterates a copy of one dataset.

The rule (docs/guarantees.md): each new pass reads the next epoch, unless ``set_epoch(e)``
was called since the last pass (then epoch e), or a state was loaded (then the rest of that
state's epoch, once). A DataLoader's workers each iterate their own copy of the dataset:
new processes every pass, or the same ones (``persistent_workers``), forked or spawned. So
the rule's memory cannot live in the copies: it lives in one small JSON file that every copy
names, read and written under an exclusive ``flock``.

Invariants:
- A pass is the set of workers that start iterating with one pass id (``pass_id``): the
  workers of one DataLoader iteration share it, the next iteration's differ. Every worker of
  a pass gets the decision the first one made.
- A pending ``set_epoch`` or state is taken by exactly one pass.
- The file belongs to the process that made the clock, which removes it when the clock is
  collected; copies in other processes only read and write it.
"""

import fcntl
import json
import os
import tempfile
import weakref

__all__ = ["PassClock"]

_EMPTY = {"pending": None, "last": None}


class PassClock:
    """The pending ``set_epoch``/state and the last pass's decision, shared across processes."""

    def __init__(self):
        handle, self.path = tempfile.mkstemp(prefix="pileshuffle-passes-", suffix=".json")
        with os.fdopen(handle, "w") as out:
            json.dump(_EMPTY, out)
        weakref.finalize(self, _remove, self.path, os.getpid())

    def __getstate__(self):  # a spawned worker gets the path, not the owner's finalizer
        return {"path": self.path}

    def __setstate__(self, state):
        self.path = state["path"]

    def set_epoch(self, epoch: int):
        """The next pass reads ``epoch`` from its start, unless a state of that same epoch
        is pending (the usual ``set_epoch`` at the start of the resumed epoch keeps it)."""

        def change(record):
            pending = record["pending"]
            if not (pending and pending.get("state") is not None and pending["epoch"] == epoch):
                record["pending"] = {"epoch": epoch, "state": None}

        self._update(change)

    def load_state(self, state, epoch: int):
        """The next pass resumes ``state`` (one state or a list of states) of ``epoch``."""

        def change(record):
            record["pending"] = {"epoch": epoch, "state": state}

        self._update(change)

    def peek(self, first_epoch: int) -> dict:
        """What a new pass would get now: ``{"epoch": e, "state": s or None}``
        (``first_epoch``: what the first pass reads when nothing is pending)."""
        return _decide(self._read(), first_epoch)

    def current(self, first_epoch: int, at_start: bool = False) -> dict:
        """The pass under way (with nothing pending since: the last one), else what a new one
        gets. ``at_start``: nothing of the pass under way was taken yet, so a last pass whose
        every worker has ended is over, and the pass under way is the next one (its workers
        may not have begun yet: ``iter(loader)`` returns before they start)."""
        record = self._read()
        last = record["last"]
        if record["pending"] is None and last is not None:
            over = at_start and len(last.get("ended", [])) == last["num_workers"]
            if not over:
                return last["decision"]
        return _decide(record, first_epoch)

    def end(self, pass_id, worker: int):
        """``worker`` has handed out the whole of its part of pass ``pass_id``."""

        def change(record):
            last = record["last"]
            if (
                last is not None
                and last["id"] == list(pass_id)
                and worker not in last.setdefault("ended", [])
            ):
                last["ended"].append(worker)

        self._update(change)

    def begin(
        self, pass_id, worker: int, num_workers: int, first_epoch: int, resumed_epoch=None
    ) -> dict:
        """The decision for ``worker`` of ``num_workers`` starting pass ``pass_id``: the
        decision of the pass it joins, or a new pass's (taking what is pending). A worker
        that resumes its own state (``resumed_epoch``) starts a pass of that epoch."""
        decision = {}

        def change(record):
            last = record["last"]
            if (
                last is not None
                and last["id"] == list(pass_id)
                and last["num_workers"] == num_workers
                and worker not in last["members"]
            ):
                last["members"].append(worker)
                decision.update(last["decision"])
                return
            new = _decide(record, first_epoch)
            if resumed_epoch is not None:
                new = {"epoch": int(resumed_epoch), "state": None}
            record["pending"] = None
            record["last"] = {
                "id": list(pass_id),
                "num_workers": num_workers,
                "members": [worker],
                "decision": new,
            }
            decision.update(new)

        self._update(change)
        return decision

    def _read(self) -> dict:
        with open(self.path) as handle:
            fcntl.flock(handle, fcntl.LOCK_SH)
            return json.load(handle)

    def _update(self, change):
        with open(self.path, "r+") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            record = json.load(handle)
            change(record)
            handle.seek(0)
            handle.truncate()
            json.dump(record, handle)


def _decide(record, first_epoch: int) -> dict:
    """A new pass's decision: what is pending, else the epoch after the last pass's, else
    ``first_epoch``."""
    if record["pending"] is not None:
        return dict(record["pending"])
    if record["last"] is not None:
        return {"epoch": record["last"]["decision"]["epoch"] + 1, "state": None}
    return {"epoch": int(first_epoch), "state": None}


def _remove(path: str, owner: int):
    if os.getpid() == owner:
        try:
            os.remove(path)
        except OSError:
            pass
