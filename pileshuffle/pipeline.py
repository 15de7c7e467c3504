"""The template's main: options -> plan -> read sources -> piles -> WritePiles.

Run it as ``python -m pileshuffle.pipeline --input ... --output ...`` (the flex template
entry point) or ``pileshuffle run ...``: the same options. Without ``--runner`` (or with
``--runner=DirectRunner``) it runs on Beam's local FnApiRunner, the engine the
DirectRunner itself falls back to, using every core, and never tries a download.

``--runner=DataflowRunner`` submits the job and returns without waiting (the flex
template launcher must not block on the job); ``--runner=DaskRunner`` (with
``--dask_client_address=tcp://...``) runs on a Dask cluster and waits for it.
"""

import contextlib
import logging
import os
import re
import sys
import tempfile
import time
import types

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions

from pileshuffle import interrupt, progress
from pileshuffle.errors import OutputError, PileshuffleError, find_error, unwrapped, user_message
from pileshuffle.fragments import Fragment
from pileshuffle.inputs import describe_left_out, describe_skipped
from pileshuffle.options import PileshuffleOptions, check_argv, help_text, parse_flag, wants_help
from pileshuffle.plan import Plan, make_plan, space_note, taken_output
from pileshuffle.runners import (
    close_client,
    dask_defaults,
    dataflow_defaults,
    is_dask,
    is_dataflow,
    is_local,
    local_defaults,
    make_runner,
    should_wait,
    submitted,
)
from pileshuffle.store.layout import command_line
from pileshuffle.transforms.assign import STATS_TAG, ReadSourceToPiles, SourceStats
from pileshuffle.transforms.shuffle import GroupIntoPiles
from pileshuffle.transforms.write import WritePiles, discard_unpublished, manifest_path, read_manifest, remove_tree
from pileshuffle.tuning import keep_freed_memory

log = logging.getLogger("pileshuffle")


def build(pipeline: beam.Pipeline, plan: Plan, started: float, release_fragments: bool = False):
    """The template's graph: one leaf (Finalize), so runners that run only the last
    leaf (Dask) still run all of it."""
    fragments_dir = FileSystems.join(plan.work_dir, "fragments") if plan.intermediate == "files" else None
    sources = (
        pipeline
        | "ListSources" >> beam.Create(plan.sources)
        | "SpreadSources" >> beam.Reshuffle()
    )
    pass1 = sources | "ReadSourceToPiles" >> beam.ParDo(
        ReadSourceToPiles(plan.format, plan.seed, plan.num_piles, fragments_dir, skip_corrupt=plan.skip_corrupt)
    ).with_outputs(STATS_TAG, main="fragments")
    # Beam's DaskRunner hands every output of a multi-output ParDo to each consumer (it
    # does not separate tags), so each branch keeps only its own type; elsewhere a no-op.
    fragments = pass1.fragments | "OnlyFragments" >> beam.Filter(is_fragment_element)
    stats = pass1[STATS_TAG] | "OnlyStats" >> beam.Filter(is_source_stats)
    return (
        fragments
        | "GroupIntoPiles" >> GroupIntoPiles(plan.num_piles, plan.max_pile_bytes, plan.work_dir)
        | "WritePiles" >> WritePiles(
            plan.output, plan.format, plan.compression, num_piles=plan.num_piles, overwrite=plan.replace_existing,
            schema=plan.schema, expected=stats, manifest_fields=manifest_fields(plan), started=started,
            release_fragments=release_fragments,
        )
    )


def is_fragment_element(element) -> bool:
    return isinstance(element, tuple) and len(element) == 2 and isinstance(element[1], Fragment)


def is_source_stats(element) -> bool:
    return isinstance(element, SourceStats)


def manifest_fields(plan: Plan) -> dict:
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
        },
    }


