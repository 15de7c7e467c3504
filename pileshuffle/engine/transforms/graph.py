"""The template's graph: listed source groups -> pass 1
(ReadSourceToPiles) -> GroupIntoPiles -> WritePiles, and a prepared plan run through it
(``run_graph``)."""

import time

import apache_beam as beam

from pileshuffle.engine import progress
from pileshuffle.engine.balance import manifest_options
from pileshuffle.engine.fragments import Fragment, GroupSegment
from pileshuffle.engine.output_files import discard_unpublished, read_manifest, remove_tree
from pileshuffle.engine.pile_groups import template_group
from pileshuffle.engine.runner import execute, shows_progress
from pileshuffle.engine.sources import SourceStats
from pileshuffle.engine.transforms.pass_one import STATS_TAG, CountClasses, ReadSourceToPiles
from pileshuffle.engine.transforms.shuffle import GroupIntoPiles
from pileshuffle.engine.transforms.write import WritePiles
from pileshuffle.errors import OutputError, user_message
from pileshuffle.io import storage
from pileshuffle.names import CLASS_CODES_DIR

__all__ = ["run_graph", "build", "counted_classes", "manifest_fields"]


def run_graph(plan, started: float, wait=None, lock_token: str = None, quiet=False):
    """Run a prepared plan under the output's lock: the template's graph (``build``) on the
    runner ``plan.options`` name (``runner.execute``, with progress unless ``quiet``), then its
    manifest with this run's time and what ``--input`` matched but the run did not read; Beam's
    result instead when the run is not waited for. A failure removes the work folder and what
    the publication left; out of space, it says what the run needs where."""
    showing = progress.showing(
        len(plan.sources),
        plan.input_bytes,
        plan.num_piles,
        enabled=not quiet and shows_progress(plan.options),
    )

    def failed(error):
        remove_tree(plan.work_dir)
        discard_unpublished(plan.output)
        message = user_message(error)
        if message and "No space left" in message:
            return OutputError(f"{message}; {plan.space_note}")
        return None

    def graph(pipeline):
        return build(pipeline, plan, started, lock_token)

    result = execute(plan.options, graph, len(plan.source_groups), failed, wait, showing)
    if result is not None:
        return result
    manifest = read_manifest(plan.output)
    manifest["wall_seconds"] = time.time() - started
    manifest["inputs_left_out"] = plan.left_out
    manifest["inputs_skipped"] = plan.skipped
    manifest["input_duplicates"] = plan.duplicates
    return manifest


def build(pipeline: beam.Pipeline, plan, started: float, lock_token: str = None):
    """The template's graph: one leaf (Finalize), so runners that run only the last
    leaf (Dask) still run all of it. ``lock_token``: Finalize releases the output's lock
    (``planning.locations.taken_output``) after publishing: a job that outlives its launcher
    holds it."""
    sources = (
        (
            pipeline
            | "ListSources" >> beam.Create(plan.sources)
            | "SpreadSources" >> beam.Reshuffle()
        )
        if plan.balance is not None
        else None
    )
    groups = (
        pipeline
        | "ListSourceGroups" >> beam.Create(plan.source_groups)
        | "SpreadSourceGroups" >> beam.Reshuffle()
    )
    piles_per_group = template_group(plan)
    fragments, stats = _pass_one(groups, sources, plan, piles_per_group)
    return (
        fragments
        | "GroupIntoPiles"
        >> GroupIntoPiles(
            plan.num_piles, plan.max_pile_bytes, plan.work_dir, plan.dedup, piles_per_group
        )
        | "WritePiles"
        >> WritePiles(
            plan.output,
            plan.format,
            plan.compression,
            num_piles=plan.num_piles,
            overwrite=plan.replace_existing,
            schema=plan.schema,
            expected=stats,
            manifest_fields=manifest_fields(plan),
            started=started,
            release_lock=lock_token,
        )
    )


