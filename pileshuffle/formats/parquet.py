"""Parquet through Arrow: no per-row Python.

Sources are read in record batches of about ``chunk_bytes``; shards are written with
the first input file's Arrow schema (its key-value metadata included) in row groups
of about 64 MiB (``_ROW_GROUP_BYTES``), encoded as ``parquet_layout`` says. Every input file must
have that same schema.
"""

import itertools

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pileshuffle.errors import InputError
from pileshuffle.formats.base import DEFAULT_CHUNK_BYTES, RecordFormat, open_for_arrow
from pileshuffle.formats.parquet_layout import (
    SAMPLE_ROWS,
    WRITE_BATCH_ROWS,
    canonical_chunks,
    dictionary_columns,
)
from pileshuffle.io.storage import is_remote

__all__ = ["ParquetFormat"]

# reads of a file not read whole: 1 MiB at a time, no pre-buffering (the loader's shards, a
# footer's sample of rows, a large row group in pass 1)
_READ_BYTES = 1 << 20
_STREAMED = {"pre_buffer": False, "buffer_size": _READ_BYTES}
_ROW_GROUP_BYTES = 64 << 20
_CODECS = {"auto": "snappy", "none": "none", "gzip": "gzip", "snappy": "snappy", "zstd": "zstd"}


def _parquet_file(handle, path, **options):
    """The ParquetFile at ``handle``; its pages' CRCs (where the writer stored them) are checked as
    they are read."""
    try:
        return pq.ParquetFile(handle, page_checksum_verification=True, **options)
    except (pa.ArrowInvalid, OSError) as error:
        raise InputError(path, f"is not a Parquet file ({error})") from error


def _mean_row_bytes(metadata) -> float:
    """Uncompressed bytes per row from the footer (1.0 for a file without rows)."""
    rows = metadata.num_rows
    size = sum(metadata.row_group(i).total_byte_size for i in range(metadata.num_row_groups))
    return size / rows if rows else 1.0


# Arrow reads a row group's column chunks whole (pre-buffered or not) unless told a read size: a
# reader would then hold a row group of any size (Spark writes them of 128 MB-1 GB), whatever its
# chunk of rows. Local row groups up to this size are read whole; larger ones in 1 MiB reads.
_WHOLE_ROW_GROUP_BYTES = 64 << 20


def _reads_for(path: str, metadata, groups) -> dict:
    """``ParquetFile`` options for reading row groups ``groups`` of ``path``: Arrow's defaults
    (each column chunk read whole, in coalesced requests) on an object store, where a small read
    is a request, and locally while the largest row group is at most ``_WHOLE_ROW_GROUP_BYTES``
    compressed; else ``_STREAMED`` reads: the reader then holds about its chunk of rows, not the
    row group."""
    largest = max((_compressed_bytes(metadata.row_group(i)) for i in groups), default=0)
    if is_remote(path) or largest <= _WHOLE_ROW_GROUP_BYTES:
        return {}
    return _STREAMED


def _compressed_bytes(group) -> int:
    """A row group's bytes in the file: its column chunks' compressed sizes."""
    return sum(group.column(i).total_compressed_size for i in range(group.num_columns))


def _row_group_start(group) -> int:
    """Where a row group's bytes start: its first column chunk's first page."""
    column = group.column(0)
    dictionary = column.dictionary_page_offset if column.has_dictionary_page else None
    return min(o for o in (dictionary, column.data_page_offset) if o is not None)


def _row_groups_in(metadata, span) -> tuple:
    """``(row groups, the number of each one's first row, their rows)`` of a file, or of those
    whose bytes start in ``span`` = ``(start, stop)``: spans that cover the file own each once."""
    groups, firsts, sizes, row = [], [], [], 0
    for index in range(metadata.num_row_groups):
        group = metadata.row_group(index)
        if span is None or span[0] <= _row_group_start(group) < span[1]:
            groups.append(index)
            firsts.append(row)
            sizes.append(group.num_rows)
        row += group.num_rows
    return groups, np.asarray(firsts, dtype=np.int64), sizes


