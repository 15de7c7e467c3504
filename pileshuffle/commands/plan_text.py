"""``pileshuffle plan``'s text for a person (``plan_text``): one labelled line per thing a run
with these options finds (files, records, what is left out), makes (piles, runs, shards) and
needs (memory, space, requests, the runner). The numbers are the plan's and the machine form's
(``plan.plan_json``); this module only words them."""

import os

from pileshuffle.commands.plan_modes import modes_lines, size_text
from pileshuffle.engine.inputs import describe_left_out, describe_skipped
from pileshuffle.engine.pile_groups import group_words, template_group
from pileshuffle.engine.runs import SEGMENT_OVERHEAD
from pileshuffle.io.storage import UNCOMPRESSED, compression_of, is_remote
from pileshuffle.names import manifest_path, shard_name, staging_dir, store_dir
from pileshuffle.planning.gcs_requests import gcs_operations
from pileshuffle.planning.job_model import SDK_PROCESS_BYTES as _SDK
from pileshuffle.planning.pile_sizes import pile_sizes
from pileshuffle.planning.plan import LOCAL_BASE_BYTES, PILE_MEMORY_FACTOR, Plan
from pileshuffle.planning.runners import LOCAL_SHUFFLE_HOLD

__all__ = ["plan_text", "runner_description"]


def plan_text(plan: Plan, options) -> str:
    """The plan as a person reads it: what was found, what will be made, what it needs."""
    lines = _found_lines(plan)
    if plan.layout == "store":
        lines += _store_lines(plan, options)
    else:
        lines += _shard_lines(plan, options)
    return "\n".join(f"{label:<14}{text}" for label, text in lines)


def runner_description(options) -> tuple:
    """``(runner, piles in flight per worker or None)``."""
    from apache_beam.options.pipeline_options import DirectOptions, GoogleCloudOptions

    from pileshuffle.engine.runner import is_dask, is_dataflow, is_local_runner, runner_name

    if is_local_runner(options):
        direct = options.view_as(DirectOptions)
        threads = direct.direct_num_workers or os.cpu_count() or 1
        mode = direct.direct_running_mode or "in_memory"
        return f"local: Beam's FnApiRunner on this machine, {threads} worker(s) ({mode})", threads
    if is_dataflow(options):
        region = options.view_as(GoogleCloudOptions).region or "(no --region)"
        return f"Dataflow in {region}: submits the job and returns", None
    if is_dask(options):
        from apache_beam.runners.dask.dask_runner import DaskOptions

        address = options.view_as(DaskOptions).address
        return f"Dask at {address}" if address else "Dask on a local cluster it starts", None
    return str(runner_name(options)), None


def _found_lines(plan: Plan) -> list:
    """``(label, text)`` lines of what the plan found: the input, its records, what ``--balance``
    and ``--dedup`` do to them, and the files matched but not read or to be replaced."""
    lines = _input_lines(plan)
    lines += [
        (name, describe(plan))
        for name, describe, asked in (
            ("balance", _balance_text, plan.balance),
            ("dedup", _dedup_text, plan.dedup),
        )
        if asked is not None
    ]
    return lines + _unread_and_replaced_lines(plan)


def _input_lines(plan: Plan) -> list:
    """``(label, text)`` lines of the input's files and bytes, and of its records: how many, how
    large (from the expansion of a sample when compressed)."""
    compressed = any(compression_of(src.path) != UNCOMPRESSED for src in plan.sources)
    guessed = (
        " (compressed input: from the expansion of a sample)"
        if compressed and plan.format != "parquet"
        else ""
    )
    return [
        (
            "input",
            f"{len(plan.sources):,} {plan.format} file(s), {plan.input_bytes:,} bytes "
            f"({size_text(plan.input_bytes)})",
        ),
        (
            "records",
            f"about {plan.estimated_records:,} of {plan.mean_record_bytes:,.0f} bytes on average"
            f"{guessed}",
        ),
    ]


