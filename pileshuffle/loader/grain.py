"""Grain adapter: ``ds.grain()`` is a ``grain.IterDataset`` of the records ``iter(ds)`` gives.

Invariants:
- One process (a JAX host: ``rank``/``world_size``, or Grain's ``ShardOptions`` such as
  ``ShardByJaxProcess()``) reads its share of every epoch; Grain's ``mp_prefetch`` worker w of
  W (``set_slice``) reads contiguous part w of that share, as a DataLoader worker does.
- An iterator reads ``num_epochs`` epochs (None: endless), from the epoch the dataset's next
  pass reads (``set_epoch`` wins; a loaded state resumes; each new iterator of the same
  object in this process reads the epoch after the last one's). ``mp_prefetch`` workers are
  new processes with a copy of the dataset: call ``set_epoch`` before each such iterator, or
  use one endless iterator (the JAX way).
- ``get_state()`` is ``{"pileshuffle": the consumer's state, "pool": ...}`` (JSON), which
  Grain's checkpointing and Orbax save. ``set_state`` of a state saved by this host resumes
  exactly. A state saved by host r of N restores on host r' of M (**elastic**) under the
  assumption of synchronous training: every host had taken as many records as this one when
  the checkpoint was taken. Then the old hosts' unfinished tails (each the same number of
  records in) are dealt out again among the M hosts, in global order, in equal parts
  (``split.redeal(..., equal=True)``; ``remainder="drop"`` leaves out fewer than M records,
  as the standard split does): nothing repeated. Parts of unequal sizes would break the
  lockstep the next elastic restore assumes: a host whose shorter part ran out stops one
  record before the others, and its state says the others were where it was (a record read
  twice). ``pool`` holds the records the current split was dealt from (None: the
  standard split), so that a split made by an elastic restore can be restored elastically
  again. The number of ``mp_prefetch`` workers must stay the same (Grain's state has one
  entry per worker); each worker's stream is dealt again on its own.

Only this module imports grain.
"""

import copy

import grain

from pileshuffle.loader import split
from pileshuffle.loader.arguments import whole_number

__all__ = ["GrainDataset", "GrainIterator"]


class GrainDataset(grain.IterDataset):
    """``dataset``'s records as a Grain ``IterDataset`` (module docstring)."""

    def __init__(self, dataset, *, shard_options=None, num_epochs=1):
        super().__init__()
        if shard_options is not None:
            dataset = _resplit(
                dataset, int(shard_options.shard_index), int(shard_options.shard_count)
            )
        self._dataset = dataset
        self._worker = (0, 1)
        self._num_epochs = None if num_epochs is None else whole_number("num_epochs", num_epochs, 1)

    def set_slice(self, sl: slice, sequential_slice: bool = False):
        """Grain's ``mp_prefetch`` worker ``sl.start`` of ``sl.step``: a contiguous part
        of the share."""
        self._worker = (sl.start or 0, sl.step or 1)

    def set_epoch(self, epoch: int):
        """The next iterator starts at epoch ``epoch``."""
        self._dataset.set_epoch(epoch)

    def __iter__(self) -> "GrainIterator":
        return GrainIterator(self._dataset, self._worker, self._num_epochs)

    def __str__(self) -> str:
        return (
            f"GrainDataset({self._dataset!r}, worker {self._worker[0]}/{self._worker[1]}, "
            f"{self._num_epochs} epochs)"
        )


class GrainIterator(grain.DatasetIterator):
    """Records of ``num_epochs`` epochs of one worker's part; its state is the loader's."""

    def __init__(self, dataset, worker, num_epochs):
        super().__init__()
        self._dataset, self._worker, self._num_epochs = dataset, worker, num_epochs
        self._part, self._pool, self._records, self._epochs, self._reading = (
            None,
            None,
            None,
            0,
            False,
        )

    def _begun(self):
        """The part this iterator reads, and the dataset told that a pass of its epoch began
        (the next iterator reads the epoch after it), at the first record, not when the
        iterator is made: Grain makes iterators in the main process that it never reads
        (``mp_prefetch``) and pickles the dataset for each worker after that."""
        if not self._reading:
            # (not ``or``: a part with nothing left to read is empty, and falsy)
            if self._part is None:
                self._part = self._dataset.for_worker(*self._worker)
            self._dataset.set_epoch(self._part.epoch)
            self._dataset._begin_pass()
            self._reading = True
        return self._part

    def __next__(self):
        self._begun()
        while True:
            if self._records is None:
                self._records = iter(self._part)
            try:
                return next(self._records)
            except StopIteration:
                self._epochs += 1
                if self._num_epochs is not None and self._epochs >= self._num_epochs:
                    raise
                self._start(
                    self._dataset._at_epoch(self._part.epoch + 1).for_worker(*self._worker), None
                )

    def _start(self, part, pool):
        self._part, self._pool, self._records = part, pool, None

    def get_state(self) -> dict:
        """The state; before the first record, that of the pass's start (no pass begun: Grain
        asks iterators in the main process that it never reads)."""
        part = self._dataset.for_worker(*self._worker) if self._part is None else self._part
        return {"pileshuffle": part.state_dict(), "pool": self._pool}

    def set_state(self, state: dict):
        saved, pool = state["pileshuffle"], state.get("pool")
        self._dataset._check_state(saved)
        part = self._dataset._at_epoch(int(saved["epoch"])).for_worker(*self._worker)
        if list(saved["consumer"]) == part._consumer():
            part.load_state_dict(saved)
            self._start(part, pool)
            return
        old = list(saved["consumer"])
        if tuple(old[2:4] or (0, 1)) != self._worker or len(old) > 4:
            raise ValueError(
                f"a state of worker {old[2:4] or [0, 1]} (worker, num_workers) restored on worker "
                f"{list(self._worker)}: Grain restores each mp_prefetch worker's state, so keep "
                "the number of workers; the number of hosts may change"
            )
        pool = _tails_in_lockstep(part, old, pool, int(saved["position"]))
        part._ranges = split.redeal(pool, part.rank, part.world_size, part.remainder, equal=True)
        part._position = part._resume_at = 0
        self._start(part, pool)

    def __str__(self) -> str:
        return f"GrainIterator({self._dataset if self._part is None else self._part!r})"


def _tails_in_lockstep(part, old, pool, position: int) -> list:
    """The unfinished records of every host of the old split ``old`` = [rank, hosts, worker,
    workers], each ``position`` records into its ranges (dealt from ``pool``, or the
    standard split when None), in global order."""
    worker_parts = old[2:4]
    tails = []
    for rank in range(old[1]):
        if pool is None:
            ranges = part._split_of([rank, old[1], *worker_parts])
        else:
            ranges = split.redeal(
                [tuple(r) for r in pool], rank, old[1], part.remainder, equal=True
            )
        tails += split.tail(ranges, min(position, split.length(ranges)))
    return split.union(tails)


def _resplit(dataset, rank: int, world_size: int):
    """``dataset`` read as host ``rank`` of ``world_size`` (Grain's shard options)."""
    if dataset.world_size != 1 and (dataset.rank, dataset.world_size) != (rank, world_size):
        raise ValueError(
            f"the dataset is rank {dataset.rank} of {dataset.world_size} and shard_options say "
            f"{rank} of {world_size}: give one of them"
        )
    view = copy.copy(dataset)
    view.world_size = whole_number("shard_count", world_size, 1)
    view.rank = whole_number("shard_index", rank, 0, view.world_size, "shard_count")
    view._start_epoch(dataset._next_pass().epoch)
    return view
