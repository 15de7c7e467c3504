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

from pileshuffle import progress
from pileshuffle.commands.options import check_argv, help_text, wants_help
from pileshuffle.commands.output_lock import taken_output
from pileshuffle.commands.report import (
    finished_at,
    reporting_errors,
    shards_at_stake_on_interrupt,
    summary,
)
from pileshuffle.commands.running import new_pipeline, run_pipeline, shows_progress
from pileshuffle.engine.output_files import discard_unpublished, read_manifest, remove_tree
from pileshuffle.engine.transforms.graph import build, manifest_fields
from pileshuffle.engine.tuning import keep_freed_memory
from pileshuffle.errors import OutputError, PileshuffleError, user_message
from pileshuffle.io import storage
from pileshuffle.names import SHARDS_KIND, STORE_KIND, manifest_path
from pileshuffle.planning.job_model import check_worker_disk
from pileshuffle.planning.parameters import PileshuffleOptions, check_values, parse_flag
from pileshuffle.planning.plan import Plan, make_plan
from pileshuffle.planning.runners import (
    check_local_shuffle_fits,
    dask_defaults,
    dataflow_defaults,
    is_dask,
    is_dataflow,
    is_local,
    local_defaults,
    outliving_job,
    submitted,
)
from pileshuffle.planning.space import check_space, space_note
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
    ``hold_worker_stderr`` (the command line): see ``running._worker_stderr``."""
    options = pipeline_options(options)
    values = options.view_as(PileshuffleOptions)
    if values.layout == "store":
        from pileshuffle.commands.run_store import run_store

        return run_store(options, wait, hold_worker_stderr)
    shards_at_stake_on_interrupt(values.output)
    if is_local(options):
        options = local_defaults(options)
    if is_dataflow(options):
        options = dataflow_defaults(options)
    started = time.time()
    keep_freed_memory()
    try:
        plan = make_plan(options)
    except OutputError:  # such as a finished output there: this very run's is nothing to do
        finished = _this_run_finished(options)
        if finished is None:
            raise
        when = finished_at(manifest_path(values.output))
        print(
            f"pileshuffle: {values.output} already holds this run's output (the same options, "
            "seed and "
            f"input files by path and size), finished {when}: nothing to do",
            file=sys.stderr,
        )
        return finished
    check_space(plan.space)
    check_worker_disk(plan)
    if is_local(options):
        check_local_shuffle_fits(plan)
    if is_dask(options):
        options = dask_defaults(options, len(plan.source_groups))
    job = outliving_job(
        options, wait
    )  # a Dataflow job holds the output's lock after this launcher returns
    with taken_output(
        plan.output, plan.replace_existing, plan.work_dir, command_line(), job
    ) as token:
        return _run_plan(
            plan,
            options,
            parse_flag(values.quiet),
            started,
            wait,
            hold_worker_stderr,
            token if job else None,
        )


def _this_run_finished(options):
    """The manifest at ``--output`` when it is of this very run (its seed and options as this plan
    would record them, its input files by path and size) and ``--overwrite`` is not given;
    else None."""
    values = options.view_as(PileshuffleOptions)
    if parse_flag(values.overwrite) or not storage.exists(manifest_path(values.output)):
        return None
    try:
        manifest = read_manifest(values.output)
        values.overwrite = True  # plan as the run would, over its own output (planning only reads)
        plan = make_plan(options)
    except PileshuffleError:
        return None
    finally:
        values.overwrite = False
    fields = manifest_fields(plan)
    inputs = {(i.get("path"), i.get("bytes")) for i in manifest.get("inputs", [])}
    same = (
        manifest.get("kind") == SHARDS_KIND
        and manifest.get("seed") == fields["seed"]
        and manifest.get("options") == fields["options"]
        and inputs == {(s.path, s.size) for s in plan.sources}
    )
    return manifest if same else None


def _run_plan(
    plan: Plan, options, quiet: bool, started: float, wait, hold_worker_stderr, lock_token=None
):
    """Run a prepared plan (under the output's lock): the pipeline, then its manifest with
    what ``--input`` matched but the run did not read. ``lock_token``: the job releases the
    output's lock once it has published (a job that outlives this process)."""
    if not quiet:
        print(
            f"pileshuffle: {len(plan.sources)} input file(s), {plan.input_bytes:,} bytes -> "
            f"{plan.num_piles} piles "
            f"({plan.num_piles_reason})",
            file=sys.stderr,
        )
    pipeline = new_pipeline(options)
    build(pipeline, plan, started, lock_token)
    showing = progress.showing(
        len(plan.sources),
        plan.input_bytes,
        plan.num_piles,
        enabled=not quiet and shows_progress(options),
    )

    def failed(error):
        remove_tree(plan.work_dir)
        discard_unpublished(plan.output)
        message = user_message(error)
        if message and "No space left" in message:
            return OutputError(f"{message}; {space_note(plan.space)}")
        return None

    result = run_pipeline(pipeline, options, wait, hold_worker_stderr, failed, showing)
    if result is not None:
        return result
    manifest = read_manifest(plan.output)
    manifest["wall_seconds"] = time.time() - started
    manifest["inputs_left_out"] = plan.left_out
    manifest["inputs_skipped"] = plan.skipped
    manifest["input_duplicates"] = plan.duplicates
    return manifest


_SUMMARY = (
    "Shuffle the input files into piles and write each pile as one shard, in a uniformly random "
    "order "
    "that the seed fixes. The flex template's entry point; `pileshuffle run` takes the same "
    "options."
)


def main(argv=None):
    """``pileshuffle run``: a run's summary and exit code 0; our errors are one line and exit
    code 2."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if wants_help(argv):
        print(help_text("pileshuffle run", _SUMMARY))
        return 0
    return reporting_errors(lambda: _run_and_report(pipeline_options(argv)))


def _run_and_report(options) -> int:
    return report(run(options, hold_worker_stderr=True), options)


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
