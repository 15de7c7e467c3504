"""ShuffleToPiles: pass 1, GroupByKey, and the pass-2 order of each pile.

A pile's records are put in order by their key U (stable over the canonical fragment
order). Every key of a pile shares the same top digits, so this sorts on the rest of
U: the whole output is the input sorted by U, a uniform permutation.

A pile larger than ``max_pile_bytes`` is never loaded whole: it is split again on the
next digits of U (``U * M mod 2**64``) into sub-piles written as fragments, and the
sub-piles are ordered one after another; the order is the same as without the split.
"""

import dataclasses
import math
import uuid

import apache_beam as beam
import numpy as np
import pyarrow as pa

from pileshuffle.engine.duplicates import distinct_in_order, stream_distinct
from pileshuffle.engine.fragments import Fragment, FragmentFiles, read_batches
from pileshuffle.engine.runs import run_bytes_for
from pileshuffle.engine.transforms.pass_one import AssignPiles
from pileshuffle.engine.transforms.pile_groups import PileGroup, in_key_order
from pileshuffle.engine.tuning import prepare_worker
from pileshuffle.formats import record_lengths
from pileshuffle.formats.base import parts_by_pile
from pileshuffle.io import storage
from pileshuffle.names import HASH_COLUMN, KEY_COLUMN, split_writer_name
from pileshuffle.records import keys as keymath
from pileshuffle.records.fingerprint import Fingerprint, total

__all__ = [
    "DEFAULT_MAX_PILE_BYTES",
    "MAX_SPLIT_WAYS",
    "Pile",
    "GroupIntoPiles",
    "UnsupportedRunnerError",
    "ShuffleToPiles",
]

# the most of one pile pass 2 holds in memory; a larger pile is split (files mode)
DEFAULT_MAX_PILE_BYTES = 64 << 20
_OUTPUT_SLICE_BYTES = 8 << 20  # about this many bytes per ordered table a pile yields
# splits of splits stop here: records that share one key cannot be split apart
_MAX_SPLIT_DEPTH = 16
MAX_SPLIT_WAYS = 1024  # larger sub-piles are split again


def _next_digits(keys: np.ndarray, num_piles: int) -> np.ndarray:
    """The digits of U after its top base-``num_piles`` digit: ``U * M mod 2**64``."""
    with np.errstate(over="ignore"):
        return keys * np.uint64(num_piles)


