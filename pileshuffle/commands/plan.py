"""``pileshuffle plan``: what a run with these options would do (files, bytes, records, piles,
pile sizes, memory, space, Cloud Storage operations, runner), as text for a person
(``plan_text``) or JSON for a machine (``plan_json``). It reads a sample of the input and writes
nothing (``plan.make_plan`` only reads)."""

import json
import logging

from apache_beam.options.pipeline_options import PipelineOptions

from pileshuffle.commands.plan_modes import modes_json
from pileshuffle.commands.plan_text import plan_text, runner_description
from pileshuffle.engine.pile_groups import template_group
from pileshuffle.planning.gcs_requests import gcs_operations
from pileshuffle.planning.pile_sizes import pile_sizes
from pileshuffle.planning.plan import Plan, make_plan

__all__ = ["gcs_operations", "plan_json", "main"]


def plan_json(plan: Plan, options) -> dict:
    """The machine form: the original keys, then the numbers ``plan_text`` shows."""
    sizes, (runs, parts) = pile_sizes(plan), plan.run_shape()
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
        # None: --memory given, or no budget
        "memory_source": plan.memory.source if plan.memory else None,
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
        "runner": runner_description(options)[0],
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
    """``gcs_operations`` as JSON (every path taken to be on gs://); None for a store: not
    counted."""
    if plan.layout == "store":
        return None
    steps = {step: {"class_a": a, "class_b": b} for step, (a, b) in gcs_operations(plan).items()}
    return {**steps.pop("total"), "steps": steps}


def main(argv=None):
    """``pileshuffle plan``: what a run with these options would do, without running it."""
    import sys

    from pileshuffle.commands.options import check_argv, help_text, wants_help
    from pileshuffle.engine.runner import is_local_runner
    from pileshuffle.errors import PileshuffleError
    from pileshuffle.planning.parameters import parse_flag
    from pileshuffle.planning.runners import local_defaults
    from pileshuffle.planning.template_parameters import PARAMETERS

    json_flag, scale = _plan_parameters()
    argv = list(sys.argv[1:] if argv is None else argv)
    if wants_help(argv):
        print(
            help_text(
                "pileshuffle plan",
                "Show what `pileshuffle run` would do with these options: files, bytes, "
                "records, piles, pile sizes, memory, space, Cloud Storage operations, runner. "
                "Reads a sample; writes nothing.",
                PARAMETERS + (json_flag, scale),
            )
        )
        return 0
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        input_bytes, argv = _input_bytes_of(argv)
        values = check_argv(argv, PARAMETERS + (json_flag,))
        options = PipelineOptions([a for a in argv if a.split("=", 1)[0] != "--json"])
        if is_local_runner(options):
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


def _plan_parameters() -> tuple:
    """``(--json, --input_bytes)``: the parameters ``plan`` takes beyond ``run``'s (the template's
    ``PARAMETERS``), as its help lists them."""
    from pileshuffle.planning.template_parameters import Parameter

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
    return json_flag, scale


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
