"""Steps of loaded records into batches: lists of ``bytes`` payloads (bytes formats) or tables
of rows (``as_numpy`` and Parquet). No batch keeps a loaded step's buffers alive."""

import numpy as np
import pyarrow as pa

__all__ = [
    "TAKE_ROWS",
    "gathered",
    "cut_at_steps",
    "payloads",
    "object_array",
    "payload_array",
    "list_batches",
    "array_batches",
    "table_batches",
]


# records gathered into a table at a time (Parquet rows are copied: never a whole step)
TAKE_ROWS = 8192


def gathered(blocks):
    """``loader.block.Block``s (views of loaded piles) as tables of at most ``TAKE_ROWS``
    records each, in order."""
    for block in blocks:
        for start in range(0, block.num_rows, TAKE_ROWS):
            yield block.slice(start, min(block.num_rows, start + TAKE_ROWS))
        del block  # the generator of blocks may give a step's pages back before the next


def cut_at_steps(tables, step: int):
    """``tables`` cut so that a cut falls at every multiple of ``step`` records, counted
    from the first: a batch of ``step`` is one piece unless it straddles two tables."""
    filled = 0
    for table in tables:
        start = 0
        while start < table.num_rows:
            stop = min(table.num_rows, start + step - filled)
            filled = (filled + stop - start) % step
            yield table.slice(start, stop - start)
            start = stop
        del table  # holds a step's buffers: let the next step's load find it gone


def payloads(table) -> list:
    """A bytes table's payloads as ``bytes``: copied into one buffer first (Arrow's gather)
    and read from there, which takes 0.75x the time of turning the views into ``bytes``
    one by one from random places in a pile (0.95x in written order)."""
    return table.column(0).cast(pa.large_binary()).to_pylist()


def object_array(records: list) -> np.ndarray:
    """``records`` (``bytes``, a WebDataset sample's dicts) as a 1-d numpy object array."""
    array = np.empty(len(records), dtype=object)
    array[:] = records
    return array


def payload_array(table) -> pa.LargeBinaryArray:
    """A bytes table's payloads gathered into one ``large_binary`` array (one values buffer
    and int64 offsets; Arrow's cast copies them out of the loaded piles)."""
    gathered = table.column(0).cast(pa.large_binary())
    return gathered.chunk(0) if gathered.num_chunks == 1 else gathered.combine_chunks()


def list_batches(tables, batch_size):
    """Lists of ``batch_size`` payloads (the last may be shorter). Payloads become
    ``bytes`` piece by piece, so no batch keeps a loaded step's buffers alive."""
    pending = []
    for table in tables:
        records = payloads(table)
        del table  # holds a step's buffers: let the next step's load find it gone
        if not pending and len(records) == batch_size:
            yield records
            continue
        pending += records
        while len(pending) >= batch_size:
            yield pending[:batch_size]
            pending = pending[batch_size:]
    if pending:
        yield pending


def array_batches(tables, batch_size):
    """``list_batches`` as ``large_binary`` arrays (``payload_array``): the same records,
    batches and order, none keeping a loaded step's buffers alive."""
    pending, count = [], 0
    for table in tables:
        pending.append(payload_array(table))
        count += len(pending[-1])
        del table
        while count >= batch_size:
            whole = pending[0] if len(pending) == 1 else pa.concat_arrays(pending)
            yield whole.slice(0, batch_size)
            pending, count = (
                ([whole.slice(batch_size)] if count > batch_size else []),
                count - batch_size,
            )
    if count:
        yield pending[0] if len(pending) == 1 else pa.concat_arrays(pending)


def table_batches(tables, batch_size):
    """Tables of ``batch_size`` rows (the last may be shorter). A leftover is copied, so
    it never keeps a loaded step alive into the next."""
    pending, count = [], 0
    for table in tables:
        pending.append(table)
        count += table.num_rows
        del table
        if count < batch_size:
            continue
        whole = pending[0] if len(pending) == 1 else pa.concat_tables(pending)
        done = count // batch_size * batch_size
        for start in range(0, done, batch_size):
            yield whole.slice(start, batch_size)
        rest = whole.slice(done)
        pending, count = (
            ([rest.take(np.arange(rest.num_rows))] if rest.num_rows else []),
            rest.num_rows,
        )
    if count:
        yield pending[0] if len(pending) == 1 else pa.concat_tables(pending)
