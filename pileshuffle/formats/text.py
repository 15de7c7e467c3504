"""JSONL and other newline-delimited text: one record per line, bytes kept as they are.

Reading keeps each line with its newline (column ``line``) so that a shard is written
by copying bytes; a last line without a newline is a record and gets one. Lines are
found with numpy, never parsed: a file that is not valid text is shuffled as bytes.
"""

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pileshuffle.fingerprint import binary_column_parts
from pileshuffle.formats.base import (
    DEFAULT_CHUNK_BYTES,
    RECORD_COLUMN,
    RecordFormat,
    binary_table,
    compression_of,
    open_input,
    read_block,
)

LINE_COLUMN = "line"
NEWLINE = 10


def line_bounds(buf: bytes) -> np.ndarray:
    """Offsets of the complete lines in ``buf``: 0, then one past each newline."""
    newlines = np.flatnonzero(np.frombuffer(buf, dtype=np.uint8) == NEWLINE)
    return np.concatenate(([0], newlines + 1))


class JsonlFormat(RecordFormat):
    name = "jsonl"

    extension = ".jsonl"

    def read_chunks(self, path, chunk_bytes=DEFAULT_CHUNK_BYTES, skip_corrupt=False, report=None):
        compressed = compression_of(path) != "uncompressed"
        buf = b""
        with open_input(path) as handle:
            while True:
                block = read_block(handle, path, chunk_bytes, compressed)
                if not block:
                    break
                buf = buf + block if buf else block
                bounds = line_bounds(buf)
                if len(bounds) > 1:
                    yield binary_table(LINE_COLUMN, buf, bounds)
                buf = buf[int(bounds[-1]) :]
        if buf:
            yield binary_table(LINE_COLUMN, buf + b"\n", [0, len(buf) + 1])

    def write_shard(self, handle, tables, compression, schema=None):
        written = 0
        for table in tables:
            if LINE_COLUMN in table.column_names:
                column = table.column(LINE_COLUMN)
            else:
                empty, newline = pa.scalar(b"", pa.binary()), pa.scalar(b"\n", pa.binary())
                column = pc.binary_join_element_wise(table.column(RECORD_COLUMN), empty, newline)
            data, _ = binary_column_parts(column)
            handle.write(memoryview(data))
            written += table.num_rows
        return written
