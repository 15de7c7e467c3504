"""Pass 1: give every record its key U, and append it to the fragment of its pile.

All per-record work is vectorized over a chunk: keys come from numpy, records move
with one Arrow ``take`` per chunk, and each pile's part is a zero-copy slice.
"""

import dataclasses
import hashlib
import os

import apache_beam as beam
import numpy as np
import pyarrow as pa
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.timestamp import MIN_TIMESTAMP
from apache_beam.utils.windowed_value import WindowedValue

from pileshuffle import keys as keymath
from pileshuffle import progress
from pileshuffle.fingerprint import Fingerprint
from pileshuffle.formats import ReadReport, get_format, record_hashes, record_lengths
from pileshuffle.formats.base import DEFAULT_CHUNK_BYTES, parts_by_pile, records_table
from pileshuffle.formats.labels import record_labels
from pileshuffle.fragments import Fragment, FragmentFiles, to_ipc
from pileshuffle.names import HASH_COLUMN, KEY_COLUMN, source_writer_name
from pileshuffle.tuning import prepare_worker

STATS_TAG = "stats"  # the tag of pass 1's side output: one SourceStats per source
INPUT_STREAM = 0  # key stream tag of input records: (INPUT_STREAM, source id)


@dataclasses.dataclass(frozen=True)
class Source:
    """One input file; ``id`` is its rank in the sorted file list."""

    id: int
    path: str
    size: int


@dataclasses.dataclass(frozen=True)
class SourceStats:
    """What pass 1 read from one source (``fingerprint``) and put into the piles (``emitted``:
    the records with their copies under ``--balance``; None: the records as read)."""

    source: int
    path: str
    fingerprint: Fingerprint
    skipped_records: int = 0
    skipped_bytes: int = 0
    problems: tuple = ()
    emitted: Fingerprint = None
    classes: tuple = ()  # under --balance: ((class, records read, records emitted), ...)

    @staticmethod
    def of(source: Source, fingerprint: Fingerprint, report: ReadReport, emitted=None, classes=None) -> "SourceStats":
        return SourceStats(source.id, source.path, fingerprint, report.skipped_records, report.skipped_bytes,
                           tuple(report.problems), emitted, tuple((c, r, e) for c, (r, e) in sorted((classes or {}).items())))

    @property
    def put_in(self) -> Fingerprint:
        return self.fingerprint if self.emitted is None else self.emitted


def split_by_pile(table: pa.Table, keys: np.ndarray, hashes: np.ndarray, lengths: np.ndarray, num_piles: int):
    """Yield ``(pile, part, fingerprint)`` for every non-empty pile of a chunk; each part
    keeps the chunk's order and carries each record's key (``KEY_COLUMN``) and pass-1
    hash (``HASH_COLUMN``, so pass 2 can account for every record without hashing it again)."""
    table = table.append_column(KEY_COLUMN, pa.array(keys, type=pa.uint64()))
    table = table.append_column(HASH_COLUMN, pa.array(hashes, type=pa.uint64()))
    for pile, part, rows in parts_by_pile(table, keymath.pile_of(keys, num_piles), num_piles):
        yield pile, part, Fingerprint.of(hashes[rows], int(lengths[rows].sum()))


def keyed_chunks(fmt, source: Source, seed: int, stream: tuple, chunk_bytes: int, skip_corrupt: bool, report,
                 balance=None, tally=None):
    """``(table, keys, hashes, lengths, read)`` for each chunk of ``source`` in file order:
    keys are ``record_keys(seed, stream, position)``, a pure function of the input; ``read``
    is the chunk's fingerprint as read. With ``balance`` (``(label field, ClassPlan)``) each
    record comes as many times as its copies say, each copy a position of its own, and ``tally``
    (a dict) adds up ``class -> [records read, records emitted]``."""
    index = 0
    copies_of = None if balance is None else balance[1].copier(source.id)
    for table in fmt.read_chunks(source.path, chunk_bytes, skip_corrupt, report):
        hashes, lengths = record_hashes(table), record_lengths(table)
        read = Fingerprint.of(hashes, int(lengths.sum()))
        if copies_of is not None:
            labels = record_labels(table, balance[0], source.path)
            copies = copies_of(labels)
            if tally is not None:
                for label, read_n, emitted_n in _class_tally(labels, copies):
                    counted = tally.setdefault(label, [0, 0])
                    counted[0], counted[1] = counted[0] + read_n, counted[1] + emitted_n
            rows = np.repeat(np.arange(table.num_rows), copies)
            table, hashes, lengths = table.take(rows), hashes[rows], lengths[rows]
        keys = keymath.record_keys(seed, stream, index, table.num_rows)
        index += table.num_rows
        yield table, keys, hashes, lengths, read


