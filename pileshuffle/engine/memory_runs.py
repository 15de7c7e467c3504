"""Pass-1 runs kept in this process's memory instead of the temp folder, up to a budget.

When both passes run in one process (the local runner's in-process modes), a run that fits in
what ``--memory`` leaves for intermediates (``Plan.memory_for_runs``) is kept here under the path
it would have had on disk, segment by segment (no index: each element names its segment), and
pass 2 reads its segments from here: the data between the passes never touches the disk. A
segment is kept as the records pass 1 made, not IPC-encoded nor gathered into one batch: a
table of slices of the chunks pass 1 held (``runs._sliced``), or a record batch. Pass 2 takes
them as they are (``records``; ``pile_groups``), and a reader that wants the segment's bytes
(``segment``: a pile split again, a streamed one) gets them encoded when it asks, the bytes a
run on disk holds (one record batch). A
run that does not fit goes to the temp folder as before, so a budget too small for any run gives
the on-disk behaviour, and the bytes out are the same for any budget. Runs are dropped
with their folder (``drop``, called by ``output_files.remove_tree``): when the output is
published, or when the run fails; a killed process takes them with it.

Thread-safe: the runner's worker threads share one table, ``path -> {offset: records}``,
and one budget per folder of runs.
"""

import threading

import pyarrow as pa

__all__ = ["room", "keep", "holds", "records", "segment", "drop", "kept_bytes"]

_lock = threading.Lock()
_runs = {}  # path -> ({offset: records, a table or a record batch}, the run's bytes as segments)
_room = {}  # folder of runs -> bytes of its budget still free


def room(folder: str, budget: int) -> int:
    """What is left of ``folder``'s ``budget``."""
    with _lock:
        return _room.get(folder, budget)


def keep(folder: str, budget: int, path: str, segments: dict, size: int) -> bool:
    """Keep ``segments`` (offset -> records: a table or a record batch), a run of ``size`` bytes as
    segments, as the run at ``path`` (under ``folder``) if it fits in what is left of ``folder``'s
    ``budget``; whether it was kept (if not, write it to disk)."""
    with _lock:
        left = _room.get(folder, budget)
        if size > left:
            return False
        _room[folder] = left - size
        _runs[path] = (segments, size)
        return True


def holds(path: str) -> bool:
    """Whether a run is kept at ``path``."""
    return path in _runs


def records(path: str, offset: int):
    """The records (a table or a record batch) of the segment at ``offset`` of the run kept at
    ``path``, or None if no run is kept there."""
    kept = _runs.get(path)
    return None if kept is None else kept[0][offset]


def segment(path: str, offset: int):
    """The bytes of the segment at ``offset`` of the run kept at ``path`` (one Arrow IPC stream
    of one record batch, as on disk), or None if no run is kept there."""
    kept = records(path, offset)
    if kept is None:
        return None
    table = pa.Table.from_batches([kept]) if isinstance(kept, pa.RecordBatch) else kept
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table.combine_chunks(), max_chunksize=max(1, table.num_rows))
    return sink.getvalue()


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
        return sum(size for _, size in _runs.values())
