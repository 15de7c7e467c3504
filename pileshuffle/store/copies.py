"""Exact deduplication in a pile store: each row that repeats an earlier live row, recorded beside
its data file; no data file is rewritten.

A store created with ``run --layout store --dedup exact`` (or ``--dedup_key FIELD``) keys every
record of every generation by its content (``dedup.Dedup.keys``, the store's seed), so all copies
of a record meet in one pile under one key U, whatever generation they came in. The live window
holds each distinct record once: its **oldest live copy** (the first in the canonical order:
generation, writer, place), as ``run --dedup`` keeps the first in input order.

When generation g is written, each of its rows gets ``earlier``: the newest generation (up to g
itself) that holds an earlier copy of it, or -1 (none). Copies are found by key, then compared by
their values (bytes, or the field's value), never by a hash alone (``content_groups``). A row
is hidden while generation ``earlier`` is live. Generations are expired oldest first, so when the
last earlier copy expires the row takes its place, with no work and no rewrite; an append only adds
later copies, so it never hides a row that was visible.

On disk: ``pileshuffle.io.copy_marks`` (a copies file beside each data file that has copies, and the
manifest's ``copies`` entry).

Cost: writing generation g reads, pile by pile, its own files twice (keys, then records) and the
older live generations' files of that pile once, keeping only rows whose key ties. Memory: one
batch and the distinct contents whose key repeats (``_Seen``): a record repeated a million times is
one entry.
"""

import collections
import dataclasses
import functools

import apache_beam as beam
import numpy as np
import pyarrow as pa

from pileshuffle import names
from pileshuffle.engine.duplicates import content_groups
from pileshuffle.engine.fragments import Fragment, read_batches
from pileshuffle.engine.tuning import prepare_worker
from pileshuffle.io import storage
from pileshuffle.io.copy_marks import NONE, copies_name, encode_copies
from pileshuffle.names import HASH_COLUMN, KEY_COLUMN
from pileshuffle.records.fingerprint import Fingerprint
from pileshuffle.store import layout

__all__ = ["earlier_copies", "write_copies", "generation_dedup", "MarkEarlierCopies"]


def earlier_copies(dedup, generation: int, files: list, older) -> list:
    """``earlier`` of every row of ``files`` (generation ``generation``'s files of one pile, in
    writer order: each a callable that yields its record batches), one int32 array per file;
    ``older``: ``(generation, batches)`` of the older live generations' files of the pile, in
    canonical order (batches: records with key and hash columns).

    Streamed: memory holds one batch and the distinct contents whose key repeats (``_Seen``), so a
    record repeated a million times is one entry, never loaded whole."""
    keys = [
        np.concatenate(
            [b.column(KEY_COLUMN).to_numpy() for b in batches()] or [np.zeros(0, np.uint64)]
        )
        for batches in files
    ]
    if not sum(map(len, keys)):
        return [np.zeros(0, np.int32) for _ in keys]
    wanted, counts = np.unique(np.concatenate(keys), return_counts=True)
    repeated = wanted[counts > 1]  # keys more than one new row has
    seen = _Seen(dedup)
    for number, batches in older:
        for batch in batches:
            tied = _among(batch.column(KEY_COLUMN).to_numpy(), wanted)
            if tied.any():
                seen.mark(batch.filter(pa.array(tied)), number)
    repeated = np.union1d(repeated, seen.keys)
    marked = []
    for batches in files:
        parts = []
        for batch in batches():
            earlier = np.full(batch.num_rows, NONE, np.int32)
            tied = (
                np.flatnonzero(_among(batch.column(KEY_COLUMN).to_numpy(), repeated))
                if len(repeated)
                else []
            )
            if len(tied):
                earlier[tied] = seen.mark(batch.take(pa.array(tied)), generation)
            parts.append(earlier)
        marked.append(np.concatenate(parts) if parts else np.zeros(0, np.int32))
    return marked