def _unread_and_replaced_lines(plan: Plan) -> list:
    """``(label, text)`` lines of the files ``--input`` matched but the run does not read (its
    own, not input files, named twice) and of those it replaces (an unfinished run's)."""
    lines = []
    if plan.left_out:
        lines.append(
            (
                "left out",
                f"{len(plan.left_out):,} matched file(s) that pileshuffle wrote: "
                f"{describe_left_out(plan.left_out)}",
            )
        )
    if plan.skipped:
        lines.append(
            (
                "skipped",
                f"{len(plan.skipped):,} matched name(s) that are not input files: "
                f"{describe_skipped(plan.skipped)}",
            )
        )
    if plan.duplicates:
        lines.append(
            (
                "duplicates",
                f"{len(plan.duplicates):,} name(s) of files already matched "
                "(each file is read once)",
            )
        )
    if plan.unpublished:
        lines.append(
            (
                "replaces",
                f"{len(plan.unpublished):,} file(s) an unfinished run was publishing (its journal "
                f"in {staging_dir(plan.output)} lists them)",
            )
        )
    return lines


def _shard_lines(plan: Plan, options) -> list:
    """``(label, text)`` lines of what a shard run makes and needs: piles, memory, space, its
    passes, requests, both modes (``plan_modes``), the output and the runner."""
    sizes = pile_sizes(plan)
    runner, in_flight = runner_description(options)
    pile_bytes = sizes.headroom * sizes.record_bytes
    lines = [
        ("piles", f"{plan.num_piles:,} = output shards ({plan.num_piles_reason})"),
        (
            "pile size",
            f"s = {sizes.expected:,.0f} records expected; plan for s + 6*sqrt(s) = "
            f"{sizes.headroom:,.0f} records, about {size_text(pile_bytes)} (--max_pile_bytes "
            f"{_mib(plan.max_pile_bytes)}{_sized(plan)})",
        ),
        (
            "split again",
            f"chance that some pile exceeds {_mib(plan.max_pile_bytes)} and is split again "
            f"(same order): {_chance(sizes.split_probability)}",
        ),
        ("memory", _memory_text(plan, pile_bytes, in_flight)),
    ]
    lines += _space_lines(plan)
    lines.append(("pass 1", _pass1_text(plan)))
    if plan.intermediate == "shuffle":
        shuffled = plan.held_bytes + plan.run_shape()[1] * SEGMENT_OVERHEAD
        lines.append(
            (
                "shuffle",
                f"about {size_text(shuffled)} through the runner's GroupByKey "
                "(--intermediate=shuffle: the records with their keys and hashes)"
                + _runner_holds(options, shuffled),
            )
        )
    lines.append(("gcs requests", _operations_text(plan)))
    lines += modes_lines(plan, options)
    lines += [
        (
            "output",
            f"{shard_name(plan.output, 0, plan.num_piles, '')}... + "
            f"{manifest_path(plan.output)}, compression {plan.compression}, "
            f"seed {plan.seed}",
        ),
        ("runner", runner),
    ]
    return lines


def _memory_text(plan: Plan, pile_bytes: float, in_flight) -> str:
    """What the passes hold: a pass-1 writer's run, a pass-2 pile (or group) being ordered; on
    this machine times the threads, plus the base, with what ``--memory`` keeps of the runs."""
    group = template_group(plan)
    per_pile = PILE_MEMORY_FACTOR * min(pile_bytes * group, plan.max_pile_bytes)
    held = min(plan.held_per_writer, plan.held_bytes)
    if in_flight:
        peak = max(per_pile, held) * in_flight + LOCAL_BASE_BYTES
        return (
            f"pass 1 holds up to {size_text(held)} per worker thread (--run_bytes), pass 2 about "
            f"{size_text(per_pile)} {group_words(group)} being written; x {in_flight} at a time + "
            f"{size_text(LOCAL_BASE_BYTES)} = {size_text(peak)} peak{_kept_text(plan)}"
        )
    return (
        f"pass 1 holds up to {size_text(held)} per worker thread (--run_bytes), pass 2 about "
        f"{size_text(per_pile)} {group_words(group)} in flight, plus {size_text(_SDK)} per SDK "
        "process (docs/dataflow.md: worker memory)"
    )


