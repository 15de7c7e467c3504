"""``pileshuffle run`` (= ``python -m pileshuffle.pipeline``, the flex template's entry point):
options -> plan -> the template's graph -> a published output, or with ``--layout store``
pass 1 only into a new pile store.

Without ``--runner`` (or with ``--runner=DirectRunner``) it runs on Beam's local FnApiRunner,
the engine the DirectRunner itself falls back to, using every core, and never tries a
download. ``--runner=DataflowRunner`` submits the job and returns without waiting (the flex
template launcher must not block on the job); ``--runner=DaskRunner`` (with
``--dask_client_address=tcp://...``) runs on a Dask cluster and waits for it.
"""

import sys
import time

from apache_beam.options.pipeline_options import PipelineOptions

from pileshuffle.commands.options import check_argv, help_text, wants_help
from pileshuffle.commands.report import (
    finished_at,
    reporting_errors,
    shards_at_stake_on_interrupt,
    submitted,
    summary,
)
from pileshuffle.engine.transforms.graph import run_graph
from pileshuffle.engine.tuning import keep_freed_memory
from pileshuffle.errors import HOLD_WORKER_STDERR
from pileshuffle.names import STORE_KIND, manifest_path
from pileshuffle.planning.launch import check_fits, plan_run
from pileshuffle.planning.locations import taken_output
from pileshuffle.planning.parameters import PileshuffleOptions, check_values, parse_flag
from pileshuffle.store.lock import command_line

__all__ = ["main", "pipeline_options", "report", "run"]


def pipeline_options(given=None) -> PipelineOptions:
    """``run``'s one typed options object: a ``PipelineOptions`` as given (its
    ``PileshuffleOptions`` view holds the template's parameters), or made from command-line
    arguments (default: this process's), which are checked first: unknown options and bad
    values are refused before anything runs."""
    if isinstance(given, PipelineOptions):
        check_values(given.view_as(PileshuffleOptions))
        return given
    argv = list(sys.argv[1:] if given is None else given)
    check_argv(argv)
    return PipelineOptions(argv)


def run(options=None, wait=None, hold_worker_stderr=False):
    """Plan and run a shuffle with ``options`` (``pipeline_options``: a ``PipelineOptions``,
    or command-line arguments). Returns the manifest dict when the run was waited for
    (``wait=None``: every runner except Dataflow), else Beam's ``PipelineResult``.
    ``hold_worker_stderr`` (the command line): see ``engine.runner._worker_stderr``."""
    options = pipeline_options(options)
    values = options.view_as(PileshuffleOptions)
    HOLD_WORKER_STDERR["on"] = hold_worker_stderr
    if values.layout == "store":
        from pileshuffle.commands.run_store import run_store

        return run_store(options, wait)
    shards_at_stake_on_interrupt(values.output)
    started = time.time()
    keep_freed_memory()
    plan = plan_run(options, wait)
    if plan.finished is not None:
        print(
            f"pileshuffle: {plan.output} already holds this run's output (the same options, "
            "seed and input files by path and size), finished "
            f"{finished_at(manifest_path(plan.output))}: nothing to do",
            file=sys.stderr,
        )
        return plan.finished
    check_fits(plan)
    quiet = parse_flag(values.quiet)
    with taken_output(
        plan.output, plan.replace_existing, plan.work_dir, command_line(), plan.job
    ) as token:
        if not quiet:
            print(
                f"pileshuffle: {len(plan.sources)} input file(s), {plan.input_bytes:,} bytes -> "
                f"{plan.num_piles} piles ({plan.num_piles_reason})",
                file=sys.stderr,
            )
        # a job that outlives this launch releases the output's lock once it has published
        return run_graph(plan, started, wait, token if plan.job else None, quiet)


_SUMMARY = (
    "Shuffle the input files into piles and write each pile as one shard, in a uniformly random "
    "order that the seed fixes. The flex template's entry point; `pileshuffle run` takes the "
    "same options."
)


def main(argv=None):
    """``pileshuffle run``: a run's summary and exit code 0; our errors are one line and exit
    code 2."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if wants_help(argv):
        print(help_text("pileshuffle run", _SUMMARY))
        return 0
    return reporting_errors(lambda: _run_and_report(argv))


def _run_and_report(argv) -> int:
    """Run what ``argv`` asks and print its report: the exit code."""
    options = pipeline_options(argv)
    outcome = run(options, hold_worker_stderr=True)
    return report(outcome, options)


def report(outcome, options) -> int:
    """Print a finished run's summary (an earlier run's, when this one found its output there and
    ran nothing: ``run`` returns the manifest as read, without this run's ``wall_seconds``), or
    where a submitted job will write."""
    if isinstance(outcome, dict):
        # a store's manifest says its own time (store_summary); a shard output's, when earlier
        earlier = "wall_seconds" not in outcome and outcome.get("kind") != STORE_KIND
        print(summary(outcome, finished_at(manifest_path(outcome["output"])) if earlier else None))
    else:
        output = options.view_as(PileshuffleOptions).output
        print(f"pileshuffle: {submitted(outcome, output)}", file=sys.stderr)
    return 0
