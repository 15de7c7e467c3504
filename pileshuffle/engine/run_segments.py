"""A pass-1 run's segments, made from the keyed chunks a writer held (``runs.PileRuns``).

Each held chunk (``Held``) is sorted by pile. A run on disk or in a payload gets one record batch
per pile (or group of piles, ``pile_groups``), gathered a window of neighbouring piles at a time
(``segments``: one concatenation and one take per window); a run kept in this process's memory
gets each pile's records as zero-copy slices of the held chunks instead (``sliced``): the same
rows in the same order, with the same facts, and no copy. Facts: ``(records, nbytes,
fingerprint)`` of a pile, or ``GroupSegment.piles`` rows of a group.
"""

import dataclasses

import numpy as np
import pyarrow as pa

from pileshuffle.names import HASH_COLUMN
from pileshuffle.records import keys as keymath
from pileshuffle.records.fingerprint import Fingerprint

__all__ = ["Held", "segments", "gathered", "sliced", "segments_of", "one_record_batch"]

_WINDOW_BYTES = 32 << 20  # a flush gathers about this many bytes of neighbouring piles at a time


@dataclasses.dataclass
class Held:
    """One keyed chunk, sorted by pile: ``bounds[p]:bounds[p+1]`` are pile p's rows."""

    table: pa.Table  # the records with KEY_COLUMN and HASH_COLUMN, in pile order
    bounds: np.ndarray
    lengths: np.ndarray  # each row's payload bytes (the fingerprint's byte count)


def segments(held, done=None, group: int = 1):
    """``(key, record batch, facts)`` for every pile (``group`` 1: key the pile, facts ``(records,
    nbytes, fingerprint)``) or group of piles (key ``pile // group``, facts ``GroupSegment.piles``)
    the held chunks reach, in pile order; each pile's records in held order (chunk by chunk), a
    window of neighbouring piles at a time (``_windows``, ``_gather``). ``done`` is called at the
    end."""
    try:
        for window in gathered(held, group):
            yield from _window_segments(*window, group)
    finally:
        if done is not None:
            done()


