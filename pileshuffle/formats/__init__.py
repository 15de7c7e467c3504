"""Record formats: one module per format behind the interface in ``base``."""

from pileshuffle.formats.base import RECORD_COLUMN, ReadReport, RecordFormat
from pileshuffle.formats.parquet import ParquetFormat
from pileshuffle.formats.text import JsonlFormat
from pileshuffle.formats.tfrecord import TFRecordFormat
from pileshuffle.names import SHARD_NUMBERS
from pileshuffle.storage import compression_of

FORMATS = {f.name: f for f in (TFRecordFormat(), ParquetFormat(), JsonlFormat())}


def get_format(name: str) -> RecordFormat:
    try:
        return FORMATS[name]
    except KeyError:
        raise ValueError(f"unknown format {name!r}; choose one of {', '.join(FORMATS)}") from None


# The one table from a file name's extension to its format (`.tar` goes here when it comes).
# A compression suffix Beam detects (.gz, .bz2, .zst, ...) follows it in byte formats; a
# TFDS-style shard tail (`-00000-of-00010`) may follow the extension.
FORMAT_OF_EXTENSION = {
    ".tfrecord": "tfrecord",
    ".tfrecords": "tfrecord",
    ".parquet": "parquet",  # also Spark's part-00000-....snappy.parquet: the codec is inside the file
    ".jsonl": "jsonl",
}


def format_of_name(path: str):
    """The format a file's name says (``FORMAT_OF_EXTENSION``), or None. Parquet files
    compress inside the file, so a compression suffix after ``.parquet`` names none."""
    name = path.replace("\\", "/").rsplit("/", 1)[-1].lower()
    compressed = compression_of(name) != "uncompressed"
    if compressed:
        name = name.rsplit(".", 1)[0]
    name = SHARD_NUMBERS.sub("", name)
    for extension, fmt in FORMAT_OF_EXTENSION.items():
        if name.endswith(extension) and not (compressed and fmt == "parquet"):
            return fmt
    return None


def known_extensions() -> str:
    return ", ".join(FORMAT_OF_EXTENSION)


__all__ = ["FORMATS", "FORMAT_OF_EXTENSION", "RECORD_COLUMN", "ReadReport", "RecordFormat", "fingerprint_of",
           "format_of_name", "get_format", "known_extensions", "read_fingerprint", "record_hashes", "record_lengths"]


def record_lengths(table):
    """Payload bytes of every record of a records table (vectorized): a TFRecord frame
    counts its data, a line its text without the newline, a row its values."""
    from pileshuffle.fingerprint import binary_lengths, row_lengths
    from pileshuffle.formats.text import LINE_COLUMN
    from pileshuffle.formats.tfrecord import FOOTER_BYTES, FRAME_COLUMN, HEADER_BYTES

    overhead = {FRAME_COLUMN: HEADER_BYTES + FOOTER_BYTES, LINE_COLUMN: 1, RECORD_COLUMN: 0}
    names = table.column_names
    if len(names) == 1 and names[0] in overhead:
        return binary_lengths(table.column(names[0])) - overhead[names[0]]
    return row_lengths(table)


def record_hashes(table):
    """A 64-bit hash of every record's payload: the same records hash alike whether held
    as TFRecord frames (hashed from their stored CRCs, vectorized), lines or payloads
    (one CRC32C call each), or table rows (by column values)."""
    from pileshuffle.fingerprint import binary_column_parts, crc32c_of_slices, payload_hashes, row_hashes
    from pileshuffle.formats.text import LINE_COLUMN
    from pileshuffle.formats.tfrecord import FRAME_COLUMN, frame_payload_stats

    names = table.column_names
    if names == [FRAME_COLUMN]:
        return payload_hashes(*frame_payload_stats(table.column(FRAME_COLUMN)))
    if names in ([LINE_COLUMN], [RECORD_COLUMN]):
        data, offsets = binary_column_parts(table.column(names[0]))
        trim = 1 if names == [LINE_COLUMN] else 0
        return payload_hashes(crc32c_of_slices(data, offsets, trim), record_lengths(table))
    return row_hashes(table)


def fingerprint_of(table):
    """The fingerprint of a records table, computed from its contents."""
    from pileshuffle.fingerprint import Fingerprint

    return Fingerprint.of(record_hashes(table), int(record_lengths(table).sum()))


def read_fingerprint(fmt, path: str, skip_corrupt=False):
    """``(fingerprint, report, schema)`` of one file read whole with the format's reader."""
    from pileshuffle.fingerprint import Fingerprint

    report = ReadReport()
    fingerprint, schema = Fingerprint(), None
    for table in fmt.read_chunks(path, skip_corrupt=skip_corrupt, report=report):
        fingerprint += fingerprint_of(table)
        schema = schema or table.schema
    return fingerprint, report, schema
