"""Pass 1's Beam steps: records read or received, keyed (``assign``), and held in runs.

The template's pass 1 is ``ReadSourceToPiles`` (a group of listed files, keys from positions in
the files), after ``CountClasses`` under ``--balance`` (each file's classes counted first, and
kept for pass 1 to read instead of parsing the labels again). Composed use's pass 1 is
``AssignPiles`` (a bundle's elements, keyed by a random nonce, by ids, or by content). Both hand
their keyed chunks to ``runs.PileRuns``, which emits the pile fragments.
"""

import hashlib
import itertools
import os

import apache_beam as beam
import numpy as np
import pyarrow as pa
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.timestamp import MIN_TIMESTAMP
from apache_beam.utils.windowed_value import WindowedValue

from pileshuffle.engine import progress
from pileshuffle.engine.balance import ClassPlanner
from pileshuffle.engine.runs import DEFAULT_RUN_BYTES, PileRuns
from pileshuffle.engine.sources import Source
from pileshuffle.engine.transforms.assign import INPUT_STREAM, SourcePiles, class_counts
from pileshuffle.engine.tuning import prepare_worker
from pileshuffle.formats import get_format, record_hashes, record_lengths
from pileshuffle.formats.base import DEFAULT_CHUNK_BYTES, records_table
from pileshuffle.formats.labels import ClassCodesReader, ClassCodesWriter, kept_class_counts
from pileshuffle.io import storage
from pileshuffle.names import class_codes_names, source_writer_name
from pileshuffle.records import keys as keymath
from pileshuffle.records.slice_crcs import expect_records

__all__ = ["STATS_TAG", "CountClasses", "ReadSourceToPiles", "AssignPiles"]

STATS_TAG = "stats"  # the tag of pass 1's side output: one SourceStats per source


def _codes_paths(codes_dir, format_name, source: Source):
    """``(codes, classes, lines)``: where the counting pass keeps ``source``'s class codes for pass
    1 (``ClassCodesWriter``; lines None but for JSONL), or None: not kept for Parquet, whose labels
    are a column pass 1 decodes anyway."""
    if codes_dir is None or format_name == "parquet":
        return None
    codes, classes, lines = (storage.join(codes_dir, name) for name in class_codes_names(source.id))
    return codes, classes, lines if format_name == "jsonl" else None


class CountClasses(beam.DoFn):
    """``--balance``'s first pass: ``(source id, class_counts)`` of one source; with
    ``codes_dir`` each record's class is kept there for pass 1 (``ReadSourceToPiles``)."""

    def __init__(
        self,
        format_name,
        field,
        chunk_bytes=DEFAULT_CHUNK_BYTES,
        skip_corrupt=False,
        keep_unlabeled=False,
        codes_dir=None,
    ):
        self._format_name, self._field = format_name, field
        self._chunk_bytes, self._skip_corrupt = chunk_bytes, skip_corrupt
        self._keep_unlabeled, self._codes_dir = keep_unlabeled, codes_dir

    def process(self, source: Source):
        fmt, paths = (
            get_format(self._format_name),
            _codes_paths(self._codes_dir, self._format_name, source),
        )
        if paths is None:
            yield (
                source.id,
                class_counts(
                    fmt,
                    source,
                    self._field,
                    self._chunk_bytes,
                    self._skip_corrupt,
                    self._keep_unlabeled,
                ),
            )
            return
        yield (
            source.id,
            kept_class_counts(
                fmt,
                source.path,
                self._field,
                self._chunk_bytes,
                ClassCodesWriter(*paths),
                self._skip_corrupt,
                self._keep_unlabeled,
            ),
        )


class ReadSourceToPiles(beam.DoFn):
    """Pass 1 of the template: read a group of sources (``source_groups``), key their records,
    and write their piles' parts as runs of up to ``run_bytes`` each (``runs.PileRuns``).

    Keys are ``position_keys(seed, (INPUT_STREAM, source.id), position in the file)``: a pure
    function of the input, so every runner, worker count, grouping and split produces the same
    piles. Main output: ``(pile, Fragment)``, one per (run, pile), or with ``group`` > 1 ``(group,
    GroupSegment)``, one per (run, group of piles); tagged ``stats``: one ``SourceStats`` per
    source. Everything is emitted from ``process`` (Beam's DaskRunner drops ``finish_bundle``'s).
    """

    def __init__(
        self,
        format_name,
        seed,
        num_piles,
        fragments_dir=None,
        chunk_bytes=DEFAULT_CHUNK_BYTES,
        skip_corrupt=False,
        label=None,
        keep_unlabeled=False,
        codes_dir=None,
        policy=None,
        run_bytes=DEFAULT_RUN_BYTES,
        memory_for_runs=0,
        dedup=None,
        group=1,
        records_per_process=0,
    ):
        self._format_name, self._seed, self._num_piles = format_name, seed, num_piles
        # what a worker process hashes (0: not known)
        self._records_per_process = records_per_process
        self._dedup, self._group = dedup, group
        self._fragments_dir = fragments_dir
        self._chunk_bytes, self._skip_corrupt = chunk_bytes, skip_corrupt
        self._label, self._keep_unlabeled, self._codes_dir = label, keep_unlabeled, codes_dir
        self._planner = None if policy is None else ClassPlanner(policy, seed)
        self._run_bytes, self._memory_for_runs = run_bytes, memory_for_runs

    def setup(self):
        prepare_worker()
        expect_records(self._records_per_process)

    def process(self, group, counts=None):
        """``group``: a tuple of ``Source`` (one ``Source`` alone is a group of one). ``counts``:
        the counting pass's side input under ``--balance`` (None: no copies)."""
        group = (group,) if isinstance(group, Source) else tuple(group)
        start = group[0].span[0] if group[0].span else 0
        runs = PileRuns(
            self._num_piles,
            self._run_bytes,
            source_writer_name(group[0].id, start),
            self._fragments_dir,
            (group[0].id, start),
            self._memory_for_runs,
            self._group,
        )
        balance = (
            None if counts is None else (self._label, self._planner(counts), self._keep_unlabeled)
        )
        for source in group:
            paths = (
                None if counts is None else _codes_paths(self._codes_dir, self._format_name, source)
            )
            reading = SourcePiles(
                get_format(self._format_name),
                source,
                self._seed,
                (INPUT_STREAM, source.id),
                self._chunk_bytes,
                self._skip_corrupt,
                self._num_piles,
                balance,
                None if paths is None else ClassCodesReader(*paths, source.path),
                self._dedup,
            )
            for table, keys, hashes, lengths, read, rows in reading.keyed():
                yield from runs.add(table, keys, hashes, lengths, rows)
                progress.read(source, read.bytes)
            progress.file_read(source)
            yield beam.pvalue.TaggedOutput(STATS_TAG, reading.stats())
        yield from runs.flush()


