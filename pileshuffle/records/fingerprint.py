"""Order-independent fingerprints of a multiset of records.

A record's hash is a 64-bit mix of its CRC32C and length (bytes records) or of its
column values (table rows). A fingerprint is (records, bytes, sum mod 2**64, xor) of
those hashes: equal multisets give equal fingerprints whatever the order, and a lost,
duplicated or altered record changes it.
"""

import dataclasses

import google_crc32c
import numpy as np
import pyarrow as pa

from pileshuffle.records.slice_crcs import crc32c_of_slices

__all__ = [
    "how_records_differ",
    "mix64",
    "payload_hashes",
    "binary_column_parts",
    "Fingerprint",
    "total",
    "column_hashes",
    "is_binary_type",
    "binary_lengths",
    "binary_bytes",
    "row_lengths",
    "rows_bytes",
    "row_hashes",
]

_MASK64 = 0xFFFFFFFFFFFFFFFF


def mix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finalizer on a uint64 array: a bijective avalanche mix."""
    x = np.asarray(x, dtype=np.uint64).copy()
    with np.errstate(over="ignore"):
        x ^= x >> np.uint64(30)
        x *= np.uint64(0xBF58476D1CE4E5B9)
        x ^= x >> np.uint64(27)
        x *= np.uint64(0x94D049BB133111EB)
        x ^= x >> np.uint64(31)
    return x


def payload_hashes(crcs: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Record hashes from each payload's CRC32C and length."""
    crcs = np.asarray(crcs, dtype=np.uint64)
    lengths = np.asarray(lengths, dtype=np.uint64)
    return mix64(crcs | (lengths << np.uint64(32)))


def is_binary_type(kind) -> bool:
    """Whether an Arrow type holds variable-length bytes or text (values between offsets)."""
    return (
        pa.types.is_binary(kind)
        or pa.types.is_string(kind)
        or pa.types.is_large_binary(kind)
        or pa.types.is_large_string(kind)
    )


def _offsets(chunk) -> np.ndarray:
    """The ``len(chunk) + 1`` offsets of a binary/string array's values, in their own width (no
    copy)."""
    width = (
        np.int32 if pa.types.is_binary(chunk.type) or pa.types.is_string(chunk.type) else np.int64
    )
    return np.frombuffer(chunk.buffers()[1], dtype=width)[
        chunk.offset : chunk.offset + len(chunk) + 1
    ]


def binary_column_parts(column):
    """(data as a ``pyarrow.Buffer``, int64 offsets rebased to 0) of a binary Arrow array
    or chunked array; the buffer holds exactly the values' bytes, in order, uncopied
    (a chunked array of several chunks is combined first, which copies)."""
    array = _as_array(column)
    if len(array) == 0:
        return pa.py_buffer(b""), np.zeros(1, dtype=np.int64)
    data_buffer = array.buffers()[2]
    offsets = _offsets(array).astype(np.int64)
    start, end = int(offsets[0]), int(offsets[-1])
    data = data_buffer.slice(start, end - start) if data_buffer is not None else pa.py_buffer(b"")
    return data, offsets - start


def _as_array(column):
    """The values of an Arrow array or chunked array as one array: a single chunk uncopied
    (``combine_chunks`` copies even that: 49 ms per 125 MB column), several combined."""
    if not isinstance(column, pa.ChunkedArray):
        return column
    return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()


@dataclasses.dataclass(frozen=True)
class Fingerprint:
    """Order-independent fingerprint of a multiset of records: count, payload bytes, and
    the sum (mod 2**64) and xor of their 64-bit hashes. ``a + b`` is the fingerprint of
    both multisets together, so equal multisets give equal fingerprints in any order or
    grouping; ``to_json``/``from_json`` are the manifests' form (hashes as 16 hex digits)."""

    records: int = 0
    bytes: int = 0
    hash_sum: int = 0
    hash_xor: int = 0

    @classmethod
    def of(cls, hashes: np.ndarray, payload_bytes: int) -> "Fingerprint":
        hashes = np.asarray(hashes, dtype=np.uint64)
        with np.errstate(over="ignore"):
            total = int(hashes.sum(dtype=np.uint64)) if len(hashes) else 0
        xor = int(np.bitwise_xor.reduce(hashes)) if len(hashes) else 0
        return cls(len(hashes), int(payload_bytes), total, xor)

    def __add__(self, other: "Fingerprint") -> "Fingerprint":
        return Fingerprint(
            self.records + other.records,
            self.bytes + other.bytes,
            (self.hash_sum + other.hash_sum) & _MASK64,
            self.hash_xor ^ other.hash_xor,
        )

    def to_json(self) -> dict:
        return {
            "records": self.records,
            "bytes": self.bytes,
            "hash_sum": f"{self.hash_sum:016x}",
            "hash_xor": f"{self.hash_xor:016x}",
        }

    def describe(self) -> str:
        """One line for a person: ``600 records, 60,000 bytes, hashes sum 0f.. xor 3a..`` (hex as
        the manifests write them)."""
        return (
            f"{self.records:,} records, {self.bytes:,} bytes, hashes sum {self.hash_sum:016x} "
            f"xor {self.hash_xor:016x}"
        )

    @classmethod
    def from_json(cls, value: dict) -> "Fingerprint":
        return cls(
            value["records"], value["bytes"], int(value["hash_sum"], 16), int(value["hash_xor"], 16)
        )