@dataclasses.dataclass(frozen=True)
class Pile:
    """One pile: its fragments in canonical order, and how to put its records in order.

    ``tables()`` yields the pile's records in their final order as Arrow tables, holding at
    most one pile (or one sub-pile of a split pile) in memory. ``depth`` counts splits.
    """

    index: int
    num_piles: int
    fragments: tuple
    max_pile_bytes: int = DEFAULT_MAX_PILE_BYTES
    work_dir: str = None
    depth: int = 0
    # a dedup.Dedup: records with equal content keep only the first (pileshuffle.engine.dedup)
    dedup: object = None
    single_key: bool = False  # every record has one key: under dedup, streamed (never loaded whole)

    @property
    def records(self) -> int:
        return sum(f.records for f in self.fragments)

    @property
    def nbytes(self) -> int:
        return sum(f.nbytes for f in self.fragments)

    @property
    def fingerprint(self):
        """What pass 1 put into this pile."""
        return total(f.fingerprint for f in self.fragments)

    @property
    def needs_split(self) -> bool:
        """Larger than ``max_pile_bytes`` and splittable. The depth bound stops endless
        splitting of records that share one key (keyed composed use with duplicate ids):
        such a sub-pile is loaded whole instead."""
        return (
            self.nbytes > self.max_pile_bytes
            and self.work_dir is not None
            and self.records > 1
            and self.depth < _MAX_SPLIT_DEPTH
        )

    def tables(self):
        """Yield the records in final order, as the user's columns only."""
        for table in self.ordered():
            yield table.drop_columns([HASH_COLUMN])

    def ordered(self, dropped=None):
        """Yield the records in final order, each with its pass-1 hash (``HASH_COLUMN``). Under
        ``dedup`` only the first of each content; ``dropped`` (a ``duplicates.Dropped``) counts the
        rest."""
        if self.dedup is not None and self.single_key:
            batches = (
                pa.Table.from_batches([b]).drop_columns([KEY_COLUMN])
                for f in self.fragments
                for b in read_batches(f)
            )
            yield from stream_distinct(batches, _records_of, self.dedup, dropped)
            return
        if self.needs_split:
            for sub_pile in self.split():
                yield from sub_pile.ordered(dropped)
            return
        if not self.fragments:
            return
        records, keys, order = in_key_order(self.fragments)
        # (Table.nbytes: 0.1 ms a pile)
        step = max(1, int(_OUTPUT_SLICE_BYTES * len(order) / max(1, self.nbytes)))
        # a take from parts joins them anew every time: join once
        if self.dedup is not None or step < len(order):
            records = records.combine_chunks()
        if self.dedup is not None:
            user, hashes, lengths = _records_of(records)
            order = order[
                distinct_in_order(
                    user, order, keys[order], hashes[order], lengths[order], self.dedup, dropped
                )
            ]
        for start in range(0, len(order), step):
            yield records.take(order[start : start + step])

    def split(self):
        """The sub-piles of this pile, in order: fragments re-keyed on the next digits of U."""
        # one open file each
        ways = min(MAX_SPLIT_WAYS, max(2, math.ceil(self.nbytes / self.max_pile_bytes) * 2))
        split_dir = storage.join(self.work_dir, "splits")
        files = FragmentFiles(
            split_dir, split_writer_name(uuid.uuid4().hex[:12], self.depth, self.index)
        )
        # sub-pile -> (lowest, highest) key: one key alone is one record repeated, under dedup
        key_range = {}
        for fragment in self.fragments:
            for batch in read_batches(fragment):
                digits = _next_digits(batch.column(KEY_COLUMN).to_numpy(), self.num_piles)
                table = pa.Table.from_batches([batch]).set_column(
                    batch.schema.get_field_index(KEY_COLUMN),
                    KEY_COLUMN,
                    pa.array(digits, type=pa.uint64()),
                )
                for sub, part, rows in parts_by_pile(table, keymath.pile_of(digits, ways), ways):
                    files.append(sub, part, Fingerprint())
                    low, high = key_range.get(sub, (digits[rows[0]], digits[rows[0]]))
                    key_range[sub] = (min(low, digits[rows].min()), max(high, digits[rows].max()))
        for sub in files.commit():
            fragment = Fragment((0,), sub.records, sub.nbytes, Fingerprint(), path=sub.path)
            low, high = key_range[sub.pile]
            yield Pile(
                sub.pile,
                ways,
                (fragment,),
                self.max_pile_bytes,
                self.work_dir,
                self.depth + 1,
                self.dedup,
                bool(low == high),
            )

    def split_count(self) -> int:
        return 1 if self.needs_split else 0


def _records_of(table: pa.Table) -> tuple:
    """``(records, hashes, lengths)`` of a table of records with their ``HASH_COLUMN``."""
    records = table.drop_columns([HASH_COLUMN])
    return records, table.column(HASH_COLUMN).to_numpy(), record_lengths(records)


class _MakePile(beam.DoFn):
    """Pass 2 entry: ``(pile, fragments)`` from GroupByKey -> a ``Pile`` in canonical order; with
    ``group`` > 1, ``(group, GroupSegments)`` -> a ``PileGroup`` of such piles, their parts the
    segments' views."""

    def __init__(self, num_piles, max_pile_bytes, work_dir, dedup=None, group=1):
        self._num_piles, self._max_pile_bytes, self._work_dir = num_piles, max_pile_bytes, work_dir
        self._dedup, self._group = dedup, group

    def setup(self):
        prepare_worker()

    def process(self, element):
        key, values = element
        if self._group == 1:
            yield self._pile(key, values)
            return
        segments, by_pile = sorted(values, key=lambda s: s.fragment.order), {}
        for segment in segments:
            for pile, view in segment.views():
                by_pile.setdefault(pile, []).append(view)
        yield PileGroup(
            tuple(self._pile(pile, by_pile[pile]) for pile in sorted(by_pile)),
            tuple(s.fragment for s in segments),
        )

    def _pile(self, pile, fragments):
        ordered = tuple(sorted(fragments, key=lambda f: f.order))
        return Pile(
            pile, self._num_piles, ordered, self._max_pile_bytes, self._work_dir, dedup=self._dedup
        )


class GroupIntoPiles(beam.PTransform):
    """``(pile, Fragment)`` -> ``Pile``: the GroupByKey between the two passes (``dedup``: the
    piles' ``Dedup``). With ``group`` > 1 (the template's small piles, ``pile_groups``): ``(group,
    GroupSegment)`` -> ``PileGroup`` of up to ``group`` piles."""

    def __init__(
        self, num_piles, max_pile_bytes=DEFAULT_MAX_PILE_BYTES, work_dir=None, dedup=None, group=1
    ):
        super().__init__()
        self._num_piles, self._max_pile_bytes, self._work_dir = num_piles, max_pile_bytes, work_dir
        self._dedup, self._group = dedup, group

    def expand(self, fragments):
        return (
            fragments
            | "GroupByPile" >> beam.GroupByKey()
            | "MakePile"
            >> beam.ParDo(
                _MakePile(
                    self._num_piles, self._max_pile_bytes, self._work_dir, self._dedup, self._group
                )
            )
        )


