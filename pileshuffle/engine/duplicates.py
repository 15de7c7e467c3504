"""Which records are duplicates, among records whose content keys tie: compared by their values.

Keys are ``dedup.Dedup.keys``: equal contents get equal keys, so copies meet in one pile and,
after pass 2's sort by U, sit side by side. Records whose keys tie are compared by their values
(bytes, or Arrow equality), never by a hash: a collision between different contents keeps both.
The first of each group in the pile's canonical order (input order) is kept
(``distinct_in_order``), and the rest are counted as ``Dropped``. A group pass 2 cannot split
by U (one record repeated more than a pile holds) is streamed, never loaded whole
(``stream_distinct``): memory is one batch and the group's distinct values. A store's writer
numbers the distinct contents of a batch instead (``content_groups``).
"""

import dataclasses
import heapq

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pileshuffle.engine.dedup import TOP_GROUPS, Dedup
from pileshuffle.records.fingerprint import Fingerprint

__all__ = ["Dropped", "distinct_in_order", "content_groups", "stream_distinct"]

_PREVIEW_CHARS = 80


@dataclasses.dataclass
class Dropped:
    """What pass 2 dropped from one pile: their fingerprint (with what it wrote, the pile's records)
    and its largest groups, ``(copies, record hash, preview)`` each, at most ``TOP_GROUPS``."""

    fingerprint: Fingerprint = dataclasses.field(default_factory=Fingerprint)
    groups: list = dataclasses.field(default_factory=list)

    def add(self, hashes: np.ndarray, lengths: np.ndarray):
        self.fingerprint += Fingerprint.of(hashes, int(np.sum(lengths)))

    def add_groups(self, groups):
        self.groups = heapq.nlargest(
            TOP_GROUPS, [*self.groups, *groups], key=lambda g: (g[0], g[1])
        )


