"""``pileshuffle plan``: what a run with these options would do (files, bytes, records, piles,
pile sizes, memory, space, Cloud Storage operations, runner), as text for a person or JSON for a
machine. It reads a sample of the input and writes nothing (``plan.make_plan`` only reads)."""

import dataclasses
import json
import logging
import math
import os

from apache_beam.options.pipeline_options import PipelineOptions

from pileshuffle.commands.plan_modes import modes_json, modes_lines, size_text
from pileshuffle.engine.inputs import describe_left_out, describe_skipped
from pileshuffle.engine.runs import SEGMENT_OVERHEAD
from pileshuffle.engine.transforms.pile_groups import group_words, template_group
from pileshuffle.io.storage import UNCOMPRESSED, compression_of, is_remote
from pileshuffle.names import manifest_path, shard_name, staging_dir, store_dir
from pileshuffle.planning.gcs_requests import gcs_operations
from pileshuffle.planning.job_model import SDK_PROCESS_BYTES as _SDK
from pileshuffle.planning.plan import (
    LOCAL_BASE_BYTES,
    PILE_MEMORY_FACTOR,
    RECORD_OVERHEAD,
    Plan,
    make_plan,
)
from pileshuffle.planning.runners import LOCAL_SHUFFLE_HOLD

__all__ = ["PileSizes", "gcs_operations", "plan_text", "plan_json", "main"]


@dataclasses.dataclass(frozen=True)
class PileSizes:
    """Pile sizes of a plan: records per pile are Binomial(records, 1/M)."""

    records: int
    num_piles: int
    record_bytes: float  # per record in a pile, payload and overhead
    max_pile_bytes: int

    @property
    def expected(self) -> float:
        return self.records / self.num_piles

    @property
    def headroom(self) -> float:
        """s + 6 sqrt(s): what auto sizing plans for."""
        return self.expected + 6 * math.sqrt(self.expected)

    @property
    def split_probability(self) -> float:
        """Probability that some pile holds more than ``max_pile_bytes`` (and is split again),
        by the normal approximation of each pile's binomial size."""
        limit = self.max_pile_bytes / self.record_bytes
        if self.num_piles == 1:
            return float(self.records > limit)
        variance = self.expected * (1 - 1 / self.num_piles)
        one = 0.5 * math.erfc((limit - self.expected) / math.sqrt(2 * variance))
        return 1.0 if one >= 1 else -math.expm1(self.num_piles * math.log1p(-one))


def _pile_sizes(plan: Plan) -> PileSizes:
    return PileSizes(
        plan.written_records,
        plan.num_piles,
        plan.mean_record_bytes + RECORD_OVERHEAD,
        plan.max_pile_bytes,
    )


def _runner_description(options) -> tuple:
    """``(runner, piles in flight per worker or None)``."""
    from apache_beam.options.pipeline_options import DirectOptions, GoogleCloudOptions

    from pileshuffle.planning.runners import is_dask, is_dataflow, is_local, runner_name

    if is_local(options):
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


def _mib(n: int) -> str:
    return f"{n / 2**20:,.0f} MiB" if n >= 2**20 else f"{n:,} bytes"


def _chance(p: float) -> str:
    if p < 1e-9:
        return "less than 1 in a billion"
    if p < 1e-3:
        return f"about 1 in {1 / p:,.0f}"
    return f"{p:.1%}"


