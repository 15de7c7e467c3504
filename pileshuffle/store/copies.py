"""Exact deduplication in a pile store: each row that repeats an earlier live row, recorded beside
its data file; no data file is rewritten.

A store created with ``run --layout store --dedup exact`` (or ``--dedup_key FIELD``) keys every
record of every generation by its content (``dedup.Dedup.keys``, the store's seed), so all copies
of a record meet in one pile under one key U, whatever generation they came in. The live window
holds each distinct record once: its **oldest live copy** (the first in the canonical order:
generation, writer, place), as ``run --dedup`` keeps the first in input order.

When generation g is written, each of its rows gets ``earlier``: the newest generation (up to g
itself) that holds an earlier copy of it, or -1 (none). Copies are found by key, then compared by
their values (bytes, or the field's value), never by a hash alone (``dedup.content_groups``). A row
is hidden while generation ``earlier`` is live. Generations are expired oldest first, so when the
last earlier copy expires the row takes its place, with no work and no rewrite; an append only adds
later copies, so it never hides a row that was visible.

On disk: ``pileshuffle.copy_marks`` (a copies file beside each data file that has copies, and the
manifest's ``copies`` entry).

Cost: writing generation g reads its own files of each pile and the older live generations' files
of that pile, keeping of those only the rows whose key ties (memory: one pile of g, one older file,
the tied rows).
"""

import collections
import dataclasses

import apache_beam as beam
import numpy as np
import pyarrow as pa

from pileshuffle import storage
from pileshuffle.copy_marks import NONE, copies_name, encode_copies
from pileshuffle.dedup import content_groups
from pileshuffle.fingerprint import Fingerprint
from pileshuffle.fragments import Fragment, read_table
from pileshuffle.names import HASH_COLUMN, KEY_COLUMN
from pileshuffle.store import layout
from pileshuffle.tuning import prepare_worker

__all__ = ["earlier_copies", "write_copies", "generation_dedup", "MarkEarlierCopies"]


def earlier_copies(dedup, generation: int, tables: list, older) -> list:
    """``earlier`` of every row of ``tables`` (generation ``generation``'s files of one pile, in
    writer order), one int32 array per table; ``older``: ``(generation, table)`` of the older live
    generations' files of the pile, in canonical order (tables: records with key and hash columns)."""
    sizes = [t.num_rows for t in tables]
    if not sum(sizes):
        return [np.zeros(0, np.int32) for _ in tables]
    wanted = np.unique(np.concatenate([t.column(KEY_COLUMN).to_numpy() for t in tables]))
    parts, generations = [], []
    for number, table in older:
        tied = np.isin(table.column(KEY_COLUMN).to_numpy(), wanted)
        if tied.any():
            parts.append(table.filter(pa.array(tied)))
            generations.append(np.full(int(tied.sum()), number, np.int32))
    parts += tables
    generations += [np.full(n, generation, np.int32) for n in sizes]
    table = pa.concat_tables(parts, promote_options="permissive")
    groups = content_groups(dedup.values(table.drop_columns([KEY_COLUMN, HASH_COLUMN]), "a pile"),
                            table.column(KEY_COLUMN).to_numpy())
    of_row = np.concatenate(generations)
    order = np.argsort(groups, kind="stable")  # each group's rows together, in canonical order
    follows = np.concatenate(([False], groups[order][1:] == groups[order][:-1]))
    earlier = np.empty(len(order), np.int32)
    earlier[order] = np.where(follows, np.roll(of_row[order], 1), NONE)
    mine = earlier[len(earlier) - sum(sizes):]
    return np.split(mine, np.cumsum(sizes)[:-1])


def write_copies(store: str, data_relative: str, earlier: np.ndarray):
    """Write the copies file of one data file (when any of its rows has an earlier copy) and return
    its manifest entry, or None."""
    if not np.any(earlier != NONE):
        return None
    data, entry = encode_copies(copies_name(data_relative), earlier)
    storage.write_whole(layout.join(store, entry["path"]), data)
    return entry


def generation_dedup(dedup, generation: int, files: list) -> dict:
    """A generation's ``dedup`` section: its rows, the first copies among them, and the later copies
    (of a row in this generation, or in each earlier one)."""
    earlier = collections.Counter()
    for entry in files:
        for number, rows in ((entry.get("copies") or {}).get("earlier") or {}).items():
            earlier[int(number)] += rows
    rows = sum(f["records"] for f in files)
    return {**dedup.options(), "rows": rows, "distinct_new": rows - sum(earlier.values()),
            "copies_within": earlier.pop(generation, 0),
            "copies_of_earlier": {str(g): earlier[g] for g in sorted(earlier)}}


class MarkEarlierCopies(beam.DoFn):
    """``(pile, [_StoreFile, ...])`` of the generation being written -> the same files, each with its
    ``copies`` entry (and copies file) when some of its rows repeat an earlier live row; under pile
    ``None``, what else the generation's writers emitted, passed on."""

    def __init__(self, store: str, generation: int, dedup, older_files: dict):
        self._store, self._generation, self._dedup = store, generation, dedup
        self._older = older_files  # pile -> [(generation, store-relative path), ...] in canonical order

    def setup(self):
        prepare_worker()

    def process(self, element):
        pile, files = element
        if pile is None:
            yield from files
            return
        files = sorted(files, key=lambda f: f.writer)
        tables = [_read(layout.join(self._store, f.path)) for f in files]
        older = ((g, _read(layout.join(self._store, path))) for g, path in self._older.get(pile, ()))
        for stored, earlier in zip(files, earlier_copies(self._dedup, self._generation, tables, older)):
            yield dataclasses.replace(stored, copies=write_copies(self._store, stored.path, earlier))


def _read(path: str) -> pa.Table:
    return read_table(Fragment((0,), 0, 0, Fingerprint(), path=path))