def _same_rows(values: pa.Table, left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """Whether row ``left[i]`` of ``values`` equals row ``right[i]`` (nulls equal nulls),
    for every i."""
    same = np.ones(len(left), dtype=bool)
    if not len(left):
        return same
    for column in values.columns:
        a, b = column.take(left), column.take(right)
        try:
            equal = pc.equal(a, b)
            both_null = pc.and_(pc.is_null(a), pc.is_null(b))
            equal = pc.or_kleene(pc.fill_null(equal, False), both_null)
            same &= np.asarray(equal.to_numpy(zero_copy_only=False), dtype=bool)
        except (pa.ArrowNotImplementedError, pa.ArrowInvalid, TypeError):
            # nested types: compared as Python values
            same &= np.array([x == y for x, y in zip(a.to_pylist(), b.to_pylist())], dtype=bool)
    return same


def _row(values: pa.Table, index: int) -> tuple:
    return tuple(column[index].as_py() for column in values.columns)


def _preview(records: pa.Table, index: int) -> str:
    """A record's start, as text, for the manifest's largest groups."""
    from pileshuffle.formats import holder_of

    row = records.slice(index, 1).to_pylist()[0]
    holder = holder_of(records)
    # a bytes format: its payload, without a frame's header or a newline
    if holder.record_column is not None:
        value = row[holder.record_column][
            holder.before : len(row[holder.record_column]) - holder.after
        ]
        text = value.decode("utf-8", "backslashreplace")
    else:
        text = repr(row)
    return text[:_PREVIEW_CHARS]


def distinct_in_order(
    records: pa.Table,
    order: np.ndarray,
    keys: np.ndarray,
    hashes: np.ndarray,
    lengths: np.ndarray,
    dedup: Dedup,
    dropped: Dropped = None,
) -> np.ndarray:
    """Which rows to keep (bool array) of ``records.take(order)``, whose ``keys`` are in order
    (stable: equal keys in canonical order), as are ``hashes`` and ``lengths``: the first of each
    distinct content; the rest are added to ``dropped``."""
    n = len(keys)
    keep = np.ones(n, dtype=bool)
    if n < 2:
        return keep
    run_starts, run_of, members = _tie_runs(keys)
    if not len(members):
        return keep
    if dedup.field is None:  # whole records: compared where they are
        values, at = records, order
    else:  # a field: read from the records that tie only
        involved = np.unique(np.concatenate((members, run_starts[run_of[members]])))
        values = dedup.values(records.take(order[involved]), "a pile")
        # sorted row -> its place in ``values`` (tied rows only)
        at = np.searchsorted(involved, np.arange(n))
    same = _same_rows(values, at[members], at[run_starts[run_of[members]]])
    keep[members[same]] = False
    # a tie of different contents: a hash collision
    for run in np.unique(run_of[members[~same]]).tolist():
        rows = np.arange(run_starts[run], run_starts[run] + np.sum(run_of == run))
        keep[rows] = False
        # the first of each value
        keep[rows[np.unique(_value_ids(values, at[rows]), return_index=True)[1]]] = True
    if dropped is not None:
        _add_dropped(dropped, keep, records, order, hashes, lengths, run_starts, run_of)
    return keep


def _add_dropped(dropped: Dropped, keep, records, order, hashes, lengths, run_starts, run_of):
    """Adds to ``dropped`` the rows ``keep`` leaves out (``distinct_in_order``'s): their
    fingerprint, and the largest groups of copies, ``(copies, record hash, preview)`` each."""
    gone = np.flatnonzero(~keep)
    dropped.add(hashes[gone], lengths[gone])
    copies = np.bincount(run_of[gone], minlength=len(run_starts)) + 1
    # as add_groups ranks: (copies, hash)
    largest = np.lexsort((hashes[run_starts], copies))[::-1][:TOP_GROUPS]
    dropped.add_groups(
        [
            (
                int(copies[r]),
                int(hashes[run_starts[r]]),
                _preview(records, int(order[run_starts[r]])),
            )
            for r in largest.tolist()
            if copies[r] > 1
        ]
    )


def _tie_runs(ordered: np.ndarray) -> tuple:
    """``(starts, run_of, members)`` of keys in order (1 or more): where each run of equal keys
    starts, the run of every place, and the places after the first of their run."""
    n = len(ordered)
    starts = np.flatnonzero(np.concatenate(([True], ordered[1:] != ordered[:-1])))
    run_of = np.repeat(np.arange(len(starts)), np.diff(np.append(starts, n)))
    return starts, run_of, np.flatnonzero(starts[run_of] != np.arange(n))


def _value_ids(values: pa.Table, rows: np.ndarray) -> np.ndarray:
    """A number for each of ``values``' ``rows``, 0, 1, ... in order of first appearance, equal
    where the rows' values are (compared as Python values: the rows of one key that differ, a hash
    collision)."""
    seen = {}
    return np.array(
        [seen.setdefault(_row(values, int(r)), len(seen)) for r in rows.tolist()], dtype=np.int64
    )


def content_groups(values: pa.Table, keys: np.ndarray) -> np.ndarray:
    """A group number for every row of ``values``, equal exactly where the rows' contents are equal:
    rows tie on ``keys`` (content keys) first, then are compared by their values, as
    ``distinct_in_order`` compares them (a key collision of different contents gives two groups)."""
    n = len(keys)
    if not n:
        return np.zeros(0, dtype=np.int64)
    order = np.argsort(keys, kind="stable")
    starts, run_of, members = _tie_runs(keys[order])
    groups = np.empty(n, dtype=np.int64)
    groups[order] = run_of
    same = _same_rows(values, order[members], order[starts[run_of[members]]])
    fresh = n
    # a key collision: number each distinct value anew
    for run in np.unique(run_of[members[~same]]).tolist():
        rows = order[starts[run] : starts[run] + int(np.sum(run_of == run))]
        ids = _value_ids(values, rows)
        groups[rows] = fresh + ids
        fresh += int(ids.max()) + 1
    return groups


def stream_distinct(batches, records_of, dedup: Dedup, dropped: Dropped = None):
    """Yield the first record of each distinct content of ``batches`` (tables of one key's records,
    in canonical order), holding one batch and the distinct values seen: a pile of one record
    repeated is never loaded whole. ``records_of(table)`` gives ``(records, hashes, lengths)``."""
    kept_values, groups = None, []  # groups: [copies, record hash, preview] of each kept value
    for table in batches:
        records, hashes, lengths = records_of(table)
        values = dedup.values(records, "a pile")
        keep = np.ones(table.num_rows, dtype=bool)
        for k in range(0 if kept_values is None else kept_values.num_rows):  # usually one value
            both = pa.concat_tables([kept_values.slice(k, 1), values])
            same = _same_rows(
                both, np.zeros(table.num_rows, dtype=np.int64), np.arange(1, table.num_rows + 1)
            )
            groups[k][0] += int(np.sum(same & keep))
            keep &= ~same
        fresh = np.flatnonzero(keep)
        new = (
            fresh[
                distinct_in_order(
                    records,
                    fresh,
                    np.zeros(len(fresh), np.uint64),
                    hashes[fresh],
                    lengths[fresh],
                    dedup,
                )
            ]
            if len(fresh)
            else fresh
        )
        for row in new.tolist():
            same = _same_rows(values, np.full(len(fresh), row), fresh)
            groups.append([int(np.sum(same)), int(hashes[row]), _preview(records, row)])
        keep[:] = False
        keep[new] = True
        if dropped is not None:
            dropped.add(hashes[~keep], lengths[~keep])
        if len(new):
            taken = values.take(new)
            kept_values = taken if kept_values is None else pa.concat_tables([kept_values, taken])
            yield table.take(new)
    if dropped is not None:
        dropped.add_groups([tuple(g) for g in groups if g[0] > 1])