def _space_lines(plan: Plan) -> list:
    """``(label, text)`` lines of the space a shard run needs: its temp folder (pass-1 runs) and
    its output (the shards, staged or uploaded), each with the free space found there."""
    lines = []
    staging = staging_dir(plan.output)
    if plan.work_dir in plan.needs:
        kept = " that --memory does not keep" if plan.memory_for_runs else ""
        lines.append(
            (
                "temp space",
                f"about {size_text(plan.needs[plan.work_dir])} at {plan.work_dir} (pass-1 "
                f"runs{kept}, removed at the end){_free(plan, plan.work_dir)}",
            )
        )
    if staging in plan.needs:
        how = (
            "uploaded to their final names; staged and copied when they replace a finished output"
            if is_remote(plan.output)
            else f"staged in {staging}, then renamed"
        )
        lines.append(
            (
                "output space",
                f"about {size_text(plan.needs[staging])} (shards, {how}){_free(plan, staging)}",
            )
        )
    return lines


def _sized(plan: Plan) -> str:
    """How ``--max_pile_bytes auto`` sized the piles ("" when it was given)."""
    return f", {plan.max_pile_reason}" if plan.max_pile_reason else ""


def _kept_text(plan: Plan) -> str:
    """What ``--memory`` keeps of the runs between the passes (local files-mode runs)."""
    if not plan.memory_budget:
        return ""
    budget = f"--memory {size_text(plan.memory_budget)}" + (
        f" (auto, from {plan.memory})" if plan.memory else ""
    )
    if not plan.memory_for_runs:
        return f"; {budget}: no more than the passes hold, so every pass-1 run goes to disk"
    kept = min(plan.memory_for_runs, plan.held_bytes)
    where = "all of them" if kept >= plan.held_bytes else "the rest in the temp folder"
    return (
        f"; {budget}: up to {size_text(kept)} of pass-1 runs in memory between the passes ({where})"
    )


def _pass1_text(plan: Plan) -> str:
    """What pass 1 makes: its units of work, its buffer, its runs (files mode) and the parts
    they send."""
    (runs, parts), groups, g = plan.run_shape(), len(plan.source_groups), template_group(plan)
    where = (
        f"{runs:,} run objects under {plan.work_dir} (one per {_mib(plan.run_bytes)}), "
        if plan.intermediate == "files"
        else f"{runs:,} flushes of {_mib(plan.run_bytes)}, "
    )
    spilled = plan.spilled_per_writer
    spill = (
        f", up to {size_text(spilled)} of them spilled to the local temp folder per worker "
        "thread and merged"
        if spilled
        else ""
    )
    what = "pile parts" if g == 1 else f"parts (a segment a group of {g} piles)"
    return (
        f"{groups:,} group(s) of input files, each in runs of --run_bytes "
        f"{_mib(plan.run_bytes)} per worker thread{spill}; {where}{parts:,} {what} "
        f"of about {size_text(plan.held_bytes / max(1, parts))} each sent through the GroupByKey"
    )


def _runner_holds(options, shuffled: float) -> str:
    """What the local runner holds of a shuffle-mode run: its GroupByKey keeps every element in
    memory."""
    runner, in_flight = runner_description(options)
    if not in_flight:
        return ""
    return (
        f"; the local runner keeps all of it in memory, about {LOCAL_SHUFFLE_HOLD}x: "
        f"{size_text(shuffled * LOCAL_SHUFFLE_HOLD)} (use --intermediate=files locally)"
    )