class _Seen:
    """The distinct contents met so far (in canonical order) whose key repeats: each one's key, its
    value (``dedup.values``) and the newest generation holding a copy of it."""

    def __init__(self, dedup):
        self._dedup = dedup
        self.keys, self._generations, self._values = (
            np.zeros(0, np.uint64),
            np.zeros(0, np.int32),
            None,
        )

    def mark(self, batch, generation: int) -> np.ndarray:
        """``earlier`` of each row of ``batch`` (records of generation ``generation``,
        next in canonical order), which then count as met."""
        table = pa.Table.from_batches([batch]) if isinstance(batch, pa.RecordBatch) else batch
        keys = table.column(KEY_COLUMN).to_numpy()
        values = self._dedup.values(table.drop_columns([KEY_COLUMN, HASH_COLUMN]), "a pile")
        # met contents that share a key with the batch
        held = np.flatnonzero(np.isin(self.keys, keys))
        both = (
            values
            if not len(held)
            else pa.concat_tables([self._values.take(held), values], promote_options="permissive")
        )
        groups = content_groups(both, np.concatenate([self.keys[held], keys]))
        generations = np.concatenate(
            [self._generations[held], np.full(len(keys), generation, np.int32)]
        )
        order = np.argsort(groups, kind="stable")  # each group's rows together, met ones first
        follows = np.concatenate(([False], groups[order][1:] == groups[order][:-1]))
        earlier = np.empty(len(order), np.int32)
        earlier[order] = np.where(follows, np.roll(generations[order], 1), NONE)
        earlier = earlier[len(held) :]
        self._generations[held[np.isin(groups[: len(held)], groups[len(held) :])]] = generation
        fresh = np.flatnonzero(earlier == NONE)  # the first row of a content not met before
        self.keys = np.concatenate([self.keys, keys[fresh]])
        self._generations = np.concatenate(
            [self._generations, np.full(len(fresh), generation, np.int32)]
        )
        taken = values.take(pa.array(fresh))
        self._values = (
            taken
            if self._values is None
            else pa.concat_tables([self._values, taken], promote_options="permissive")
        )
        return earlier


def _among(values: np.ndarray, ascending: np.ndarray) -> np.ndarray:
    """Whether each of ``values`` is in ``ascending`` (sorted, not empty): a binary search each, no
    sort of ``values`` (``np.isin`` sorts both every call)."""
    at = np.minimum(np.searchsorted(ascending, values), len(ascending) - 1)
    return ascending[at] == values


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
    return {
        **dedup.options(),
        "rows": rows,
        "distinct_new": rows - sum(earlier.values()),
        "copies_within": earlier.pop(generation, 0),
        "copies_of_earlier": {str(g): earlier[g] for g in sorted(earlier)},
    }


class MarkEarlierCopies(beam.DoFn):
    """``(pile, [StoreFile, ...])`` of the generation being written -> the same files, each
    with its ``copies`` entry (and copies file) when some of its rows repeat an earlier live
    row; under pile ``None``, what else the generation's writers emitted, passed on."""

    def __init__(self, prefix: str, generation: int, dedup, base_version: int):
        self._prefix, self._store = prefix, names.store_dir(prefix)
        self._generation, self._dedup, self._base_version = generation, dedup, base_version
        self._older = None  # pile -> [(generation, store-relative path), ...] in canonical order

    def setup(self):
        """The older live files of each pile, from the base version's manifest (read here, not
        carried in the pipeline: a window lists generations x writers x piles files)."""
        prepare_worker()
        manifest = (
            layout.read_store_manifest(self._prefix, self._base_version)
            if self._base_version
            else None
        )
        self._older = {}
        for live in (manifest or {}).get("generations", []):
            for entry in sorted(live["files"], key=lambda f: f["writer"]):
                self._older.setdefault(entry["pile"], []).append(
                    (live["generation"], entry["path"])
                )

    def process(self, element):
        pile, files = element
        if pile is None:
            yield from files
            return
        files = sorted(files, key=lambda f: f.writer)
        batches = [functools.partial(_batches, layout.join(self._store, f.path)) for f in files]
        older = (
            (g, _batches(layout.join(self._store, path))) for g, path in self._older.get(pile, ())
        )
        for stored, earlier in zip(
            files, earlier_copies(self._dedup, self._generation, batches, older)
        ):
            yield dataclasses.replace(
                stored, copies=write_copies(self._store, stored.path, earlier)
            )


def _batches(path: str):
    return read_batches(Fragment((0,), 0, 0, Fingerprint(), path=path))