def _pass_one(groups, sources, plan, piles_per_group: int) -> tuple:
    """``(fragments, stats)``: pass 1 over the source groups ``groups`` (``ReadSourceToPiles``,
    under ``--balance`` with the classes counted over ``sources``), its main output (the piles'
    parts) and its side output (each source's ``SourceStats``), each holding only its own type."""
    fragments_dir = (
        storage.join(plan.work_dir, "fragments") if plan.intermediate == "files" else None
    )
    # --balance: labels from the counting pass to pass 1
    codes_dir = storage.join(plan.work_dir, CLASS_CODES_DIR)
    pass1 = groups | "ReadSourceToPiles" >> beam.ParDo(
        ReadSourceToPiles(
            plan.format,
            plan.seed,
            plan.num_piles,
            fragments_dir,
            skip_corrupt=plan.skip_corrupt,
            label=plan.label,
            keep_unlabeled=plan.keep_unlabeled,
            codes_dir=codes_dir,
            policy=plan.balance,
            run_bytes=plan.run_bytes,
            memory_for_runs=plan.memory_for_runs,
            dedup=plan.dedup,
            group=piles_per_group,
            records_per_process=_records_per_process(plan),
        ),
        **_class_counts(sources, plan, codes_dir),
    ).with_outputs(STATS_TAG, main="fragments")
    # Beam's DaskRunner hands every output of a multi-output ParDo to each consumer (it
    # does not separate tags), so each branch keeps only its own type; elsewhere a no-op.
    fragments = pass1.fragments | "OnlyFragments" >> beam.Filter(_is_fragment_element)
    stats = pass1[STATS_TAG] | "OnlyStats" >> beam.Filter(_is_source_stats)
    return fragments, stats


def _class_counts(sources, plan, codes_dir) -> dict:
    """Under ``--balance``, pass 1's side input ``counts`` (``counted_classes``)."""
    if plan.balance is None:
        return {}
    return counted_classes(
        sources, plan.format, plan.label, plan.skip_corrupt, plan.keep_unlabeled, codes_dir
    )


def counted_classes(
    sources,
    format_name: str,
    label: str,
    skip_corrupt: bool = False,
    keep_unlabeled: bool = False,
    codes_dir: str = None,
) -> dict:
    """``{"counts": side input}`` for pass 1 over the ``Source`` PCollection ``sources``: a first
    pass counts every source's classes, ``[(source id, {class: count}), ...]``, which pass 1
    turns into each record's copies (``balance.ClassPlanner``; the same for ``run`` and each
    generation of a store). With ``codes_dir`` the first pass keeps each record's class there
    for pass 1 (``CountClasses``)."""
    counts = sources | "CountClasses" >> beam.ParDo(
        CountClasses(
            format_name,
            label,
            skip_corrupt=skip_corrupt,
            keep_unlabeled=keep_unlabeled,
            codes_dir=codes_dir,
        )
    )
    return {"counts": beam.pvalue.AsList(counts)}


def _is_fragment_element(element) -> bool:
    """Whether ``element`` is pass 1's main output:
    a ``(pile, Fragment)`` or ``(group, GroupSegment)`` pair."""
    return (
        isinstance(element, tuple)
        and len(element) == 2
        and isinstance(element[1], (Fragment, GroupSegment))
    )


def _is_source_stats(element) -> bool:
    """Whether ``element`` is pass 1's side output, a source's ``SourceStats``."""
    return isinstance(element, SourceStats)


def manifest_fields(plan) -> dict:
    """What the shard manifest records of the plan: output, seed and the options that shaped it."""
    return {
        "output": plan.output,
        "seed": plan.seed,
        "options": {
            "format": plan.format,
            "compression": plan.compression,
            "num_piles": plan.num_piles,
            "num_piles_reason": plan.num_piles_reason,
            "max_pile_bytes": plan.max_pile_bytes,
            "intermediate": plan.intermediate,
            "skip_corrupt": plan.skip_corrupt,
            **(
                manifest_options(plan.label, plan.balance, plan.keep_unlabeled)
                if plan.balance
                else {}
            ),
            **(plan.dedup.options() if plan.dedup else {}),
        },
    }


def _records_per_process(plan) -> int:
    """The records one worker process of the job reads in pass 1 (0 where the plan cannot see the
    workers): this machine's one process, or a Dataflow job's workers' SDK processes."""
    workers = plan.workers
    if (
        workers is None
        or workers.where == "other"
        or (workers.where == "dataflow" and not workers.workers)
    ):
        return 0
    processes = 1 if workers.where == "local" else workers.workers * workers.processes
    return plan.written_records // processes