def _operations_text(plan: Plan) -> str:
    """``gcs_operations``' totals, shown for every plan: they follow from the files, piles and
    mode alone, so a plan of a local sample prices the same run on gs:// too."""
    class_a, class_b = gcs_operations(plan)["total"]
    on_gcs = all(p.startswith("gs://") for p in (plan.sources[0].path, plan.output, plan.work_dir))
    return (
        f"about {class_a:,} class A (uploads, copies, lists) and {class_b:,} class B (reads) "
        f"Cloud Storage operations{'' if on_gcs else ' if every path were on gs://'}"
    )


def _store_lines(plan: Plan, options) -> list:
    """What ``run --layout store`` writes: pass 1 only, into a new pile store."""
    from pileshuffle.store.write import STORE_WRITERS

    sizes, store, writers = (
        pile_sizes(plan),
        store_dir(plan.output),
        min(STORE_WRITERS, len(plan.sources)),
    )
    return [
        (
            "piles",
            f"{plan.num_piles:,} piles in the store ({plan.num_piles_reason}); the loader or "
            "`pileshuffle materialize` orders them later",
        ),
        (
            "pile size",
            f"s = {sizes.expected:,.0f} records expected; plan for s + 6*sqrt(s) = "
            f"{sizes.headroom:,.0f} records (--max_pile_bytes {_mib(plan.max_pile_bytes)}: "
            "larger piles are loaded in sub-piles)",
        ),
        (
            "output",
            f"pile store {store}/: generation 0 (manifest version 1), up to "
            f"{writers * plan.num_piles:,} files of Arrow IPC ({writers} writer(s) x "
            f"{plan.num_piles:,} piles) holding each record with its key and hash, "
            f"seed {plan.seed}",
        ),
        (
            "output space",
            f"about {size_text(plan.needs.get(store, 0))} at {store}/{_free(plan, store)}",
        ),
        ("runner", runner_description(options)[0]),
    ]


def _free(plan: Plan, location: str) -> str:
    """Free space at ``location`` (shared with the plan's other locations on that disk)."""
    need, free = plan.space.get(location, (0, None))
    if free is None:
        return ""
    shared = " on that disk for both" if need != plan.needs[location] else ""
    short = (
        f": NOT ENOUGH for the {size_text(need)} this run writes there, so `run` refuses it"
        if free < need
        else ""
    )
    return f"; {size_text(free)} free{shared}{short}"


def _dedup_text(plan: Plan) -> str:
    """What ``--dedup`` compares and holds: no extra pass; a pile of one record repeated is
    streamed."""
    what = (
        "whole records by their bytes"
        if plan.dedup.field is None
        else f"the value of {plan.dedup.field!r}"
    )
    if plan.layout == "store":  # docs/stores.md, Deduplicated stores
        return (
            f"each distinct record of the live window once (its oldest live copy), comparing "
            f"{what}; an append reads the window's files of each pile to mark later copies, "
            "holding a batch and the repeated contents"
        )
    return (
        f"the first of each distinct record kept, by {what}; no extra pass (copies meet in one "
        f"pile); pass 2 holds one pile ({size_text(plan.max_pile_bytes)}) as without it, a pile "
        "of one record repeated streamed"
    )


def _balance_text(plan: Plan) -> str:
    """What ``--balance`` adds: the counting pass, and the output's size estimated from a sample."""
    how = "cutting large classes down" if plan.balance.undersample else "copying small classes up"
    return (
        f"{plan.label!r} by {plan.balance.spec()}, {how}: a first pass reads the input to count "
        f"the classes (exact counts, not a sample), so the input is read twice; a sample of "
        f"labels says about {plan.growth:.2f} records written per record read, which the piles "
        "and sizes below count"
    )


def _mib(n: int) -> str:
    return f"{n / 2**20:,.0f} MiB" if n >= 2**20 else f"{n:,} bytes"


def _chance(p: float) -> str:
    if p < 1e-9:
        return "less than 1 in a billion"
    if p < 1e-3:
        return f"about 1 in {1 / p:,.0f}"
    return f"{p:.1%}"
