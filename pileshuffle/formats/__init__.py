"""Record formats: one module per format behind the interface in ``base``."""

from pileshuffle.formats.base import RECORD_COLUMN, RecordFormat, ReadReport
from pileshuffle.formats.parquet import ParquetFormat
from pileshuffle.formats.text import JsonlFormat
from pileshuffle.formats.tfrecord import TFRecordFormat

FORMATS = {f.name: f for f in (TFRecordFormat(), ParquetFormat(), JsonlFormat())}


def get_format(name: str) -> RecordFormat:
    try:
        return FORMATS[name]
    except KeyError:
        raise ValueError(f"unknown format {name!r}; choose one of {', '.join(FORMATS)}") from None


__all__ = ["FORMATS", "RECORD_COLUMN", "ReadReport", "RecordFormat", "get_format"]


def record_hashes(table):
    """``(hashes, lengths)`` of every record of a records table, over payloads: the same
    records hash alike whether held as TFRecord frames, lines or plain payloads."""
    import numpy as np

    from pileshuffle.fingerprint import binary_column_parts, crc32c_of_slices, payload_hashes, row_hashes, row_lengths
    from pileshuffle.formats.text import LINE_COLUMN
    from pileshuffle.formats.tfrecord import FRAME_COLUMN, frame_payload_stats

    names = table.column_names
    if names == [FRAME_COLUMN]:
        crcs, lengths = frame_payload_stats(table.column(FRAME_COLUMN))
    elif names in ([LINE_COLUMN], [RECORD_COLUMN]):
        trim = 1 if names == [LINE_COLUMN] else 0
        data, offsets = binary_column_parts(table.column(names[0]))
        crcs, lengths = crc32c_of_slices(data, offsets, trim), np.diff(offsets) - trim
    else:
        return row_hashes(table), row_lengths(table)
    return payload_hashes(crcs, lengths), lengths


def fingerprint_of(table):
    from pileshuffle.fingerprint import Fingerprint

    hashes, lengths = record_hashes(table)
    return Fingerprint.of(hashes, int(lengths.sum()))
