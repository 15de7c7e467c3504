"""Pass 1: give every record its key U, and append it to the fragment of its pile.

All per-record work is vectorized over a chunk: keys come from numpy, records move
with one Arrow ``take`` per chunk, and each pile's part is a zero-copy slice.
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

from pileshuffle import progress
from pileshuffle.engine.balance import ClassPlanner
from pileshuffle.engine.runs import DEFAULT_RUN_BYTES, PileRuns
from pileshuffle.engine.sources import (
    Source,
    SourceStats,
    source_groups,
    split_sources,
    stats_by_file,
)  # noqa: F401 (this module's API too)
from pileshuffle.engine.tuning import prepare_worker
from pileshuffle.formats import ReadReport, get_format, record_hashes, record_lengths
from pileshuffle.formats.base import DEFAULT_CHUNK_BYTES, records_table
from pileshuffle.formats.labels import (
    ClassCodesReader,
    ClassCodesWriter,
    file_labels,
    kept_class_counts,
    label_counts,
    record_labels,
)
from pileshuffle.io import storage
from pileshuffle.names import HASH_COLUMN, KEY_COLUMN, class_codes_names, source_writer_name
from pileshuffle.records import keys as keymath
from pileshuffle.records.fingerprint import Fingerprint
from pileshuffle.records.slice_crcs import expect_records

STATS_TAG = "stats"  # the tag of pass 1's side output: one SourceStats per source
INPUT_STREAM = 0  # key stream tag of input records: (INPUT_STREAM, source id)


def split_by_pile(
    table: pa.Table,
    keys: np.ndarray,
    hashes: np.ndarray,
    lengths: np.ndarray,
    num_piles: int,
    rows: np.ndarray = None,
):
    """Yield ``(pile, part, fingerprint)`` for every non-empty pile of a chunk; each part
    keeps the chunk's order and carries each record's key (``KEY_COLUMN``) and pass-1
    hash (``HASH_COLUMN``, so pass 2 can account for every record without hashing it again).
    With ``rows`` (``keyed_rows``' copies) the chunk is ``table.take(rows)``: each pile's part is
    taken on its own (one ``take`` of a chunk with its copies would pass glibc's 32 MiB heap
    limit at 2x copies, and each new mapping costs page faults)."""
    order, bounds = keymath.group_by_pile(keymath.pile_of(keys, num_piles), num_piles)
    if rows is None:
        taken = table.take(order)
        taken = taken.append_column(KEY_COLUMN, pa.array(keys[order], type=pa.uint64()))
        taken = taken.append_column(HASH_COLUMN, pa.array(hashes[order], type=pa.uint64()))
    for pile in np.flatnonzero(np.diff(bounds)).tolist():
        start, stop = int(bounds[pile]), int(bounds[pile + 1])
        picked = order[start:stop]
        if rows is None:
            part = taken.slice(start, stop - start)
        else:
            part = table.take(rows[picked]).append_column(
                KEY_COLUMN, pa.array(keys[picked], type=pa.uint64())
            )
            part = part.append_column(HASH_COLUMN, pa.array(hashes[picked], type=pa.uint64()))
        yield pile, part, Fingerprint.of(hashes[picked], int(lengths[picked].sum()))


class SourcePiles:
    """One source read into pile parts (``keyed_rows``, ``split_by_pile``), for run's pass 1 and
    the store writer: iterating gives ``(chunk index, chunk fingerprint as read, parts)``,
    ``parts`` yielding ``(pile, part, fingerprint)``; ``keyed()`` gives ``keyed_rows``' chunks
    whole instead (run's pass 1 holds them in ``PileRuns``). Either way ``stats()`` is then the
    source's ``SourceStats`` (with ``balance``, what went into the piles and the class tally too)."""

    def __init__(
        self,
        fmt,
        source: Source,
        seed: int,
        stream: tuple,
        chunk_bytes: int,
        skip_corrupt: bool,
        num_piles: int,
        balance=None,
        stored=None,
        dedup=None,
    ):
        self._source, self._report, self._num_piles = source, ReadReport(), num_piles
        self._read, self._emitted = Fingerprint(), None if balance is None else Fingerprint()
        self._tally = None if balance is None else {}
        self._chunks = keyed_rows(
            fmt,
            source,
            seed,
            stream,
            chunk_bytes,
            skip_corrupt,
            self._report,
            balance,
            self._tally,
            stored,
            dedup,
        )

    def __iter__(self):
        for chunk_index, (table, keys, hashes, lengths, read, rows) in enumerate(self.keyed()):
            yield (
                chunk_index,
                read,
                split_by_pile(table, keys, hashes, lengths, self._num_piles, rows),
            )

    def keyed(self):
        """``keyed_rows``' ``(table, keys, hashes, lengths, read, rows)`` of each chunk, counted for ``stats()``."""
        for table, keys, hashes, lengths, read, rows in self._chunks:
            self._read += read
            if self._emitted is not None:  # what the piles must hold: the records with their copies
                self._emitted += Fingerprint.of(hashes, int(lengths.sum()))
            yield table, keys, hashes, lengths, read, rows

    def stats(self) -> SourceStats:
        return SourceStats.of(self._source, self._read, self._report, self._emitted, self._tally)


def keyed_chunks(
    fmt,
    source: Source,
    seed: int,
    stream: tuple,
    chunk_bytes: int,
    skip_corrupt: bool,
    report,
    balance=None,
    tally=None,
):
    """``(table, keys, hashes, lengths, read)`` for each chunk of ``source`` (of its ``span``) in file
    order: keys are ``position_keys(seed, stream, positions)``, a pure function of the input; ``read``
    is the chunk's fingerprint as read. With ``balance`` (``(label field, ClassPlan)``, or
    ``(label field, ClassPlan, keep_unlabeled)``) each record comes as many times as its copies
    say, each copy a position of its own, and ``tally`` (a dict) adds up ``class -> [records
    read, records emitted]``."""
    for table, keys, hashes, lengths, read, rows in keyed_rows(
        fmt, source, seed, stream, chunk_bytes, skip_corrupt, report, balance, tally
    ):
        yield (table if rows is None else table.take(rows)), keys, hashes, lengths, read


def keyed_rows(
    fmt,
    source: Source,
    seed: int,
    stream: tuple,
    chunk_bytes: int,
    skip_corrupt: bool,
    report,
    balance=None,
    tally=None,
    stored=None,
    dedup=None,
):
    """``keyed_chunks`` with each chunk as read: ``(table, keys, hashes, lengths, read, rows)``,
    where ``rows`` (None without ``balance``) picks the records with their copies
    (``table.take(rows)``), and ``keys``, ``hashes`` and ``lengths`` are the copies'. With
    ``stored`` (a ``ClassCodesReader`` of the source) labels come from the counting pass
    instead of being parsed again (and a JSONL file's lines are read where it found them). With
    ``dedup`` (a ``dedup.Dedup``; not with ``balance``) keys are content keys (``Dedup.keys``)."""
    first = 0
    copies_of = None if balance is None else balance[1].copier(source.id)
    keep_unlabeled = balance is not None and len(balance) > 2 and bool(balance[2])
    chunks = (
        fmt.read_placed(source.path, chunk_bytes, skip_corrupt, report, source.span)
        if stored is None
        else stored.chunks(fmt, chunk_bytes, skip_corrupt, report)
    )
    for table, positions in chunks:
        hashes, lengths = record_hashes(table), record_lengths(table)
        read = Fingerprint.of(hashes, int(lengths.sum()))
        if copies_of is None:
            keys = (
                keymath.position_keys(seed, stream, positions)
                if dedup is None
                else dedup.keys(
                    table,
                    seed,
                    hashes,
                    source.path,
                    first if not source.span or not source.span[0] else None,
                    positions,
                )
            )
            first += table.num_rows
            yield table, keys, hashes, lengths, read, None
            continue
        if stored is None:
            codes, classes = class_codes(
                record_labels(table, balance[0], source.path, first, keep_unlabeled)
            )
        else:
            codes, classes = stored.take(table.num_rows), stored.classes
        copies = copies_of(codes, classes)
        found = _tally(codes, copies, classes) if tally is not None else ()
        first += table.num_rows
        for label, read_n, emitted_n in found:
            counted = tally.setdefault(label, [0, 0])
            counted[0], counted[1] = counted[0] + read_n, counted[1] + emitted_n
        rows = np.repeat(np.arange(table.num_rows), copies)
        copy_numbers = np.arange(len(rows)) - np.repeat(np.cumsum(copies) - copies, copies)
        keys = keymath.position_keys(seed, stream, positions[rows], copy_numbers)
        yield table, keys, hashes[rows], lengths[rows], read, rows
    if stored is not None:
        stored.close()


def class_codes(labels) -> tuple:
    """``(codes, classes)`` of one chunk's labels: ``classes`` the distinct labels (sorted),
    ``codes`` each record's index into them, as the counting pass's ``ClassCodesReader`` gives."""
    classes, codes = np.unique(np.asarray(labels, dtype=object).astype(str), return_inverse=True)
    return codes.reshape(-1), classes.tolist()


def _tally(codes, copies, classes):
    """``(class, records read, records emitted)`` of one chunk's class codes and copies."""
    read = np.bincount(codes, minlength=len(classes))
    emitted = np.bincount(codes, weights=copies, minlength=len(classes)).astype(np.int64)
    return [(classes[c], int(read[c]), int(emitted[c])) for c in np.flatnonzero(read).tolist()]


def class_counts(
    fmt,
    source: Source,
    field: str,
    chunk_bytes=DEFAULT_CHUNK_BYTES,
    skip_corrupt=False,
    keep_unlabeled=False,
) -> dict:
    """``{class: records}`` of one source, read as pass 1 reads it (the same records under
    ``skip_corrupt``): what ``--balance``'s first pass and ``verify`` count. Only the labels
    are read (``file_labels``: a Parquet file's label column, a JSONL line's label found without
    parsing the line where it can be)."""
    counts = {}
    for labels in file_labels(
        fmt, source.path, field, chunk_bytes, skip_corrupt, ReadReport(), keep_unlabeled
    ):
        for label, n in label_counts(labels).items():
            counts[label] = counts.get(label, 0) + n
    return dict(sorted(counts.items()))


def copies_balance(
    fmt, sources, field: str, policy, seed: int, skip_corrupt=False, keep_unlabeled=False
) -> tuple:
    """``keyed_chunks``' ``balance`` for a run or a generation made with ``--balance``
    (``policy``: a ``balance.Policy``): ``sources``' classes counted as its first pass counted
    them, turned into copies under its seed: what ``verify`` and ``quality`` recompute."""
    from pileshuffle.engine.balance import class_plan

    counts = [
        (
            s.id,
            class_counts(fmt, s, field, skip_corrupt=skip_corrupt, keep_unlabeled=keep_unlabeled),
        )
        for s in sources
    ]
    return field, class_plan(counts, policy, seed), keep_unlabeled


def _codes_paths(codes_dir, format_name, source: Source):
    """``(codes, classes, lines)``: where the counting pass keeps ``source``'s class codes for pass 1
    (``ClassCodesWriter``; lines None but for JSONL), or None: not kept for Parquet, whose labels
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
        self._format_name, self._field, self._chunk_bytes, self._skip_corrupt = (
            format_name,
            field,
            chunk_bytes,
            skip_corrupt,
        )
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
    function of the input, so every runner, worker count, grouping and split produces the same piles.
    Main output: ``(pile, Fragment)``, one per (run, pile), or with ``group`` > 1 ``(group,
    GroupSegment)``, one per (run, group of piles); tagged ``stats``: one ``SourceStats`` per source. Everything is emitted from ``process`` (Beam's DaskRunner drops ``finish_bundle``'s).
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
        self._records_per_process = (
            records_per_process  # what a worker process hashes (0: not known)
        )
        self._dedup, self._group = dedup, group
        self._fragments_dir, self._chunk_bytes, self._skip_corrupt = (
            fragments_dir,
            chunk_bytes,
            skip_corrupt,
        )
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
        f"ShuffleToPiles takes bytes or pyarrow RecordBatch/Table elements (or (id, record) pairs with keyed=True), got {type(first).__name__}"
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
        self._fragments_dir, self._batch_bytes, self._run_bytes = (
            fragments_dir,
            batch_bytes,
            run_bytes,
        )

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
        """Key the buffered elements and hand them to the bundle's runs; the elements of any run that fills."""
        if not self._buffer:
            return []
        table = _as_table(self._buffer)
        hashes = record_hashes(table)
        if self._dedup is not None:
            keys = self._dedup.keys(table, self._seed, hashes)
        elif self._keyed:
            if table.num_rows != len(self._ids):
                raise ValueError(
                    "keyed=True takes one (id, record) pair per record; a RecordBatch element needs one id per row"
                )
            keys = _id_keys(self._seed, self._ids)
        else:
            keys = keymath.record_keys(
                self._seed, (INPUT_STREAM + 1, self._nonce), self._drawn, table.num_rows
            )
            self._drawn += table.num_rows
        self._buffer, self._ids, self._buffered_bytes = [], [], 0
        return self._runs.add(table, keys, hashes, record_lengths(table))


__all__ = [
    "Source",
    "SourceStats",
    "SourcePiles",
    "STATS_TAG",
    "INPUT_STREAM",
    "keyed_chunks",
    "keyed_rows",
    "split_by_pile",
    "source_groups",
    "split_sources",
    "stats_by_file",
    "ReadSourceToPiles",
    "AssignPiles",
    "CountClasses",
    "class_codes",
    "class_counts",
    "copies_balance",
]
