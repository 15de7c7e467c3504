"""Record formats: one module per format behind the interface in ``base``.

May import: the package root's bottom modules, io and records.
"""

from pileshuffle.formats.base import RECORD_COLUMN, Payloads, ReadReport, RecordFormat
from pileshuffle.formats.parquet import ParquetFormat
from pileshuffle.formats.tar import TarFormat
from pileshuffle.formats.text import JsonlFormat
from pileshuffle.formats.tfrecord import TFRecordFormat
from pileshuffle.io.storage import compression_of
from pileshuffle.names import SHARD_NUMBERS

FORMATS = {f.name: f for f in (TFRecordFormat(), ParquetFormat(), JsonlFormat(), TarFormat())}


def get_format(name: str) -> RecordFormat:
    """The registered format called ``name``; an unknown name is a ValueError listing the known
    ones."""
    try:
        return FORMATS[name]
    except KeyError:
        raise ValueError(f"unknown format {name!r}; choose one of {', '.join(FORMATS)}") from None


# The one table from a file name's extension to its format.
# A compression suffix Beam detects (.gz, .bz2, .zst, ...) follows it in byte formats; a
# TFDS-style shard tail (`-00000-of-00010`) may follow the extension.
FORMAT_OF_EXTENSION = {
    ".tfrecord": "tfrecord",
    ".tfrecords": "tfrecord",
    # also Spark's part-00000-....snappy.parquet: the codec is inside the file
    ".parquet": "parquet",
    ".jsonl": "jsonl",
    ".tar": "tar",  # WebDataset shards; .tar.gz too
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
    """The extensions a name may end with to say its format, for messages: ``.tfrecord, ...``."""
    return ", ".join(FORMAT_OF_EXTENSION)


__all__ = [
    "FORMATS",
    "FORMAT_OF_EXTENSION",
    "PAYLOADS",
    "RECORD_COLUMN",
    "ReadReport",
    "RecordFormat",
    "fingerprint_of",
    "holder_of",
    "format_of_name",
    "get_format",
    "known_extensions",
    "read_fingerprint",
    "record_hashes",
    "record_lengths",
    "records_bytes",
]


# the holder of bare ``record`` payloads (a composed run's bytes, a store's records)
PAYLOADS = Payloads()


def holder_of(table) -> RecordFormat:
    """The format whose records ``table`` holds, known by its columns: a bytes format's
    ``record_column`` alone, bare payloads (``record``), else rows (Parquet)."""
    names = table.column_names
    if len(names) == 1:
        for fmt in FORMATS.values():
            if fmt.record_column == names[0]:
                return fmt
        if names[0] == RECORD_COLUMN:
            return PAYLOADS
    return FORMATS["parquet"]


def record_lengths(table):
    """Payload bytes of every record of a records table (``RecordFormat.record_lengths``)."""
    return holder_of(table).record_lengths(table)


def records_bytes(table) -> int:
    """Payload bytes of all records of a records table (``RecordFormat.records_bytes``)."""
    return holder_of(table).records_bytes(table)


def record_hashes(table):
    """A 64-bit hash of every record's payload (``RecordFormat.record_hashes``): the same
    records hash alike whether held as frames, lines, payloads, or rows by their values."""
    return holder_of(table).record_hashes(table)


def fingerprint_of(table):
    """The fingerprint of a records table, computed from its contents."""
    from pileshuffle.records.fingerprint import Fingerprint

    return Fingerprint.of(record_hashes(table), records_bytes(table))


def read_fingerprint(fmt, path: str, skip_corrupt=False):
    """``(fingerprint, report, schema)`` of one file read whole with the format's reader."""
    from pileshuffle.records.fingerprint import Fingerprint

    report = ReadReport()
    fingerprint, schema = Fingerprint(), None
    for table in fmt.read_chunks(path, skip_corrupt=skip_corrupt, report=report):
        fingerprint += fingerprint_of(table)
        schema = schema or table.schema
    return fingerprint, report, schema