def run(argv=None, wait=None, hold_worker_stderr=False):
    """Plan and run a shuffle. Returns the manifest dict when the run was waited for
    (``wait=None``: every runner except Dataflow), else Beam's ``PipelineResult``.
    ``hold_worker_stderr`` (the command line): see ``_worker_stderr``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    values = check_argv(argv)  # unknown options and bad values: before anything runs
    options = PipelineOptions(argv)
    if options.view_as(PileshuffleOptions).layout == "store":  # also registers our options
        from pileshuffle.store.commands import run_store

        return run_store(argv, options, wait, hold_worker_stderr)
    at_stake_on_interrupt(options.view_as(PileshuffleOptions).output)
    if is_local(options):
        options = local_defaults(options, argv)
    started = time.time()
    keep_freed_memory()
    plan = make_plan(options)
    if is_dask(options):
        options = dask_defaults(options, plan)
    if is_dataflow(options):
        options = dataflow_defaults(options)
    with taken_output(plan.output, plan.replace_existing, plan.work_dir, command_line(["run", *argv])):
        return run_plan(plan, options, parse_flag(values.quiet), started, wait, hold_worker_stderr)


def at_stake_on_interrupt(output: str):
    """What Ctrl-C leaves of a run or materialize that writes shards at ``output``."""
    interrupt.describe(f"nothing was published at {output}; run the same command again (it removes what this one "
                       f"left and writes the same shards)", f"it had published {manifest_path(output)}: the output is complete")


def run_plan(plan: Plan, options, quiet: bool, started: float, wait, hold_worker_stderr):
    """Run a prepared plan (under the output's lock): the pipeline, then its manifest with
    what ``--input`` matched but the run did not read."""
    if not quiet:
        print(f"pileshuffle: {len(plan.sources)} input file(s), {plan.input_bytes:,} bytes -> {plan.num_piles} piles "
              f"({plan.num_piles_reason})", file=sys.stderr)
    pipeline = beam.Pipeline(runner=make_runner(options), options=options)
    build(pipeline, plan, started, release_fragments=is_local(options))
    showing = progress.showing(len(plan.sources), plan.input_bytes, plan.num_piles,
                               enabled=not quiet and shows_progress(options))

    def failed(error):
        remove_tree(plan.work_dir)
        discard_unpublished(plan.output)
        message = user_message(error)
        if message and "No space left" in message:
            return OutputError(f"{message}; {space_note(plan)}")
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


def run_pipeline(pipeline, options, wait, hold_worker_stderr, on_failure, showing=None):
    """Run ``pipeline`` and wait for it when its runner is waited for (``should_wait``);
    returns Beam's result when it is not, else None. On failure ``on_failure(error)``
    cleans up and may return the error to raise instead; our own errors come out
    unwrapped from the runner's (in-process runners wrap or rename them)."""
    held = types.SimpleNamespace(ours=False)
    holding = _worker_stderr(held) if hold_worker_stderr and is_local(options) else contextlib.nullcontext()
    with showing or contextlib.nullcontext(), holding:
        try:
            result = pipeline.run()
            if not should_wait(options, wait):
                return result
            try:
                result.wait_until_finish()
            except BaseException:
                close_client(result, cancel=True)
                raise
            close_client(result)
            return None
        except BaseException as error:
            held.ours = user_message(error) is not None
            replacement = on_failure(error)
            if replacement is not None:
                raise replacement from error
            ours = unwrapped(error)
            if ours is not None and ours is not error:
                raise ours from error
            raise


def shows_progress(options) -> bool:
    """Progress is counted in this process: local runs whose DoFns run here (not in the
    local runner's multi_processing worker processes)."""
    return is_local(options) and options.view_as(DirectOptions).direct_running_mode != "multi_processing"


def summary(manifest: dict) -> str:
    if manifest.get("kind") == "pileshuffle-store":
        from pileshuffle.store.commands import store_summary

        return store_summary(manifest)
    totals = manifest["totals"]
    seconds = manifest.get("wall_seconds") or manifest.get("seconds") or float("nan")
    piles = manifest["pile_records"]
    lines = [
        f"records   {totals['records']:,} (fingerprints of input and output match)",
        f"bytes     {totals['payload_bytes']:,} payload, {totals['shard_bytes']:,} in {manifest['num_piles']} shard(s)",
        f"piles     {manifest['num_piles']}; records per pile "
        f"min {piles['min']:,} / mean {piles['mean']:,.0f} / max {piles['max']:,}; split again: {manifest['piles_split']}",
        f"time      {seconds:.2f} s, {totals['payload_bytes'] / 1e6 / seconds:,.1f} MB/s",
    ]
    if manifest.get("inputs_left_out"):
        left_out = manifest["inputs_left_out"]
        lines.append(f"left out  {len(left_out)} file(s) that --input matched but pileshuffle wrote: {describe_left_out(left_out)}")
    if manifest.get("inputs_skipped"):
        skipped = manifest["inputs_skipped"]
        lines.append(f"skipped   {len(skipped)} matched name(s) that are not input files: {describe_skipped(skipped)}")
    if manifest.get("input_duplicates"):
        duplicates = manifest["input_duplicates"]
        lines.append(f"duplicate {len(duplicates)} name(s) of files already matched, read once: "
                     + ", ".join(f"{name} = {kept}" for name, kept in sorted(duplicates.items())[:3])
                     + (", ..." if len(duplicates) > 3 else ""))
    if manifest["skipped"]["records"]:
        lines.append(f"skipped   {manifest['skipped']['records']} corrupt record(s), {manifest['skipped']['bytes']:,} bytes")
    lines.append(f"manifest  {manifest_path(manifest['output'])}")
    return "\n".join(lines)


class _HideReportedErrors(logging.Filter):
    """Drop the runner's log records (with tracebacks) of a failure that is one of our own
    errors: ``main`` reports those in one line."""

    def filter(self, record):
        if record.levelno < logging.ERROR or not record.name.startswith("apache_beam"):
            return True
        if record.exc_info and record.exc_info[1] is not None and find_error(record.exc_info[1]) is not None:
            return False
        try:
            text = record.getMessage()
        except Exception:
            return True
        return "pileshuffle.errors." not in text and user_message(Exception(text)) is None


@contextlib.contextmanager
def _worker_stderr(state):
    """Hold what is written to file descriptor 2 while a local pipeline runs: the local
    runner's worker processes print their own tracebacks there. It is passed on
    afterwards, except when the run failed with one of our errors (``state.ours``): then
    only our own lines are, and ``main`` reports the error in one line."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):
        yield state
        return
    with tempfile.TemporaryFile() as capture:
        os.dup2(capture.fileno(), 2)
        try:
            yield state
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            capture.seek(0)
            text = capture.read().decode(errors="replace")
            if state.ours:
                text = "".join(line for line in text.splitlines(keepends=True) if _OWN_LINE.match(line))
            sys.stderr.write(text)
            sys.stderr.flush()


_OWN_LINE = re.compile(r"^(?:pileshuffle|[A-Z]+ pileshuffle[\w.]*): ")  # our prints and our loggers' records


SUMMARY = ("Shuffle the input files into piles and write each pile as one shard, in a uniformly random order "
           "that the seed fixes. The flex template's entry point; `pileshuffle run` takes the same options.")


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if wants_help(argv):
        print(help_text("pileshuffle run", SUMMARY))
        return 0
    return reporting_errors(lambda: report(run(argv, hold_worker_stderr=True), argv))


def reporting_errors(command) -> int:
    """Exit code of ``command()``; our errors (and runner errors that wrap one) are one
    line on stderr and exit code 2, with the runner's own logging of them held back."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    for handler in logging.getLogger().handlers:
        handler.addFilter(_HideReportedErrors())
    try:
        return command()
    except PileshuffleError as error:
        print(f"pileshuffle: error: {error}", file=sys.stderr)
        return 2
    except Exception as error:
        message = user_message(error)
        if message is None:
            raise
        print(f"pileshuffle: error: {message}", file=sys.stderr)
        return 2


def report(outcome, argv) -> int:
    """Print a finished run's summary, or where a submitted job will write."""
    if isinstance(outcome, dict):
        print(summary(outcome))
    else:
        output = PipelineOptions(argv).view_as(PileshuffleOptions).output
        print(f"pileshuffle: {submitted(outcome, output)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
