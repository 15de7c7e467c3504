"""How a Parquet shard's rows are encoded (format_version 1.6): which columns get a dictionary, and
the chunks Arrow's writer is handed so that the same rows give the same file however they were cut.

Dictionary: a column is dictionary-encoded when its values in the shard's first ``SAMPLE_ROWS``
rows repeat as much as those of a column with at most half as many distinct values as a row group
has rows would (``expected_distinct``): labels and categories do, ids, floats, names and payloads
do not. The shard's rows are a uniform sample of the input, so its first rows are one too. Arrow's
own rule (try every column, fall back to plain once a chunk's dictionary passes 1 MiB) hashed
every value of every column and kept a dictionary of every distinct value of a narrow column:
0.21-0.24 s of user CPU per GB of the 1 GB Parquet set, and 0.5% larger files (issue 56).

Chunks: Arrow ends a data page only between batches of ``WRITE_BATCH_ROWS`` rows counted from the
start of each chunk it is given, so pages moved wherever pass 2 cut a pile (a pile split into
sub-piles gave other bytes than the pile whole). A row group is handed over with every column's
chunks ending at multiples of ``WRITE_BATCH_ROWS`` rows (copying at most one batch at a cut), and a
dictionary or nested column as one chunk (Arrow's dictionary indices and nested levels are cut by
other counts).
"""

import math

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = [
    "SAMPLE_ROWS",
    "WRITE_BATCH_ROWS",
    "dictionary_columns",
    "expected_distinct",
    "canonical_chunks",
]

SAMPLE_ROWS = 1024  # a shard's first rows choose its dictionary columns
WRITE_BATCH_ROWS = 1024  # Arrow's default write_batch_size, pinned: pages end between its batches
_SAMPLE_VALUE_BYTES = 64 << 10  # a wide column is sampled on fewer rows: this many bytes of values,
_LEAST_SAMPLE_ROWS = 64  # but at least this many rows (counting 1 KB payloads cost 1.4 ms a shard)


def expected_distinct(draws: int, values: float) -> float:
    """The expected number of distinct values among ``draws`` drawn from ``values`` equally likely
    ones."""
    if values <= 1:
        return 1.0
    return values * -math.expm1(draws * math.log1p(-1 / values))


def dictionary_columns(sample: pa.Table, group_rows: int) -> list:
    """The names of the columns of ``sample`` (a shard's first rows) to dictionary-encode in row
    groups of ``group_rows`` rows: those whose sampled values have no more distinct ones than
    ``group_rows / 2`` equally likely values would give (where every row of a group was counted:
    at most ``group_rows / 2``). Nested columns are written plain."""
    chosen = []
    for field, column in zip(sample.schema, sample.columns):
        if pa.types.is_nested(field.type) or not len(column):
            continue
        rows = min(
            len(column),
            max(_LEAST_SAMPLE_ROWS, len(column) * _SAMPLE_VALUE_BYTES // max(1, column.nbytes)),
        )
        try:
            distinct = pc.count_distinct(column.slice(0, rows), mode="all").as_py()
        except pa.ArrowNotImplementedError:  # a type Arrow cannot count: plain
            continue
        half = max(1.0, group_rows / 2)
        # all rows seen: exact
        if distinct <= (half if rows >= group_rows else expected_distinct(rows, half)):
            chosen.append(field.name)
    return chosen


def canonical_chunks(table: pa.Table, whole_columns) -> pa.Table:
    """``table`` as one row group is handed to Arrow's writer: the columns named in
    ``whole_columns`` and nested ones in one chunk, every other one in chunks that end at
    multiples of ``WRITE_BATCH_ROWS`` rows. The same rows so give the same bytes, however cut."""
    columns = []
    for field, column in zip(table.schema, table.columns):
        if column.num_chunks > 1 and (
            field.name in whole_columns or pa.types.is_nested(field.type)
        ):
            column = pa.chunked_array([column.combine_chunks()], type=field.type)
        columns.append(_batch_aligned(column))
    return pa.Table.from_arrays(columns, schema=table.schema)


def _batch_aligned(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """``column`` with its chunks ending only at multiples of ``WRITE_BATCH_ROWS`` rows (or its
    end): the batch around each other cut is copied into a chunk of its own; the rest is not
    copied."""
    ends = np.cumsum([len(chunk) for chunk in column.chunks])[:-1]
    batches = sorted({int(end) // WRITE_BATCH_ROWS for end in ends if end % WRITE_BATCH_ROWS})
    if not batches:
        return column
    pieces, done = [], 0
    for batch in batches:
        start, stop = batch * WRITE_BATCH_ROWS, min((batch + 1) * WRITE_BATCH_ROWS, len(column))
        pieces += column.slice(done, start - done).chunks
        pieces.append(column.slice(start, stop - start).combine_chunks())
        done = stop
    pieces += column.slice(done).chunks
    return pa.chunked_array([piece for piece in pieces if len(piece)], type=column.type)