def _class_tally(labels, copies):
    """``(class, records, copies)`` of one chunk's labels and copies."""
    labels = np.asarray(labels, dtype=object).astype(str)
    names, inverse = np.unique(labels, return_inverse=True)
    read = np.bincount(inverse, minlength=len(names))
    emitted = np.bincount(inverse, weights=copies, minlength=len(names)).astype(np.int64)
    return zip(names.tolist(), read.tolist(), emitted.tolist())


def class_counts(fmt, source: Source, field: str, chunk_bytes=DEFAULT_CHUNK_BYTES, skip_corrupt=False) -> dict:
    """``{class: records}`` of one source, read as pass 1 reads it (the same records under
    ``skip_corrupt``): what ``--balance``'s first pass and ``verify`` count."""
    counts = {}
    for table in fmt.read_chunks(source.path, chunk_bytes, skip_corrupt, ReadReport()):
        labels, found = np.unique(record_labels(table, field, source.path).astype(str), return_counts=True)
        for label, n in zip(labels.tolist(), found.tolist()):
            counts[label] = counts.get(label, 0) + n
    return counts


class CountClasses(beam.DoFn):
    """``--balance``'s first pass: ``(source id, class_counts)`` of one source."""

    def __init__(self, format_name, field, chunk_bytes=DEFAULT_CHUNK_BYTES, skip_corrupt=False):
        self._format_name, self._field, self._chunk_bytes, self._skip_corrupt = format_name, field, chunk_bytes, skip_corrupt

    def process(self, source: Source):
        yield source.id, class_counts(get_format(self._format_name), source, self._field, self._chunk_bytes,
                                      self._skip_corrupt)


class _PileWriter:
    """Where pass-1 parts go: fragment files (files mode) or IPC elements (shuffle mode)."""

    def __init__(self, fragments_dir, name: str):
        self._files = FragmentFiles(fragments_dir, name) if fragments_dir else None

    def add(self, order: tuple, pile: int, part: pa.Table, fingerprint: Fingerprint):
        """Files mode appends and returns nothing; shuffle mode returns the element."""
        if self._files is not None:
            self._files.append(pile, part, fingerprint)
            return ()
        return ((pile, Fragment(order, part.num_rows, part.nbytes, fingerprint, payload=to_ipc(part))),)

    def commit(self, order: tuple):
        if self._files is None:
            return []
        return [
            (pile, Fragment(order, records, nbytes, fingerprint, path=path))
            for pile, path, records, nbytes, fingerprint in self._files.commit()
        ]


