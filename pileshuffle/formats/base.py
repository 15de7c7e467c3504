"""The one small interface every record format implements, and the file helpers they share.

Records travel as ``pyarrow.Table`` chunks. Bytes formats use a single binary column:
``record`` (the payload a user sees) or a format's own pre-encoded column (a whole
TFRecord frame, a line with its newline) that its writer can copy verbatim. Parquet
uses the dataset's own columns. All file access goes through ``pileshuffle.storage``.
"""

import contextlib
import dataclasses

import numpy as np
import pyarrow as pa

from pileshuffle import storage
from pileshuffle.errors import InputError
from pileshuffle.names import RECORD_COLUMN

DEFAULT_CHUNK_BYTES = 16 << 20


@dataclasses.dataclass
class ReadReport:
    """What a reader skipped under ``skip_corrupt`` (it skips nothing otherwise)."""

    skipped_records: int = 0
    skipped_bytes: int = 0
    problems: list = dataclasses.field(default_factory=list)

    def skip(self, path, offset, problem, records, nbytes):
        self.skipped_records += records
        self.skipped_bytes += nbytes
        self.problems.append(f"{path} at byte offset {offset}: {problem}")


def binary_table(column_name: str, data: bytes, offsets: np.ndarray) -> pa.Table:
    """A one-column binary table over ``data`` split at ``offsets`` (no copy of ``data``)."""
    offsets = np.asarray(offsets, dtype=np.int64)
    if offsets[-1] >= 2**31:
        raise ValueError("a chunk of bytes records must stay under 2 GiB")
    array = pa.Array.from_buffers(
        pa.binary(), len(offsets) - 1, [None, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(data)]
    )
    return pa.table({column_name: array})


def records_table(records) -> pa.Table:
    """A ``record`` table from a list of ``bytes``."""
    return pa.table({RECORD_COLUMN: pa.array(records, type=pa.binary())})


@contextlib.contextmanager
def open_input(path: str, compression: str = storage.AUTO):
    """Open ``path`` for reading, decompressing as its name says; errors name the path."""
    try:
        handle = storage.open_read(path, compression)
    except Exception as error:  # Beam raises BeamIOError, pyarrow OSError, ...
        raise InputError(path, f"cannot be opened: {error}") from error
    try:
        yield handle
    finally:
        handle.close()


def read_block(handle, path: str, size: int, compressed: bool) -> bytes:
    """``handle.read(size)``, turning a decompression failure into an InputError."""
    try:
        block = handle.read(size)
    except Exception as error:
        if compressed:
            raise InputError(path, f"is not a valid compressed stream ({error})") from error
        raise InputError(path, f"cannot be read: {error}") from error
    if not block and compressed and _stream_cut_short(handle):
        raise InputError(path, "is truncated: the compressed stream ends before its end-of-stream marker")
    return block


def _stream_cut_short(handle) -> bool:
    """Whether Beam's decompressing reader hit the end of a non-empty file in the middle
    of a compressed stream (it returns what it has without saying so)."""
    decompressor = getattr(handle, "_decompressor", None)
    raw = getattr(handle, "_file", None)
    try:
        return decompressor is not None and not getattr(decompressor, "eof", True) and raw.tell() > 0
    except Exception:
        return False


class RecordFormat:
    """A record format: how to read a source in chunks and write one shard."""

    name = ""
    extension = ""
    compressions = ("auto", "none", "gzip")  # what --compression may be for this format

    def suffix(self, compression: str) -> str:
        """The shard file suffix: the format's extension, plus .gz when gzip-compressed."""
        return self.extension + (".gz" if compression == "gzip" else "")

    def output_compression(self, compression: str, input_paths) -> str:
        """Resolve ``--compression`` (auto|none|gzip) for this format's output."""
        if compression == "auto":
            gz = input_paths and all(storage.compression_of(p) == storage.GZIP for p in input_paths)
            return "gzip" if gz else "none"
        return compression

    def read_chunks(self, path, chunk_bytes=DEFAULT_CHUNK_BYTES, skip_corrupt=False, report=None):
        """Yield the records of ``path`` in file order as tables of about ``chunk_bytes``."""
        raise NotImplementedError

    def mean_record_bytes(self, path, sample_bytes):
        """Mean bytes per record as Arrow holds them, from the first ``sample_bytes`` of
        ``path`` (None if those hold no record)."""
        for table in self.read_chunks(path, sample_bytes, skip_corrupt=True, report=ReadReport()):
            return table.nbytes / table.num_rows if table.num_rows else None
        return None

    def check_source(self, path):
        """Cheap up-front check of one input file; returns its schema or None."""
        return None

    def write_shard(self, handle, tables, compression: str, schema=None) -> int:
        """Write ``tables`` in order as one shard to the open ``handle``; returns records written."""
        raise NotImplementedError

    def shard_handle_compression(self, compression: str) -> str:
        """The Beam compression type the shard file handle is opened with."""
        return storage.GZIP if compression == "gzip" else storage.UNCOMPRESSED
