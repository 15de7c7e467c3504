"""Pass 1's keys: give every record its key U, and cut each chunk into the parts of its piles.

All per-record work is vectorized over a chunk: keys come from numpy, records move
with one Arrow ``take`` per chunk, and each pile's part is a zero-copy slice. Keys are a pure
function of the input (``keyed_rows``), so the store writer, ``verify`` and ``quality`` compute
them again with this module; pass 1's Beam steps that use it are ``pass_one``'s.
"""

import numpy as np
import pyarrow as pa

from pileshuffle.engine.sources import (
    Source,
    SourceStats,
    source_groups,
    split_sources,
    stats_by_file,
)  # noqa: F401 (this module's API too)
from pileshuffle.formats import ReadReport, record_hashes, record_lengths
from pileshuffle.formats.base import DEFAULT_CHUNK_BYTES
from pileshuffle.formats.labels import (
    file_labels,
    label_counts,
    record_labels,
)
from pileshuffle.names import HASH_COLUMN, KEY_COLUMN
from pileshuffle.records import keys as keymath
from pileshuffle.records.fingerprint import Fingerprint

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
    """One source read into pile parts (``keyed_rows``, ``split_by_pile``), for run's pass 1 and the
    store writer: iterating gives ``(chunk index, chunk fingerprint as read, parts)``, ``parts``
    yielding ``(pile, part, fingerprint)``; ``keyed()`` gives ``keyed_rows``' chunks whole instead
    (run's pass 1 holds them in ``PileRuns``). Either way ``stats()`` is then the source's
    ``SourceStats`` (with ``balance``, what went into the piles and the class tally too)."""

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
        """``keyed_rows``' ``(table, keys, hashes, lengths, read, rows)`` of each chunk,
        counted for ``stats()``."""
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
    """``(table, keys, hashes, lengths, read)`` for each chunk of ``source`` (of its ``span``) in
    file order: keys are ``position_keys(seed, stream, positions)``, a pure function of the input;
    ``read`` is the chunk's fingerprint as read. With ``balance`` (``(label field, ClassPlan)``, or
    ``(label field, ClassPlan, keep_unlabeled)``) each record comes as many times as its copies say,
    each copy a position of its own, and ``tally`` (a dict) adds up ``class -> [records read,
    records emitted]``."""
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
    first = 0  # the records of the source (of its span) before the chunk
    copies_of = None if balance is None else balance[1].copier(source.id)
    chunks = (
        fmt.read_placed(source.path, chunk_bytes, skip_corrupt, report, source.span)
        if stored is None
        else stored.chunks(fmt, chunk_bytes, skip_corrupt, report)
    )
    for table, positions in chunks:
        hashes, lengths = record_hashes(table), record_lengths(table)
        read = Fingerprint.of(hashes, int(lengths.sum()))
        if copies_of is None:
            keys = _record_keys(table, positions, hashes, source, first, seed, stream, dedup)
            first += table.num_rows
            yield table, keys, hashes, lengths, read, None
            continue
        copies = _chunk_copies(table, source, first, balance, copies_of, stored, tally)
        first += table.num_rows
        rows, keys = _copy_rows_and_keys(table.num_rows, positions, copies, seed, stream)
        yield table, keys, hashes[rows], lengths[rows], read, rows
    if stored is not None:
        stored.close()


def _record_keys(table, positions, hashes, source: Source, first: int, seed, stream, dedup):
    """The keys of a chunk's records without ``balance``: ``position_keys``, or with ``dedup``
    content keys (``Dedup.keys``, told ``first``, the records before the chunk, where the file
    is read from its start)."""
    if dedup is None:
        return keymath.position_keys(seed, stream, positions)
    at_file_start = not source.span or not source.span[0]
    return dedup.keys(table, seed, hashes, source.path, first if at_file_start else None, positions)


def _chunk_copies(table, source: Source, first: int, balance, copies_of, stored, tally):
    """Each record's copies in a chunk under ``balance``, from its labels (parsed, or with
    ``stored`` the counting pass's); adds the chunk's ``class -> [records read, records
    emitted]`` to ``tally`` when given."""
    if stored is None:
        keep_unlabeled = len(balance) > 2 and bool(balance[2])
        labels = record_labels(table, balance[0], source.path, first, keep_unlabeled)
        codes, classes = class_codes(labels)
    else:
        codes, classes = stored.take(table.num_rows), stored.classes
    copies = copies_of(codes, classes)
    for label, read_n, emitted_n in _tally(codes, copies, classes) if tally is not None else ():
        counted = tally.setdefault(label, [0, 0])
        counted[0], counted[1] = counted[0] + read_n, counted[1] + emitted_n
    return copies


def _copy_rows_and_keys(num_rows: int, positions, copies, seed, stream) -> tuple:
    """``(rows, keys)`` of a chunk's ``num_rows`` records with their ``copies``: the row of each
    copy (``table.take(rows)``), and its key, each copy a position of its own (its copy number)."""
    rows = np.repeat(np.arange(num_rows), copies)
    copy_numbers = np.arange(len(rows)) - np.repeat(np.cumsum(copies) - copies, copies)
    return rows, keymath.position_keys(seed, stream, positions[rows], copy_numbers)


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


__all__ = [
    "Source",
    "SourceStats",
    "SourcePiles",
    "INPUT_STREAM",
    "keyed_chunks",
    "keyed_rows",
    "split_by_pile",
    "source_groups",
    "split_sources",
    "stats_by_file",
    "class_codes",
    "class_counts",
    "copies_balance",
]