class ReadSourceToPiles(beam.DoFn):
    """Pass 1 of the template: read one source, key its records, write its pile fragments.

    Keys are ``record_keys(seed, (INPUT_STREAM, source.id), index)``: a pure function of
    the input, so every runner and worker count produces the same piles.
    Main output: ``(pile, Fragment)``; tagged ``stats``: one ``SourceStats`` per source.
    """

    def __init__(self, format_name, seed, num_piles, fragments_dir=None, chunk_bytes=DEFAULT_CHUNK_BYTES,
                 skip_corrupt=False, label=None):
        self._format_name, self._seed, self._num_piles = format_name, seed, num_piles
        self._fragments_dir, self._chunk_bytes, self._skip_corrupt = fragments_dir, chunk_bytes, skip_corrupt
        self._label = label

    def setup(self):
        prepare_worker()

    def process(self, source: Source, classes=None):
        """``classes``: the ``ClassPlan`` side input under ``--balance`` (None: no copies)."""
        report = ReadReport()
        writer = _PileWriter(self._fragments_dir, source_writer_name(source.id))
        balance, tally = (None, None) if classes is None else ((self._label, classes), {})
        chunks = keyed_chunks(get_format(self._format_name), source, self._seed, (INPUT_STREAM, source.id),
                              self._chunk_bytes, self._skip_corrupt, report, balance, tally)
        fingerprint, emitted = Fingerprint(), Fingerprint()
        for chunk_index, (table, keys, hashes, lengths, read) in enumerate(chunks):
            fingerprint += read
            if balance is not None:
                emitted += Fingerprint.of(hashes, int(lengths.sum()))
            for pile, part, part_fingerprint in split_by_pile(table, keys, hashes, lengths, self._num_piles):
                yield from writer.add((source.id, chunk_index), pile, part, part_fingerprint)
            progress.read(source, read.bytes)
        yield from writer.commit((source.id, 0))
        progress.file_read(source)
        stats = SourceStats.of(source, fingerprint, report, None if balance is None else emitted, tally)
        yield beam.pvalue.TaggedOutput(STATS_TAG, stats)


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
        (int.from_bytes(hashlib.blake2b(repr(i).encode(), digest_size=8, key=salt).digest(), "little") for i in ids),
        dtype=np.uint64,
        count=len(ids),
    )


class AssignPiles(beam.DoFn):
    """Pass 1 for composed use: batch a bundle's records, key them, emit pile fragments.

    Unkeyed records draw U from a stream seeded by ``seed`` and a fresh random nonce per
    bundle (uniform, not reproducible); keyed ``(id, record)`` pairs draw U from
    ``(seed, id)`` (reproducible: the same ids give the same order on any runner).
    """

    def __init__(self, seed, num_piles, keyed, fragments_dir=None, batch_bytes=DEFAULT_CHUNK_BYTES):
        self._seed, self._num_piles, self._keyed = seed, num_piles, keyed
        self._fragments_dir, self._batch_bytes = fragments_dir, batch_bytes

    def setup(self):
        prepare_worker()

    def start_bundle(self):
        self._nonce = int.from_bytes(os.urandom(8), "little")
        self._writer = _PileWriter(self._fragments_dir, f"b{self._nonce:016x}")
        self._buffer, self._ids, self._buffered_bytes, self._drawn, self._flushes = [], [], 0, 0, 0

    def process(self, element):
        if self._keyed:
            record_id, element = element
            self._ids.append(record_id)
        self._buffer.append(element)
        self._buffered_bytes += element.nbytes if isinstance(element, (pa.RecordBatch, pa.Table)) else len(element)
        if self._buffered_bytes >= self._batch_bytes:
            yield from self._flush()

    def finish_bundle(self):
        for pile, fragment in [*self._flush(), *self._writer.commit((self._nonce, 0))]:
            yield WindowedValue((pile, fragment), MIN_TIMESTAMP, [GlobalWindow()])

    def _flush(self):
        if not self._buffer:
            return []
        table = _as_table(self._buffer)
        if self._keyed:
            if table.num_rows != len(self._ids):
                raise ValueError("keyed=True takes one (id, record) pair per record; a RecordBatch element needs one id per row")
            keys = _id_keys(self._seed, self._ids)
        else:
            keys = keymath.record_keys(self._seed, (INPUT_STREAM + 1, self._nonce), self._drawn, table.num_rows)
            self._drawn += table.num_rows
        hashes, lengths = record_hashes(table), record_lengths(table)
        order = (self._nonce, self._flushes)
        self._buffer, self._ids, self._buffered_bytes, self._flushes = [], [], 0, self._flushes + 1
        out = []
        for pile, part, fingerprint in split_by_pile(table, keys, hashes, lengths, self._num_piles):
            out.extend(self._writer.add(order, pile, part, fingerprint))
        return out


__all__ = ["Source", "SourceStats", "STATS_TAG", "INPUT_STREAM", "keyed_chunks", "split_by_pile", "ReadSourceToPiles",
           "AssignPiles", "CountClasses", "class_counts"]
