"""Pass-1 runs kept in this process's memory instead of the temp folder, up to a budget.

When both passes run in one process (the local runner's in-process modes), a run that fits in
what ``--memory`` leaves for intermediates (``Plan.memory_for_runs``) is kept here under the path
it would have had on disk, segment by segment (no index: each element names its segment), and
pass 2 reads its segments from here (``fragments``): the data between the passes never touches
the disk. A run that does not fit goes to the temp folder as before, so a budget too small for any
run gives the on-disk behaviour, and the bytes out are the same for any budget. Runs are dropped
with their folder (``drop``, called by ``output_files.remove_tree``): when the output is
published, or when the run fails; a killed process takes them with it.

Thread-safe: the runner's worker threads share one table, ``path -> {offset: segment}``, and one
budget per folder of runs.
"""

import threading

__all__ = ["room", "keep", "segment", "drop", "kept_bytes"]

_lock = threading.Lock()
_runs = {}  # path -> {offset: segment bytes}
_room = {}  # folder of runs -> bytes of its budget still free


def room(folder: str, budget: int) -> int:
    """What is left of ``folder``'s ``budget``."""
    with _lock:
        return _room.get(folder, budget)


def keep(folder: str, budget: int, path: str, segments: dict) -> bool:
    """Keep ``segments`` (offset -> bytes) as the run at ``path`` (under ``folder``) if they fit in
    what is left of ``folder``'s ``budget``; whether they were kept (if not, write them to disk)."""
    size = sum(len(s) for s in segments.values())
    with _lock:
        left = _room.get(folder, budget)
        if size > left:
            return False
        _room[folder] = left - size
        _runs[path] = segments
        return True


def segment(path: str, offset: int):
    """The segment at ``offset`` of the run kept at ``path``, or None if no run is kept there."""
    kept = _runs.get(path)
    return None if kept is None else kept[offset]


def drop(folder: str):
    """Forget every run kept under ``folder`` and its budget."""
    prefix = folder.rstrip("/") + "/"
    with _lock:
        for path in [p for p in _runs if p.startswith(prefix)]:
            del _runs[path]
        for kept in [f for f in _room if f == folder or f.startswith(prefix)]:
            del _room[kept]


def kept_bytes() -> int:
    """The bytes of every run kept in this process."""
    with _lock:
        return sum(len(s) for kept in _runs.values() for s in kept.values())
