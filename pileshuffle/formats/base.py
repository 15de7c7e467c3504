"""The one small interface every record format implements, and the file helpers they share.

Records travel as ``pyarrow.Table`` chunks. Bytes formats use a single binary column:
``record`` (the payload a user sees) or a format's own pre-encoded column (a whole
TFRecord frame, a line with its newline) that its writer can copy verbatim. Parquet
uses the dataset's own columns. All file access goes through ``pileshuffle.io.storage``.
"""

import contextlib
import dataclasses

import numpy as np
import pyarrow as pa

from pileshuffle.errors import InputError
from pileshuffle.io import storage, whole_reads
from pileshuffle.names import RECORD_COLUMN
from pileshuffle.records.keys import group_by_pile

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "ReadReport",
    "RecordFormat",
    "Payloads",
    "binary_table",
    "records_table",
    "open_input",
    "open_at",
    "open_for_arrow",
    "read_block",
    "read_up_to",
    "parts_by_pile",
]

# input bytes per chunk a reader yields: one chunk's table is what pass 1 holds per file
DEFAULT_CHUNK_BYTES = 16 << 20


@dataclasses.dataclass
class ReadReport:
    """What a reader skipped under ``skip_corrupt`` (it skips nothing otherwise), and the blank
    lines of a JSONL file, which are no records."""

    skipped_records: int = 0
    skipped_bytes: int = 0
    blank_lines: int = 0
    problems: list = dataclasses.field(default_factory=list)
    # a span's reader that finds its first record by a search: (its first record, where the next
    # span's must be)
    reached: tuple = None

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
        pa.binary(),
        len(offsets) - 1,
        [None, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(data)],
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


@contextlib.contextmanager
def open_at(path: str, offset: int = 0):
    """An uncompressed file open for reading from byte ``offset``, and seekable (Parquet's reader
    seeks): ``storage.open_seekable``. Errors name the path."""
    with _opened(storage.open_seekable, path, offset) as handle:
        yield handle


@contextlib.contextmanager
def open_for_arrow(path: str):
    """A seekable file for a reader inside Arrow (Parquet's): a local file is Arrow's own, read
    straight into Arrow's buffers; through a Python file each read is a call into Python and a
    ``bytes`` copied once more (4.5% of a 10 GB Parquet run's user CPU). Elsewhere
    ``storage.open_seekable``'s file. Errors name the path."""
    open_file = storage.open_seekable if storage.is_remote(path) else storage.open_random_access
    with _opened(open_file, path, 0) as handle:
        yield handle


@contextlib.contextmanager
def _opened(open_file, path: str, offset: int):
    """``open_file(path)`` from byte ``offset``, closed after; errors name the path."""
    try:
        handle = open_file(path)
    except Exception as error:
        raise InputError(path, f"cannot be opened: {error}") from error
    try:
        _seek(handle, path, offset)
        yield handle
    finally:
        handle.close()


def _seek(handle, path: str, offset: int):
    try:
        handle.seek(offset)
    except Exception as error:
        raise InputError(path, f"cannot be read from byte {offset:,}: {error}") from error


def read_block(handle, path: str, size: int, compressed: bool) -> bytes:
    """``handle.read(size)``, turning a decompression failure into an InputError."""
    try:
        block = handle.read(size)
    except Exception as error:
        if compressed:
            raise InputError(path, f"is not a valid compressed stream ({error})") from error
        raise InputError(path, f"cannot be read: {error}") from error
    if not block and compressed and _stream_cut_short(handle):
        raise InputError(
            path, "is truncated: the compressed stream ends before its end-of-stream marker"
        )
    return block


def read_up_to(handle, path: str, size: int, compressed: bool = False) -> bytes:
    """``size`` bytes of ``handle`` (``read_block`` until it has them): fewer only at the end."""
    data = read_block(handle, path, size, compressed)
    while 0 < len(data) < size:
        more = read_block(handle, path, size - len(data), compressed)
        if not more:
            break
        data += more
    return data


