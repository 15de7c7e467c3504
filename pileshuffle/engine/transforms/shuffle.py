"""ShuffleToPiles: pass 1, GroupByKey, and the pass-2 order of each pile.

Pass 1 (``pass_one``) gives every record its key U and its pile; GroupByKey gathers each pile's
fragments; ``_MakePile`` makes them a ``Pile`` (``engine/pile``), which puts the records in
order by U: the whole output is the input sorted by U, a uniform permutation.
"""

import uuid

import apache_beam as beam

from pileshuffle.engine.pile import DEFAULT_MAX_PILE_BYTES, MAX_SPLIT_WAYS, Pile
from pileshuffle.engine.pile_groups import PileGroup
from pileshuffle.engine.runs import run_bytes_for
from pileshuffle.engine.transforms.pass_one import AssignPiles
from pileshuffle.engine.tuning import prepare_worker
from pileshuffle.io import storage

__all__ = [
    "DEFAULT_MAX_PILE_BYTES",
    "MAX_SPLIT_WAYS",
    "Pile",
    "GroupIntoPiles",
    "UnsupportedRunnerError",
    "ShuffleToPiles",
]


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