def _windows(held, group: int = 1):
    """``(start, stop)``: the piles in ranges of about ``_WINDOW_BYTES`` of held records each,
    cut only between groups of ``group`` piles."""
    num_piles = len(held[0].bounds) - 1
    counts = sum(np.diff(h.bounds) for h in held)
    mean = sum(h.table.nbytes for h in held) / max(1, int(counts.sum()))
    reached = np.cumsum(counts) * mean  # about the bytes of piles 0..p
    start = 0
    while start < num_piles:
        before = reached[start - 1] if start else 0.0
        stop = max(start + 1, int(np.searchsorted(reached, before + _WINDOW_BYTES, side="right")))
        stop = min(num_piles, -(-stop // group) * group)
        yield start, stop
        start = stop


def gathered(held, group: int = 1):
    """Every window's ``_gather`` that some chunk reaches, in pile order."""
    for start, stop in _windows(held, group):
        gathered = _gather(held, start, stop)
        if gathered is not None:
            yield gathered


def _gather(held, start: int, stop: int):
    """``(table, piles, lengths)`` of piles ``start .. stop-1``: each chunk's slice of them, put
    in pile order (one take; chunk order kept within a pile); None if no chunk reaches them."""
    slices, piles, lengths = [], [], []
    for h in held:
        first, last = int(h.bounds[start]), int(h.bounds[stop])
        if last > first:
            slices.append(h.table.slice(first, last - first))
            piles.append(np.repeat(np.arange(start, stop), np.diff(h.bounds[start : stop + 1])))
            lengths.append(np.asarray(h.lengths[first:last]))
    if not slices:
        return None
    piles = np.concatenate(piles)
    order = keymath.pile_order(piles, stop)
    return (
        pa.concat_tables(slices).combine_chunks().take(order),
        piles[order],
        np.concatenate(lengths)[order],
    )


def sliced(held, done=None) -> list:
    """``segments`` of ``held`` for a run kept in memory (one pile a segment): each pile's records
    as a table of zero-copy slices of the held chunks, in held order (the rows and order
    ``_gather`` would copy into one batch), with the same facts. ``done`` is called at the end."""
    try:
        bounds = np.stack([h.bounds for h in held])  # (chunk, pile + 1)
        counts = np.diff(bounds, axis=1)
        payloads = sum(
            _per_pile(np.cumsum(np.asarray(h.lengths), dtype=np.int64), h.bounds) for h in held
        )
        with np.errstate(over="ignore"):
            sums = sum(_per_pile(np.cumsum(_hashes(h), dtype=np.uint64), h.bounds) for h in held)
        xors = np.bitwise_xor.reduce(
            [
                _per_pile(np.bitwise_xor.accumulate(_hashes(h)), h.bounds, np.bitwise_xor)
                for h in held
            ],
            axis=0,
        )
        made = []
        for pile in np.flatnonzero(counts.sum(axis=0)).tolist():
            parts = [
                h.table.slice(int(b[pile]), int(n[pile]))
                for h, b, n in zip(held, bounds, counts)
                if n[pile]
            ]
            part = pa.concat_tables(parts) if len(parts) > 1 else parts[0]
            records = int(counts[:, pile].sum())
            fingerprint = Fingerprint(
                records, int(payloads[pile]), int(sums[pile]), int(xors[pile])
            )
            made.append((pile, part, (records, part.nbytes, fingerprint)))
        return made
    finally:
        if done is not None:
            done()


def _hashes(held: Held) -> np.ndarray:
    return held.table.column(HASH_COLUMN).to_numpy()


def _per_pile(prefix: np.ndarray, bounds: np.ndarray, minus=np.subtract) -> np.ndarray:
    """Each pile's total from the ``prefix`` sums (or xors, ``minus`` their inverse) of one chunk's
    rows in pile order, whose pile p is rows ``bounds[p]:bounds[p+1]``."""
    with np.errstate(over="ignore"):
        prefix = np.concatenate([np.zeros(1, dtype=prefix.dtype), prefix])
        return minus(prefix[bounds[1:]], prefix[bounds[:-1]])


def segments_of(sliced) -> list:
    """``sliced``'s segments with each pile's records
    as one record batch (what a run on disk holds)."""
    return [(pile, one_record_batch(part), facts) for pile, part, facts in sliced]


def one_record_batch(part) -> pa.RecordBatch:
    """``part`` (a record batch, or a table of any chunks) as one record batch."""
    if isinstance(part, pa.RecordBatch):
        return part
    combined = part.combine_chunks()
    return (
        combined.to_batches()[0]
        if combined.num_rows
        else pa.RecordBatch.from_pylist([], schema=part.schema)
    )


def _window_segments(window: pa.Table, piles: np.ndarray, lengths: np.ndarray, group: int = 1):
    """The segments of a gathered window (``_gather``),
    one per pile or group of piles (``segments``)."""
    batch = window.to_batches()[0] if window.num_rows else None
    firsts = np.concatenate([[0], np.flatnonzero(np.diff(piles)) + 1])
    counts = np.diff(np.append(firsts, len(piles)))
    hashes = window.column(HASH_COLUMN).to_numpy()
    with np.errstate(over="ignore"):
        sums = np.add.reduceat(hashes, firsts)
    xors, payloads = np.bitwise_xor.reduceat(hashes, firsts), np.add.reduceat(lengths, firsts)
    if group > 1:
        yield from _group_segments(
            batch, piles[firsts], firsts, counts, payloads, sums, xors, group
        )
        return
    for pile, first, count, total, xor, payload in zip(
        piles[firsts].tolist(),
        firsts.tolist(),
        counts.tolist(),
        sums.tolist(),
        xors.tolist(),
        payloads.tolist(),
    ):
        part = batch.slice(first, count)
        yield pile, part, (count, part.nbytes, Fingerprint(count, payload, total, xor))


def _group_segments(batch, piles, firsts, counts, payloads, sums, xors, group: int):
    """``(pile // group, record batch, GroupSegment.piles)`` of a window's
    piles (first rows ``firsts`` of ``batch``), one segment a group."""
    keys = piles // group
    starts = np.concatenate([[0], np.flatnonzero(np.diff(keys)) + 1, [len(piles)]])
    # a pile's Arrow bytes: its payload and its share of the window's per-row bytes beside payloads
    # (one nbytes per window; a slice's own nbytes cost 16 us a pile, 3 s of 1 GB in 4,096 piles)
    per_row = max(0.0, (batch.nbytes - float(payloads.sum())) / max(1, batch.num_rows))
    nbytes = payloads + np.rint(counts * per_row).astype(np.int64)
    facts = np.column_stack(
        [
            np.asarray(c).astype(np.uint64)
            for c in (piles, firsts, counts, nbytes, payloads, sums, xors)
        ]
    )
    for a, b in zip(starts[:-1].tolist(), starts[1:].tolist()):
        first, last = int(firsts[a]), int(firsts[b - 1] + counts[b - 1])
        rows = facts[a:b].copy()
        rows[:, 1] -= np.uint64(first)
        yield int(keys[a]), batch.slice(first, last - first), rows
