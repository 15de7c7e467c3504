"""A built pipeline on the runner its options name: which runner (``runner_name``; local runs
on Beam's FnApiRunner directly, so no Prism download is tried), the pipeline made on it
(``new_pipeline``) and run (``execute``): waited for or not (Dataflow is submitted and left),
with progress, our errors unwrapped from the runner's, and the local workers' stderr held back
when the error is one of ours. The options come with ``planning.runners.runner_defaults``
applied; Dask's partitions follow the graph's units of work, so they are set here."""

import contextlib
import os
import re
import shutil
import sys
import tempfile
import types

import apache_beam as beam
from apache_beam.options.pipeline_options import (
    DirectOptions,
    GoogleCloudOptions,
    PipelineOptions,
    StandardOptions,
    TypeOptions,
)

from pileshuffle import interrupt
from pileshuffle.errors import HOLD_WORKER_STDERR, UsageError, unwrapped, user_message

__all__ = [
    "LOCAL_RUNNERS",
    "DASK_RUNNER",
    "DASK_CONNECT_SECONDS",
    "given_options",
    "runner_name",
    "is_local_runner",
    "is_dask",
    "is_dataflow",
    "make_runner",
    "dask_runner",
    "graph_defaults",
    "dask_defaults",
    "should_wait",
    "outliving_job",
    "close_client",
    "new_pipeline",
    "execute",
    "shows_progress",
]

# --runner values run in-process
LOCAL_RUNNERS = (None, "DirectRunner", "FnApiRunner", "SwitchingDirectRunner")
# what runner_name makes of Dask's short names
DASK_RUNNER = "apache_beam.runners.dask.dask_runner.DaskRunner"
_DASK_MAX_DEFAULT_PARTITIONS = 64
# A scheduler that is up answers in well under a second, even across a region; distributed's own
# default (30 s) left a mistyped or stopped --dask_client_address looking like a hung command.
DASK_CONNECT_SECONDS = 10


def given_options(options: PipelineOptions) -> set:
    """The names of the options the user gave: on the command line (Beam keeps its flags), or
    as keyword values other than Beam's defaults."""
    flags = getattr(options, "_flags", None) or []
    named = {flag[2:].split("=", 1)[0] for flag in flags if flag.startswith("--")}
    return named | set(options.get_all_options(drop_default=True, retain_unknown_options=True))


def runner_name(options) -> str:
    """The ``--runner`` value, with Dask's short names resolved to its class path."""
    runner = options.view_as(StandardOptions).runner
    if isinstance(runner, str) and runner.lower() in ("daskrunner", "dask"):
        return DASK_RUNNER
    return runner


def is_dask(options) -> bool:
    """Whether ``--runner`` is Beam's DaskRunner."""
    runner = runner_name(options)
    return isinstance(runner, str) and runner.endswith("DaskRunner")


def is_dataflow(options) -> bool:
    """Whether ``--runner`` is Dataflow's runner."""
    runner = runner_name(options)
    return isinstance(runner, str) and runner.endswith("DataflowRunner")


def is_local_runner(options) -> bool:
    """Whether the run is local (no ``--runner``, or a direct runner's name)."""
    return runner_name(options) in LOCAL_RUNNERS


def make_runner(options: PipelineOptions):
    """The runner to build the pipeline with: the FnApiRunner for local runs (no Prism download),
    our DaskRunner for Dask (``dask_runner``), else the ``--runner`` name for Beam to create."""
    runner = runner_name(options)
    if runner in LOCAL_RUNNERS:
        from apache_beam.runners.portability.fn_api_runner import FnApiRunner

        return FnApiRunner()
    if runner == DASK_RUNNER:
        return dask_runner()
    return runner