def total(fingerprints) -> Fingerprint:
    """The sum of ``fingerprints`` (the empty ``Fingerprint()`` for none)."""
    result = Fingerprint()
    for fingerprint in fingerprints:
        result = result + fingerprint
    return result


_NULL_HASH = np.uint64(0x9E3779B97F4A7C15)


def column_hashes(column) -> np.ndarray:
    """A 64-bit hash of every value of an Arrow column (nulls hash to a constant)."""
    array = _as_array(column)
    kind = array.type
    if is_binary_type(kind):
        # a null's bytes, if any, are hashed, then replaced
        data, offsets = binary_column_parts(array)
        hashes = payload_hashes(crc32c_of_slices(data, offsets), np.diff(offsets))
    elif pa.types.is_boolean(kind):
        hashes = mix64(
            array.fill_null(False).to_numpy(zero_copy_only=False).astype(np.uint64) + np.uint64(1)
        )
    elif _is_plain_fixed_width(kind):
        width = kind.bit_width // 8
        raw = np.frombuffer(array.buffers()[1], dtype=f"<u{width}")[
            array.offset : array.offset + len(array)
        ]
        hashes = mix64(raw.astype(np.uint64) ^ np.uint64(width))
    else:  # nested, decimal, dictionary, ...: exact but slow
        values = array.to_pylist()
        hashes = payload_hashes(
            np.fromiter(
                (google_crc32c.value(repr(v).encode()) for v in values), np.uint64, len(values)
            ),
            np.zeros(len(values), np.uint64),
        )
    if array.null_count:
        hashes = np.where(array.is_null().to_numpy(zero_copy_only=False), _NULL_HASH, hashes)
    return hashes


def _is_plain_fixed_width(kind) -> bool:
    try:
        width = kind.bit_width
    except ValueError:
        return False
    return width in (8, 16, 32, 64) and not pa.types.is_dictionary(kind)


def binary_lengths(column) -> np.ndarray:
    """Byte length of every value of a binary/string column, from its offsets only."""
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    parts = [np.zeros(0, np.int64)]
    for chunk in chunks:
        if len(chunk):
            parts.append(np.diff(_offsets(chunk).astype(np.int64)))
    return np.concatenate(parts)


def binary_bytes(column) -> int:
    """``binary_lengths(column).sum()`` from each chunk's first and last offsets (no value per
    row)."""
    total = 0
    for chunk in column.chunks if isinstance(column, pa.ChunkedArray) else [column]:
        if len(chunk):
            offsets = _offsets(chunk)
            total += int(offsets[-1]) - int(offsets[0])
    return total


def row_lengths(table: pa.Table) -> np.ndarray:
    """Bytes of each row's values as stored, independent of chunking: value bytes of
    binary columns plus the widths of fixed-width columns (others count 0)."""
    lengths = np.zeros(table.num_rows, dtype=np.int64)
    for column in table.columns:
        if is_binary_type(column.type):
            lengths += binary_lengths(column)
        elif _is_plain_fixed_width(column.type):
            lengths += column.type.bit_width // 8
    return lengths


def rows_bytes(table: pa.Table) -> int:
    """``row_lengths(table).sum()`` without a value per row: a pile's written bytes in a few
    calls."""
    total = 0
    for column in table.columns:
        if is_binary_type(column.type):
            total += binary_bytes(column)
        elif _is_plain_fixed_width(column.type):
            total += column.type.bit_width // 8 * table.num_rows
    return total


def row_hashes(table: pa.Table) -> np.ndarray:
    """A 64-bit hash of every row: the columns' value hashes (``column_hashes``) mixed in column
    order."""
    hashes = np.zeros(table.num_rows, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for position, column in enumerate(table.columns):
            hashes = mix64(
                hashes * np.uint64(0x100000001B3) + column_hashes(column) + np.uint64(position)
            )
    return hashes


def how_records_differ(found: Fingerprint, expected: Fingerprint) -> str:
    """How two different multisets of records differ, in words: their counts and bytes, or,
    when those agree, their hashes (then the records' contents differ)."""
    if (found.records, found.bytes) != (expected.records, expected.bytes):
        return (
            f"{found.records:,} records, {found.bytes:,} bytes, not {expected.records:,} records, "
            f"{expected.bytes:,} bytes"
        )
    return (
        f"the same count and bytes but different records ({found.records:,} records, "
        f"{found.bytes:,} bytes; hash sum {found.hash_sum:016x} xor {found.hash_xor:016x}, "
        f"not {expected.hash_sum:016x} xor {expected.hash_xor:016x})"
    )