def _stream_cut_short(handle) -> bool:
    """Whether Beam's decompressing reader hit the end of a non-empty file in the middle
    of a compressed stream (it returns what it has without saying so)."""
    decompressor = getattr(handle, "_decompressor", None)
    raw = getattr(handle, "_file", None)
    try:
        return (
            decompressor is not None and not getattr(decompressor, "eof", True) and raw.tell() > 0
        )
    except Exception:
        return False


def parts_by_pile(table: pa.Table, piles: np.ndarray, num_piles: int):
    """Yield ``(pile, part, rows)`` for every non-empty pile: ``part`` holds the pile's rows
    of ``table`` in their original order (one ``take``, then zero-copy slices) and ``rows``
    their positions in ``table``. Any format's tables split alike."""
    order, bounds = group_by_pile(piles, num_piles)
    taken = table.take(order)
    for pile in np.flatnonzero(np.diff(bounds)).tolist():
        start, stop = int(bounds[pile]), int(bounds[pile + 1])
        yield pile, taken.slice(start, stop - start), order[start:stop]


class RecordFormat:
    """The one interface a record format implements; a format is one module that subclasses
    it, registered in ``formats/__init__.py`` (``FORMATS``, ``FORMAT_OF_EXTENSION``).

    Records travel as ``pyarrow.Table`` chunks: a bytes format in one binary column,
    ``record_column`` (its records as read, e.g. whole TFRecord frames, so a shard is written
    by copying them), a row format in the dataset's own columns (``record_column`` None).
    Every step of a record's life asks the format:

    ==========================  ==========================================================
    pass 1: read a source        ``read_placed`` (file order, with each record's position; a
                                 span of a large file; corrupt input named or skipped)
    pass 1: split by pile        ``split_by_pile`` (any format: rows taken, order kept)
    fragments and piles          Arrow IPC of the chunk's table with the key and hash columns
                                 (``fragments.py``, any format)
    pass 2: write a shard        ``write_shard`` (records in the order given, bytes copied)
    fingerprints, verify         ``record_hashes`` and ``record_lengths`` (of the payload, equal
                                 however the record is held)
    the loader's batches         ``payload_views`` (bytes formats) or ``read_rows`` (row formats)
    the quality report           ``record_hashes``: a record's identity in input and output
    ==========================  ==========================================================
    """

    name = ""
    extension = ""
    compressions = ("auto", "none", "gzip")  # what --compression may be for this format
    record_column = None  # the binary column a bytes format's records travel in; None: a row format
    # whether payload_views proves every byte of a shard by the format's own CRCs
    checks_every_byte = False
    # whether its reader seeks (Parquet's footer, then column chunks): a remote file it re-reads
    # is better downloaded once (``io.whole_reads``) than read a request per seek
    reads_at_random = False

    def suffix(self, compression: str) -> str:
        """The shard file suffix: the format's extension, plus .gz when gzip-compressed."""
        return self.extension + (".gz" if compression == "gzip" else "")

    def output_compression(self, compression: str, input_paths) -> str:
        """Resolve ``--compression`` (auto|none|gzip) for this format's output."""
        if compression == "auto":
            gz = input_paths and all(storage.compression_of(p) == storage.GZIP for p in input_paths)
            return "gzip" if gz else "none"
        return compression

    def can_split(self, path: str, skip_corrupt: bool = False) -> bool:
        """Whether ``read_placed`` can read a ``span`` of the file ``path`` on its own."""
        return False

    def read_chunks(self, path, chunk_bytes=DEFAULT_CHUNK_BYTES, skip_corrupt=False, report=None):
        """Yield the records of ``path`` in file order as tables of about ``chunk_bytes``."""
        for table, _ in self.read_placed(path, chunk_bytes, skip_corrupt, report):
            yield table

    def read_placed(
        self, path, chunk_bytes=DEFAULT_CHUNK_BYTES, skip_corrupt=False, report=None, span=None
    ):
        """``read_chunks`` with each record's place in the file: ``(table, positions)``, an int64
        position per record where it starts (a byte offset in the uncompressed stream; a Parquet
        row's number), the ``keys.position_keys`` of pass 1. With ``span`` = ``(start, stop)``
        (where ``can_split``), only the records a reader of those bytes owns: spans that
        cover a file give each record once, at the same position, whatever their bounds."""
        raise NotImplementedError

    def mean_record_bytes(self, path, sample_bytes):
        """Mean bytes per record as Arrow holds them, from the first ``sample_bytes`` of
        ``path`` (None if those hold no record)."""
        for table in self.read_chunks(path, sample_bytes, skip_corrupt=True, report=ReadReport()):
            return table.nbytes / table.num_rows if table.num_rows else None
        return None

    def read_once(self, path: str, size: int):
        """A block whose reads of ``path`` (``size`` bytes as listed, or None) come from one
        download of it where this format's reader seeks (``reads_at_random``) and the file may be
        held (``io.whole_reads``); else the file is read where it is."""
        if not self.reads_at_random:
            return contextlib.nullcontext()
        return whole_reads.read_once(path, size)

    def check_source(self, path):
        """Cheap up-front check of one input file; returns its schema or None."""
        return None

    def write_shard(self, handle, tables, compression: str, schema=None) -> int:
        """Write ``tables`` in order as one shard to the open ``handle``; returns records
        written."""
        raise NotImplementedError

    def shard_handle_compression(self, compression: str) -> str:
        """The compression the shard file handle is opened with."""
        return storage.GZIP if compression == "gzip" else storage.UNCOMPRESSED

    def split_by_pile(self, table: pa.Table, piles: np.ndarray, num_piles: int):
        """Yield ``(pile, part, rows)`` for every non-empty pile (``parts_by_pile``)."""
        return parts_by_pile(table, piles, num_piles)

    def record_lengths(self, table: pa.Table) -> np.ndarray:
        """Payload bytes of every record (vectorized); a row format counts a row's values."""
        from pileshuffle.records.fingerprint import row_lengths

        return row_lengths(table)

    def records_bytes(self, table: pa.Table) -> int:
        """``record_lengths(table).sum()``, without a value per record."""
        from pileshuffle.records.fingerprint import rows_bytes

        return rows_bytes(table)

    def record_hashes(self, table: pa.Table) -> np.ndarray:
        """A 64-bit hash of every record's payload: the same payload hashes alike however it is
        held (frame, line, bare payload); a row format hashes a row's values."""
        from pileshuffle.records.fingerprint import row_hashes

        return row_hashes(table)

    def payload_views(self, buffer: pa.Buffer, path: str, buffer_index: int) -> np.ndarray:
        """The loader's views (``formats.views``) of the payloads in a whole shard's bytes, or
        in a store file's ``record_column``; checks what the format can check, naming ``path``."""
        raise NotImplementedError(
            f"{self.name} is a row format: the loader reads it with read_rows"
        )

    def records_of(self, payloads: list) -> list:
        """What the loader hands out for these payloads (``bytes``): the payloads themselves,
        or a format's own form of a record (a WebDataset sample's dict)."""
        return payloads

    def read_rows(self, handle, columns=None) -> pa.Table:
        """A row format's whole shard from an open file (``columns``: those only)."""
        raise NotImplementedError(
            f"{self.name} is a bytes format: the loader reads it with payload_views"
        )


class Payloads(RecordFormat):
    """Bare payloads in ``record`` (a composed run's ``bytes`` records, or a store's): the
    bytes formats' common ground, never a file format of its own."""

    name = "payloads"
    record_column = RECORD_COLUMN
    # bytes around the payload in ``record_column``: a frame's header and footer, a newline
    before, after = 0, 0

    @property
    def framing(self) -> int:
        return self.before + self.after

    def record_lengths(self, table):
        from pileshuffle.records.fingerprint import binary_lengths

        return binary_lengths(table.column(0)) - self.framing

    def records_bytes(self, table):
        from pileshuffle.records.fingerprint import binary_bytes

        return binary_bytes(table.column(0)) - self.framing * table.num_rows

    def record_hashes(self, table):
        from pileshuffle.records.fingerprint import binary_column_parts, payload_hashes
        from pileshuffle.records.slice_crcs import crc32c_of_slices

        data, offsets = binary_column_parts(table.column(0))
        return payload_hashes(
            crc32c_of_slices(data, offsets, self.framing), self.record_lengths(table)
        )

    def payload_views(self, buffer, path, buffer_index):
        raise NotImplementedError(
            "bare payloads come as an Arrow column: formats.views.value_views"
        )