def dask_runner():
    """Beam's DaskRunner (needs dask and distributed), with a scheduler that does not answer
    reported in one line naming its address (UsageError) instead of distributed's three
    chained tracebacks."""
    from apache_beam.runners.dask.dask_runner import DaskOptions, DaskRunner

    class ConnectingDaskRunner(DaskRunner):
        def run_pipeline(self, pipeline, options):
            try:
                return super().run_pipeline(pipeline, options)
            except OSError as error:  # distributed: "Timed out trying to connect to ... after N s"
                if "connect" not in str(error):
                    raise
                dask = options.view_as(DaskOptions)
                where = (
                    f"--dask_client_address {dask.address}"
                    if dask.address
                    else f"--dask_scheduler_file {dask.scheduler_file}"
                )
                waited = (
                    f"within {dask.timeout} s"
                    if isinstance(dask.timeout, (int, float))
                    else "in time"
                )
                raise UsageError(
                    f"{where}: no Dask scheduler answered {waited} (is it running and reachable "
                    "from here? --dask_connection_timeout sets the wait)"
                ) from None

    return ConnectingDaskRunner()


def graph_defaults(options: PipelineOptions) -> PipelineOptions:
    """For every runner, skip Beam's construction-time type check of the template's graph
    unless asked for: its types are fixed and tested, so the check can find nothing, and
    it cost 0.05 s of every run's start (it builds Beam's option parser dozens of times)."""
    if "pipeline_type_check" not in given_options(options):
        options.view_as(TypeOptions).pipeline_type_check = False
    return options


def dask_defaults(options: PipelineOptions, units: int) -> PipelineOptions:
    """Dask's Create puts up to 128 elements in one partition and Beam's Reshuffle is a
    no-op there, so without ``--dask_npartitions`` every source (and, after the
    GroupByKey, every pile) would be handled by one task: default to one partition per
    unit of pass 1's work (``units``: a run's groups of input files), at most 64. A scheduler
    to connect to gets ``DASK_CONNECT_SECONDS`` unless ``--dask_connection_timeout`` says
    otherwise."""
    from apache_beam.runners.dask.dask_runner import DaskOptions

    dask = options.view_as(DaskOptions)
    if not dask.npartitions and not dask.partition_size:
        dask.npartitions = max(1, min(units, _DASK_MAX_DEFAULT_PARTITIONS))
    if (
        dask.address or dask.scheduler_file
    ) and dask.timeout is None:  # not a LocalCluster, which starts processes
        dask.timeout = DASK_CONNECT_SECONDS
    return options


def should_wait(options, wait) -> bool:
    """Local and Dask runs wait for the result (a Dask job lives only while its client
    does). Dataflow runs do not: the flex template launcher runs this program only to
    submit the job and must not block on it (and in a template launch there is no job
    to wait for yet); Beam's ``--no_wait_until_finish`` also turns waiting off."""
    if wait is not None:
        return bool(wait)
    if is_dataflow(options):
        return False
    return (
        is_local_runner(options)
        or is_dask(options)
        or not options.view_as(StandardOptions).no_wait_until_finish
    )


def outliving_job(options, wait=None):
    """The name of the job this launch submits and leaves running (Dataflow, not waited for),
    which holds the output's lock after the launcher returns; None when this process runs or
    waits for the job, or builds a template (no job runs)."""
    if (
        not is_dataflow(options)
        or should_wait(options, wait)
        or options.view_as(GoogleCloudOptions).template_location
    ):
        return None
    return options.view_as(GoogleCloudOptions).job_name


def close_client(result, cancel=False):
    """Close the Dask client a DaskRunner result holds (the cluster keeps running); after a
    failure, first cancel the run's tasks that have not started (tasks already running on
    workers finish, so a failed Dask run may leave fragments that the next run removes)."""
    client = getattr(result, "client", None)
    if client is None or not hasattr(client, "close"):
        return
    try:
        if cancel:
            client.cancel(result.futures)
        client.close()
    except Exception:  # best effort
        pass