class UnsupportedRunnerError(ValueError):
    """``ShuffleToPiles`` was applied in a pipeline whose runner would lose records."""


def _refuse_runners_that_drop_finish_bundle_output(pipeline):
    """Pass 1 batches a bundle's records and emits the last batch (and, in files mode, the
    names of the bundle's fragments) from ``finish_bundle``. Beam's DaskRunner silently
    drops everything emitted there, so on Dask records would vanish without an error:
    refuse at construction time instead. (The template pipeline reads files itself, emits
    only from ``process`` and runs on Dask.)"""
    runner = getattr(pipeline, "runner", None)
    if runner is not None and any(cls.__name__ == "DaskRunner" for cls in type(runner).__mro__):
        raise UnsupportedRunnerError(
            "ShuffleToPiles cannot run on Beam's DaskRunner: the DaskRunner drops the outputs of "
            "DoFn.finish_bundle, where pass 1 flushes each bundle's last batch, so records would "
            "be lost silently. Shuffle files with the template pipeline instead (pileshuffle run "
            "--runner=DaskRunner --dask_client_address=...), or run this pipeline on another "
            "runner."
        )


class ShuffleToPiles(beam.PTransform):
    """Globally shuffle a PCollection into ``num_piles`` piles; returns ``Pile`` elements.

    Elements are ``bytes`` records, or ``pyarrow.RecordBatch``/``Table`` rows (for Parquet). With
    ``keyed=True`` elements are ``(id, record)`` pairs and the order is a pure function of ``(seed,
    ids)``: reproducible on any runner. Unkeyed, the order is uniform but differs between runs
    (records have no stable identity to key on). With ``dedup`` (a
    ``pileshuffle.engine.dedup.Dedup``: ``Dedup()`` whole records, ``Dedup(field)`` one field's
    value) a record's key is a seeded hash of its content, reproducible without ids: the piles hold
    each distinct record once, the first of its group (``pileshuffle.engine.dedup``).

    ``temp_location`` selects the ``files`` intermediate mode: pass 1 writes runs there
    (``pileshuffle.engine.runs``) and only byte ranges go through GroupByKey (memory: one pile per
    worker). Without it (``shuffle`` mode) records go through GroupByKey in per-pile parts.
    Either way a bundle's parts are gathered into runs of ``run_bytes`` (default
    ``runs.auto_run_bytes``; beyond 1 GiB spilled to local disk and merged) before they leave
    it, so parts stay large at any pile count.
    Write the result with ``WritePiles``, which also removes the fragments.

    Not on Beam's DaskRunner (it drops ``finish_bundle`` outputs, where pass 1 flushes):
    applying it there raises ``UnsupportedRunnerError``.
    """

    def __init__(
        self,
        num_piles,
        seed=0,
        keyed=False,
        temp_location=None,
        max_pile_bytes=DEFAULT_MAX_PILE_BYTES,
        run_bytes=None,
        dedup=None,
    ):
        super().__init__()
        if int(num_piles) < 1:
            raise ValueError(f"num_piles must be at least 1, got {num_piles}")
        self.num_piles, self.seed, self.keyed, self.dedup = int(num_piles), int(seed), keyed, dedup
        self.max_pile_bytes = int(max_pile_bytes)
        self.work_dir = (
            storage.join(temp_location, f"pileshuffle-{uuid.uuid4().hex[:12]}")
            if temp_location
            else None
        )
        self.run_bytes = run_bytes_for(
            run_bytes, self.num_piles, bool(temp_location) and storage.is_remote(temp_location)
        )

    def expand(self, records):
        _refuse_runners_that_drop_finish_bundle_output(records.pipeline)
        fragments_dir = storage.join(self.work_dir, "fragments") if self.work_dir else None
        return (
            records
            | "AssignPiles"
            >> beam.ParDo(
                AssignPiles(
                    self.seed,
                    self.num_piles,
                    self.keyed,
                    fragments_dir,
                    run_bytes=self.run_bytes,
                    dedup=self.dedup,
                )
            )
            | "GroupIntoPiles"
            >> GroupIntoPiles(self.num_piles, self.max_pile_bytes, self.work_dir, self.dedup)
        )