def _as_table(batch) -> pa.Table:
    """A composed-use element batch as a records table: ``bytes`` or Arrow batches/tables."""
    first = batch[0]
    if isinstance(first, (bytes, bytearray, memoryview)):
        return records_table([bytes(r) for r in batch])
    if isinstance(first, pa.RecordBatch):
        return pa.Table.from_batches(batch)
    if isinstance(first, pa.Table):
        return pa.concat_tables(batch)
    raise TypeError(
        "ShuffleToPiles takes bytes or pyarrow RecordBatch/Table elements (or (id, record) "
        f"pairs with keyed=True), got {type(first).__name__}"
    )


def _id_keys(seed: int, ids) -> np.ndarray:
    """U for keyed records: a keyed BLAKE2b hash of ``(seed, id)``; reproducible anywhere."""
    salt = int(seed).to_bytes(16, "little", signed=True)
    return np.fromiter(
        (
            int.from_bytes(
                hashlib.blake2b(repr(i).encode(), digest_size=8, key=salt).digest(), "little"
            )
            for i in ids
        ),
        dtype=np.uint64,
        count=len(ids),
    )


class AssignPiles(beam.DoFn):
    """Pass 1 for composed use: batch a bundle's records, key them, emit pile fragments.

    Unkeyed records draw U from a stream seeded by ``seed`` and a fresh random nonce per
    bundle (uniform, not reproducible); keyed ``(id, record)`` pairs draw U from
    ``(seed, id)`` (reproducible: the same ids give the same order on any runner); with ``dedup``
    records draw U from their content (``dedup.Dedup.keys``; ids, if any, are not used).
    """

    def __init__(
        self,
        seed,
        num_piles,
        keyed,
        fragments_dir=None,
        batch_bytes=DEFAULT_CHUNK_BYTES,
        run_bytes=DEFAULT_RUN_BYTES,
        dedup=None,
    ):
        self._seed, self._num_piles, self._keyed, self._dedup = seed, num_piles, keyed, dedup
        self._fragments_dir = fragments_dir
        self._batch_bytes, self._run_bytes = batch_bytes, run_bytes

    def setup(self):
        prepare_worker()

    def start_bundle(self):
        self._nonce = int.from_bytes(os.urandom(8), "little")
        self._runs = PileRuns(
            self._num_piles,
            self._run_bytes,
            f"b{self._nonce:016x}",
            self._fragments_dir,
            (self._nonce,),
        )
        self._buffer, self._ids, self._buffered_bytes, self._drawn = [], [], 0, 0

    def process(self, element):
        if self._keyed:
            record_id, element = element
            self._ids.append(record_id)
        self._buffer.append(element)
        self._buffered_bytes += (
            element.nbytes if isinstance(element, (pa.RecordBatch, pa.Table)) else len(element)
        )
        if self._buffered_bytes >= self._batch_bytes:
            yield from self._hold()

    def finish_bundle(self):
        for pile, fragment in itertools.chain(self._hold(), self._runs.flush()):
            yield WindowedValue((pile, fragment), MIN_TIMESTAMP, [GlobalWindow()])

    def _hold(self):
        """Key the buffered elements and hand them to the bundle's runs;
        the elements of any run that fills."""
        if not self._buffer:
            return []
        table = _as_table(self._buffer)
        hashes = record_hashes(table)
        if self._dedup is not None:
            keys = self._dedup.keys(table, self._seed, hashes)
        elif self._keyed:
            if table.num_rows != len(self._ids):
                raise ValueError(
                    "keyed=True takes one (id, record) pair per record; a RecordBatch element "
                    "needs one id per row"
                )
            keys = _id_keys(self._seed, self._ids)
        else:
            keys = keymath.record_keys(
                self._seed, (INPUT_STREAM + 1, self._nonce), self._drawn, table.num_rows
            )
            self._drawn += table.num_rows
        self._buffer, self._ids, self._buffered_bytes = [], [], 0
        return self._runs.add(table, keys, hashes, record_lengths(table))