def new_pipeline(options, units: int) -> beam.Pipeline:
    """A pipeline on the runner ``options`` name (on Dask with ``dask_defaults`` for ``units``).
    Beam checks the runner's options here (Dataflow's project, region and locations): what it
    refuses is one line (``UsageError``)."""
    if is_dask(options):
        dask_defaults(options, units)
    try:
        return beam.Pipeline(runner=make_runner(options), options=graph_defaults(options))
    except ValueError as error:
        text = str(error)
        if not text.startswith("Pipeline has validations errors"):
            raise
        problems = " ".join(line.strip() for line in text.splitlines()[1:] if line.strip())
        raise UsageError(f"the runner refused its options: {problems}") from None


def execute(options, build, units: int, on_failure=None, wait=None, showing=None):
    """Build the graph ``build(pipeline)`` adds on the runner ``options`` name (``units``: pass
    1's units of work, Dask's partitions) and run it; wait for it when its runner is waited for
    (``should_wait``): returns Beam's result when it is not, else None. ``showing``: a
    ``progress.showing`` held while it runs. On failure ``on_failure(error)`` cleans up and may
    return the error to raise instead; our own errors come out unwrapped from the runner's
    (in-process runners wrap or rename them)."""
    pipeline = new_pipeline(options, units)
    try:
        build(pipeline)
    except BaseException:
        # Beam makes a local folder for every pipeline, removed only by ``run``
        shutil.rmtree(pipeline.local_tempdir, ignore_errors=True)
        raise
    held = types.SimpleNamespace(ours=False)
    holding = (
        _worker_stderr(held)
        if HOLD_WORKER_STDERR["on"] and is_local_runner(options)
        else contextlib.nullcontext()
    )
    with showing or contextlib.nullcontext(), holding:
        try:
            interrupt.allow_writes()
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
            if is_local_runner(options):  # its other bundles may still run: they write nothing more
                interrupt.stop_writes()
            replacement = on_failure(error) if on_failure else None
            if replacement is not None:
                raise replacement from error
            ours = unwrapped(error)
            if ours is not None and ours is not error:
                raise ours from error
            raise


def shows_progress(options) -> bool:
    """Progress is counted in this process: local runs whose DoFns run here (not in the
    local runner's multi_processing worker processes)."""
    return (
        is_local_runner(options)
        and options.view_as(DirectOptions).direct_running_mode != "multi_processing"
    )


@contextlib.contextmanager
def _worker_stderr(state):
    """Hold what is written to file descriptor 2 while a local pipeline runs: the local
    runner's worker processes print their own tracebacks there. It is passed on
    afterwards, except when the run failed with one of our errors (``state.ours``): then
    only our own lines are, ``main`` reports the error in one line, and what the runner's
    threads still print (bundles refused once the run failed: ``interrupt.stop_writes``) is
    dropped: file descriptor 2 goes to /dev/null, ``sys.stderr`` to the real stderr."""
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
            # the runner's threads may still fail noisily:
            if state.ours and _writes_to_fd_2(sys.stderr):
                # our lines go to the real stderr,
                sys.stderr = os.fdopen(os.dup(saved), "w", buffering=1)
                null = os.open(os.devnull, os.O_WRONLY)  # file descriptor 2 stays quiet
                os.dup2(null, 2)
                os.close(null)
            else:
                os.dup2(saved, 2)
            os.close(saved)
            capture.seek(0)
            text = capture.read().decode(errors="replace")
            if state.ours:
                text = "".join(
                    line for line in text.splitlines(keepends=True) if _OWN_LINE.match(line)
                )
            sys.stderr.write(text)
            sys.stderr.flush()


def _writes_to_fd_2(stream) -> bool:
    """Whether ``stream`` writes to file descriptor 2 (the command line's; not a test's capture)."""
    try:
        return stream.fileno() == 2
    except (AttributeError, OSError, ValueError):
        return False


_OWN_LINE = re.compile(r"^(?:pileshuffle|[A-Z]+ pileshuffle[\w.]*): ")  # our prints and loggers