def plan_text(plan: Plan, options) -> str:
    """The plan as a person reads it: what was found, what will be made, what it needs."""
    sizes = _pile_sizes(plan)
    runner, in_flight = _runner_description(options)
    pile_bytes = sizes.headroom * sizes.record_bytes
    compressed = any(compression_of(src.path) != UNCOMPRESSED for src in plan.sources)
    guessed = (
        " (compressed input: from the expansion of a sample)"
        if compressed and plan.format != "parquet"
        else ""
    )
    lines = [
        (
            "input",
            f"{len(plan.sources):,} {plan.format} file(s), {plan.input_bytes:,} bytes ({size_text(plan.input_bytes)})",
        ),
        (
            "records",
            f"about {plan.estimated_records:,} of {plan.mean_record_bytes:,.0f} bytes on average{guessed}",
        ),
    ]
    lines += [
        (name, describe(plan))
        for name, describe, asked in (
            ("balance", _balance_text, plan.balance),
            ("dedup", _dedup_text, plan.dedup),
        )
        if asked is not None
    ]
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
                f"{len(plan.duplicates):,} name(s) of files already matched (each file is read once)",
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
    if plan.layout == "store":
        return "\n".join(
            f"{label:<14}{text}" for label, text in lines + _store_lines(plan, options)
        )
    lines += [
        ("piles", f"{plan.num_piles:,} = output shards ({plan.num_piles_reason})"),
        (
            "pile size",
            f"s = {sizes.expected:,.0f} records expected; plan for s + 6*sqrt(s) = {sizes.headroom:,.0f} "
            f"records, about {size_text(pile_bytes)} (--max_pile_bytes "
            f"{_mib(plan.max_pile_bytes)}{_sized(plan)})",
        ),
        (
            "split again",
            f"chance that some pile exceeds {_mib(plan.max_pile_bytes)} and is split again (same order): "
            f"{_chance(sizes.split_probability)}",
        ),
    ]
    per_pile = PILE_MEMORY_FACTOR * min(
        pile_bytes * (group := template_group(plan)), plan.max_pile_bytes
    )
    held = min(plan.held_per_writer, plan.held_bytes)
    if in_flight:
        peak = max(per_pile, held) * in_flight + LOCAL_BASE_BYTES
        lines.append(
            (
                "memory",
                f"pass 1 holds up to {size_text(held)} per worker thread (--run_bytes), pass 2 about "
                f"{size_text(per_pile)} {group_words(group)} being written; x {in_flight} at a time + "
                f"{size_text(LOCAL_BASE_BYTES)} = {size_text(peak)} peak{_kept_text(plan)}",
            )
        )
    else:
        lines.append(
            (
                "memory",
                f"pass 1 holds up to {size_text(held)} per worker thread (--run_bytes), pass 2 about "
                f"{size_text(per_pile)} {group_words(group)} in flight, plus {size_text(_SDK)} per SDK "
                "process (docs/dataflow.md: worker memory)",
            )
        )
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
    lines.append(("pass 1", _pass1_text(plan)))
    if plan.intermediate == "shuffle":
        shuffled = plan.held_bytes + plan.run_shape()[1] * SEGMENT_OVERHEAD
        lines.append(
            (
                "shuffle",
                f"about {size_text(shuffled)} through the runner's GroupByKey (--intermediate=shuffle: "
                "the records with their keys and hashes)" + _runner_holds(options, shuffled),
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
    return "\n".join(f"{label:<14}{text}" for label, text in lines)


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
    """What pass 1 makes: its units of work, its buffer, its runs (files mode) and the parts they send."""
    (runs, parts), groups, g = plan.run_shape(), len(plan.source_groups), template_group(plan)
    where = (
        f"{runs:,} run objects under {plan.work_dir} (one per {_mib(plan.run_bytes)}), "
        if plan.intermediate == "files"
        else f"{runs:,} flushes of {_mib(plan.run_bytes)}, "
    )
    spilled = plan.spilled_per_writer
    spill = (
        f", up to {size_text(spilled)} of them spilled to the local temp folder per worker thread and merged"
        if spilled
        else ""
    )
    return (
        f"{groups:,} group(s) of input files, each in runs of --run_bytes {_mib(plan.run_bytes)} per worker thread"
        f"{spill}; {where}{parts:,} {'pile parts' if g == 1 else f'parts (a segment a group of {g} piles)'} "
        f"of about {size_text(plan.held_bytes / max(1, parts))} each sent through the GroupByKey"
    )


def _runner_holds(options, shuffled: float) -> str:
    """What the local runner holds of a shuffle-mode run: its GroupByKey keeps every element in memory."""
    runner, in_flight = _runner_description(options)
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
        f"about {class_a:,} class A (uploads, copies, lists) and {class_b:,} class B (reads) Cloud Storage "
        f"operations{'' if on_gcs else ' if every path were on gs://'}"
    )


def _store_lines(plan: Plan, options) -> list:
    """What ``run --layout store`` writes: pass 1 only, into a new pile store."""
    from pileshuffle.store.write import STORE_WRITERS

    sizes, store, writers = (
        _pile_sizes(plan),
        store_dir(plan.output),
        min(STORE_WRITERS, len(plan.sources)),
    )
    return [
        (
            "piles",
            f"{plan.num_piles:,} piles in the store ({plan.num_piles_reason}); the loader or `pileshuffle "
            "materialize` orders them later",
        ),
        (
            "pile size",
            f"s = {sizes.expected:,.0f} records expected; plan for s + 6*sqrt(s) = {sizes.headroom:,.0f} "
            f"records (--max_pile_bytes {_mib(plan.max_pile_bytes)}: larger piles are loaded in sub-piles)",
        ),
        (
            "output",
            f"pile store {store}/: generation 0 (manifest version 1), up to {writers * plan.num_piles:,} files "
            f"of Arrow IPC ({writers} writer(s) x {plan.num_piles:,} piles) holding each record with its key and "
            f"hash, seed {plan.seed}",
        ),
        (
            "output space",
            f"about {size_text(plan.needs.get(store, 0))} at {store}/{_free(plan, store)}",
        ),
        ("runner", _runner_description(options)[0]),
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
    """What ``--dedup`` compares and holds: no extra pass; a pile of one record repeated is streamed."""
    what = (
        "whole records by their bytes"
        if plan.dedup.field is None
        else f"the value of {plan.dedup.field!r}"
    )
    if plan.layout == "store":  # docs/stores.md, Deduplicated stores
        return (
            f"each distinct record of the live window once (its oldest live copy), comparing {what}; an append reads "
            "the window's files of each pile to mark later copies, holding a batch and the repeated contents"
        )
    return (
        f"the first of each distinct record kept, by {what}; no extra pass (copies meet in one pile); pass 2 "
        f"holds one pile ({size_text(plan.max_pile_bytes)}) as without it, a pile of one record repeated streamed"
    )


def _balance_text(plan: Plan) -> str:
    """What ``--balance`` adds: the counting pass, and the output's size estimated from a sample."""
    how = "cutting large classes down" if plan.balance.undersample else "copying small classes up"
    return (
        f"{plan.label!r} by {plan.balance.spec()}, {how}: a first pass reads the input to count the classes "
        f"(exact counts, not a sample), so the input is read twice; a sample of labels says about "
        f"{plan.growth:.2f} records written per record read, which the piles and sizes below count"
    )


def plan_json(plan: Plan, options) -> dict:
    """The machine form: the original keys, then the numbers ``plan_text`` shows."""
    sizes, (runs, parts) = _pile_sizes(plan), plan.run_shape()
    return {
        "files": len(plan.sources),
        "input_bytes": plan.input_bytes,
        "num_piles": plan.num_piles,
        "reason": plan.num_piles_reason,
        "output": plan.output,
        "compression": plan.compression,
        "intermediate": plan.intermediate,
        "work_dir": plan.work_dir,
        "estimated_records": plan.estimated_records,
        "mean_record_bytes": plan.mean_record_bytes,
        "max_pile_bytes": plan.max_pile_bytes,
        "expected_pile_records": sizes.expected,
        "headroom_pile_records": sizes.headroom,
        "split_probability": sizes.split_probability,
        "run_bytes": plan.run_bytes,
        "spilled_per_writer": plan.spilled_per_writer,
        "memory_budget": plan.memory_budget,
        "memory_for_runs": plan.memory_for_runs,
        "memory_source": plan.memory.source
        if plan.memory
        else None,  # None: --memory given, or no budget
        "runs": runs if plan.intermediate == "files" else 0,
        "parts": parts,
        "piles_per_part": template_group(plan),  # a part: a segment of one pile, or of a group
        "gcs_operations": _operations_json(plan),
        "space": {
            location: {"needed": plan.needs.get(location, need), "free": free}
            for location, (need, free) in plan.space.items()
        },
        "left_out": plan.left_out,
        "skipped": plan.skipped,
        "duplicates": plan.duplicates,
        "replaces": plan.unpublished,
        "layout": plan.layout,
        "runner": _runner_description(options)[0],
        "balance": None
        if plan.balance is None
        else {
            "label_field": plan.label,
            "policy": plan.balance.spec(),
            "undersample": plan.balance.undersample,
            "counting_pass": True,
            "growth_estimate": round(plan.growth, 4),
        },
        "dedup": None if plan.dedup is None else plan.dedup.options(),
        **modes_json(plan, options),
    }


def _operations_json(plan: Plan):
    """``gcs_operations`` as JSON (every path taken to be on gs://); None for a store: not counted."""
    if plan.layout == "store":
        return None
    steps = {step: {"class_a": a, "class_b": b} for step, (a, b) in gcs_operations(plan).items()}
    return {**steps.pop("total"), "steps": steps}


def main(argv=None):
    """``pileshuffle plan``: what a run with these options would do, without running it."""
    import sys

    from pileshuffle.commands.options import check_argv, help_text, wants_help
    from pileshuffle.errors import PileshuffleError
    from pileshuffle.planning.parameters import parse_flag
    from pileshuffle.planning.template_parameters import PARAMETERS, Parameter
    from pileshuffle.planning.runners import is_local, local_defaults

    json_flag = Parameter(
        "json",
        "JSON",
        "Print the plan as JSON (the machine form) instead of text.",
        "false",
        flag=True,
    )
    scale = Parameter(
        "input_bytes",
        "Plan for this much input",
        "Plan as if the input totalled this many bytes of records like its own (in "
        "files of 1 GB, or the sample's if larger), both intermediate modes side by "
        "side: plan a 100TB job from a sample of it. Suffixes as --max_pile_bytes "
        "(binary: TB = TiB); or a number of bytes.",
        "100TB",
        default="",
        regex=r"^[^\n]*$",
        metavar="SIZE",
    )
    parameters = PARAMETERS + (json_flag, scale)
    argv = list(sys.argv[1:] if argv is None else argv)
    if wants_help(argv):
        print(
            help_text(
                "pileshuffle plan",
                "Show what `pileshuffle run` would do with these options: files, bytes, "
                "records, piles, pile sizes, memory, space, Cloud Storage operations, runner. Reads a sample; "
                "writes nothing.",
                parameters,
            )
        )
        return 0
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        input_bytes, argv = _input_bytes_of(argv)
        values = check_argv(argv, PARAMETERS + (json_flag,))
        options = PipelineOptions([a for a in argv if a.split("=", 1)[0] != "--json"])
        if is_local(options):
            options = local_defaults(options)
        plan = make_plan(options, input_bytes)
    except PileshuffleError as error:
        print(f"pileshuffle: error: {error}", file=sys.stderr)
        return 2
    if parse_flag(values.json):
        print(json.dumps(plan_json(plan, options), indent=1))
    else:
        print(plan_text(plan, options))
    return 0


def _input_bytes_of(argv: list) -> tuple:
    """``(--input_bytes as a size or None, argv without it)``: a size of at least a byte, which
    only ``plan`` takes (given as ``--input_bytes SIZE`` or ``--input_bytes=SIZE``)."""
    from pileshuffle.errors import UsageError
    from pileshuffle.planning.parameters import parse_bytes

    kept, given, rest = [], [], iter(argv)
    for arg in rest:
        name, equals, value = arg.partition("=")
        if name != "--input_bytes":
            kept.append(arg)
            continue
        given.append(value if equals else next(rest, ""))
    if len(given) > 1:
        raise UsageError(f"--input_bytes: given {len(given)} times; give it once")
    if not given:
        return None, kept
    try:
        size = parse_bytes(given[0])
    except ValueError as error:
        raise UsageError(f"--input_bytes: {error}") from None
    if size < 1:
        raise UsageError(f"--input_bytes: {given[0]} is no input: give a size such as 100TB")
    return size, kept