class ParquetFormat(RecordFormat):
    """Parquet: records are rows of the dataset's own columns, hashed by their values."""

    name = "parquet"
    compressions = tuple(_CODECS)
    reads_at_random = True

    def read_rows(self, handle, columns=None):
        # a file: no pre-buffering, 1 MiB reads, one thread (a load's temporaries were 2.8x the
        # table whole (a 62 MB pile), 2.1x so; row group by row group costs 1.5x the CPU); a shard
        # in memory (mapped, or fetched whole): its column chunks are read as slices of it, no copy
        in_memory = isinstance(handle, pa.BufferReader)
        parquet = pq.ParquetFile(
            handle, pre_buffer=False, buffer_size=0 if in_memory else _READ_BYTES
        )
        return parquet.read(columns=columns, use_threads=False)

    def suffix(self, compression):
        return ".parquet"  # Parquet compresses inside the file

    def output_compression(self, compression, input_paths):
        return _CODECS[compression]

    def shard_handle_compression(self, compression):
        return "uncompressed"  # Parquet compresses its pages itself

    def check_source(self, path):
        # the footer: a seekable file, opened once
        with open_for_arrow(path) as handle:
            if handle.seek(0, 2) == 0:
                raise InputError(path, "is empty, not a Parquet file")
            return _parquet_file(handle, path).schema_arrow

    def mean_record_bytes(self, path, sample_bytes):
        """Its first rows decoded (at most 1,024, about ``sample_bytes`` by the footer): the
        footer's sizes are of encoded pages, which dictionaries and run lengths shrink without limit
        (a 0.6 MB zstd file of 303 MB of rows says 9 bytes a row). Reads only those rows' pages."""
        with open_for_arrow(path) as handle:
            parquet = _parquet_file(handle, path, **_STREAMED)
            if not parquet.metadata.num_rows:
                return None
            rows = int(
                min(1024, max(1, sample_bytes // max(1.0, _mean_row_bytes(parquet.metadata))))
            )
            try:
                batch = next(parquet.iter_batches(batch_size=rows, use_threads=False))
            except (pa.ArrowInvalid, OSError) as error:
                raise InputError(path, f"cannot be read as Parquet ({error})") from error
        return batch.nbytes / batch.num_rows if batch.num_rows else None

    def row_count(self, path) -> int:
        """The rows of the file, from its footer."""
        with open_for_arrow(path) as handle:
            return _parquet_file(handle, path).metadata.num_rows

    def can_split(self, path, skip_corrupt=False):
        return True  # by row groups

    def read_placed(
        self, path, chunk_bytes=DEFAULT_CHUNK_BYTES, skip_corrupt=False, report=None, span=None
    ):
        """Rows with their numbers in the file; a ``span`` reads the row groups that start in it."""
        with open_for_arrow(path) as handle:
            metadata = _parquet_file(handle, path).metadata
            rows = max(1, int(chunk_bytes / max(1.0, _mean_row_bytes(metadata))))
            groups, first_rows, sizes = _row_groups_in(metadata, span)
            reads = _reads_for(path, metadata, groups)
            parquet = _parquet_file(handle, path, metadata=metadata, **reads)
            # rows of the groups read before each
            read_before = np.concatenate(([0], np.cumsum(sizes, dtype=np.int64)))
            done = 0
            try:
                for batch in parquet.iter_batches(
                    batch_size=rows, row_groups=groups, use_threads=False
                ):
                    read = np.arange(done, done + batch.num_rows, dtype=np.int64)
                    group = np.searchsorted(read_before, read, side="right") - 1
                    yield (
                        pa.Table.from_batches([batch], schema=parquet.schema_arrow),
                        first_rows[group] + read - read_before[group],
                    )
                    done += batch.num_rows
            except (pa.ArrowInvalid, OSError) as error:
                raise InputError(path, f"cannot be read as Parquet ({error})") from error

    def write_shard(self, handle, tables, compression, schema=None):
        """Row groups end where the shard's running payload bytes (``row_lengths``) pass a multiple
        of ``_ROW_GROUP_BYTES``; the shard's first rows choose the columns with a dictionary, and
        each group is handed to Arrow in ``canonical_chunks`` (``parquet_layout``): the same rows
        give the same file however ``tables`` cut them (a pile whole, or in sub-piles). Arrow
        gathers small writes in a buffer of its own (a small pile's shard is 1-3 calls into Python,
        not 20-30) and hands a large page over as it is (``_SINK_BUFFER_BYTES``)."""
        from pileshuffle.records.fingerprint import row_lengths, rows_bytes

        head, tables = _first_rows(_in_schema(tables, schema), SAMPLE_ROWS)
        schema = head[0].schema if head else schema
        dictionary = _dictionary_columns(head, rows_bytes)
        sink = pa.BufferedOutputStream(
            pa.PythonFile(_LeftOpen(handle), mode="w"), buffer_size=_SINK_BUFFER_BYTES
        )
        writer = pq.ParquetWriter(
            sink,
            schema,
            compression=compression,
            use_dictionary=dictionary,
            write_batch_size=WRITE_BATCH_ROWS,
        )
        pending, before, written = [], 0, 0
        for table in itertools.chain(head, tables):
            written += table.num_rows
            after = before + rows_bytes(table)
            # a group ends in this table: find the rows
            if after // _ROW_GROUP_BYTES > before // _ROW_GROUP_BYTES:
                lengths = row_lengths(table)
                ends = before + np.cumsum(lengths)
                cuts = (
                    np.flatnonzero(ends // _ROW_GROUP_BYTES > (ends - lengths) // _ROW_GROUP_BYTES)
                    + 1
                )
                start = 0
                for cut in cuts.tolist():
                    _write_group(writer, [*pending, table.slice(start, cut - start)], dictionary)
                    pending, start = [], cut
                table = table.slice(start)
            pending.append(table)
            before = after
        _write_group(writer, pending, dictionary)
        writer.close()
        sink.flush()
        return written


def _in_schema(tables, schema):
    """``tables`` in ``schema`` (None: the first table's), cast where theirs differs (metadata
    too)."""
    for table in tables:
        schema = schema or table.schema
        yield table if table.schema.equals(schema, check_metadata=True) else table.cast(schema)


def _first_rows(tables, rows: int):
    """``(the first tables, the rest)`` of the iterator ``tables``: the first hold ``rows`` rows or
    more, or all the tables if they hold fewer."""
    head, held = [], 0
    for table in tables:
        head.append(table)
        held += table.num_rows
        if held >= rows:
            break
    return head, tables


def _dictionary_columns(head, rows_bytes) -> list:
    """``dictionary_columns`` of the shard's first ``SAMPLE_ROWS`` rows (in ``head``), for row
    groups of the shard's rows when it has fewer, else of the rows that ``_ROW_GROUP_BYTES`` of the
    sample's payload bytes (``rows_bytes``) make."""
    sample = pa.concat_tables(head).slice(0, SAMPLE_ROWS) if head else None
    if sample is None or not sample.num_rows:
        return []
    rows = sample.num_rows
    group_rows = (
        rows
        if rows < SAMPLE_ROWS
        else max(rows, rows * _ROW_GROUP_BYTES // max(1, rows_bytes(sample)))
    )
    return dictionary_columns(sample, group_rows)


# Writes of this size or more pass Arrow's buffer by: a data page (~2 MB of 1 KB rows) is copied
# once, into the bytes object Python's file gets, not first into the buffer too. 4 MiB copied
# every byte twice: 0.07-0.24 s of user CPU per GB more in a whole 1 GB Parquet run (2026-12-07,
# issue 56).
_SINK_BUFFER_BYTES = 64 << 10


class _LeftOpen:
    """``handle`` for Arrow's sink, which closes what it wraps when it is dropped (and would
    swallow an upload's failed close): here a close is left to the handle's owner."""

    def __init__(self, handle):
        self.write, self.flush, self.closed = handle.write, handle.flush, False

    def close(self):
        self.closed = True


def _write_group(writer, tables, dictionary):
    """``tables`` (one schema) as one row group (none when they hold no row), in
    ``canonical_chunks`` (the ``dictionary`` columns whole)."""
    rows = sum(t.num_rows for t in tables)
    if rows:
        writer.write_table(
            canonical_chunks(pa.concat_tables(tables), dictionary), row_group_size=rows
        )
