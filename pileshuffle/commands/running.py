"""Running a built pipeline as every command does: on the runner its options name, waited for
or not (Dataflow is submitted and left), with progress, our errors unwrapped from the
runner's, and the local workers' stderr held back when the error is one of ours."""

import contextlib
import os
import re
import sys
import tempfile
import types

import apache_beam as beam
from apache_beam.options.pipeline_options import DirectOptions

from pileshuffle import interrupt
from pileshuffle.errors import UsageError, unwrapped, user_message
from pileshuffle.planning.runners import close_client, is_local, should_wait

__all__ = ["run_pipeline", "new_pipeline", "shows_progress", "HOLD_WORKER_STDERR", "execute"]


def run_pipeline(pipeline, options, wait, hold_worker_stderr, on_failure, showing=None):
    """Run ``pipeline`` and wait for it when its runner is waited for (``should_wait``);
    returns Beam's result when it is not, else None. On failure ``on_failure(error)``
    cleans up and may return the error to raise instead; our own errors come out
    unwrapped from the runner's (in-process runners wrap or rename them)."""
    held = types.SimpleNamespace(ours=False)
    holding = (
        _worker_stderr(held)
        if hold_worker_stderr and is_local(options)
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
            if is_local(options):  # its other bundles may still run: they write nothing more
                interrupt.stop_writes()
            replacement = on_failure(error)
            if replacement is not None:
                raise replacement from error
            ours = unwrapped(error)
            if ours is not None and ours is not error:
                raise ours from error
            raise


def new_pipeline(options) -> beam.Pipeline:
    """A pipeline on the runner ``options`` name. Beam checks the runner's options here
    (Dataflow's project, region and locations): what it refuses is one line (``UsageError``)."""
    from pileshuffle.planning.runners import graph_defaults, make_runner

    try:
        return beam.Pipeline(runner=make_runner(options), options=graph_defaults(options))
    except ValueError as error:
        text = str(error)
        if not text.startswith("Pipeline has validations errors"):
            raise
        problems = " ".join(line.strip() for line in text.splitlines()[1:] if line.strip())
        raise UsageError(f"the runner refused its options: {problems}") from None


def shows_progress(options) -> bool:
    """Progress is counted in this process: local runs whose DoFns run here (not in the
    local runner's multi_processing worker processes)."""
    return (
        is_local(options)
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
            if state.ours and _writes_to_fd_2(
                sys.stderr
            ):  # the runner's threads may still fail noisily:
                sys.stderr = os.fdopen(
                    os.dup(saved), "w", buffering=1
                )  # our lines go to the real stderr,
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


_OWN_LINE = re.compile(
    r"^(?:pileshuffle|[A-Z]+ pileshuffle[\w.]*): "
)  # our prints and our loggers' records


HOLD_WORKER_STDERR = {
    "on": False
}  # the command line: report our errors in one line (running._worker_stderr)


def execute(options, build, partitions: int, on_failure=None, wait=None):
    """Run the graph ``build(pipeline)`` adds, on the runner ``options`` name, as ``run``
    does; returns Beam's result when not waited for (Dataflow), else None. ``on_failure()``
    cleans up after a failed pipeline."""

    from pileshuffle.planning.runners import (
        dask_defaults,
        dataflow_defaults,
        is_dask,
        is_dataflow,
        is_local,
        local_defaults,
    )

    if is_local(options):
        options = local_defaults(options)
    if is_dask(options):
        options = dask_defaults(options, partitions)
    if is_dataflow(options):
        options = dataflow_defaults(options)
    pipeline = new_pipeline(options)
    build(pipeline)
    return run_pipeline(
        pipeline, options, wait, HOLD_WORKER_STDERR["on"], lambda error: on_failure and on_failure()
    )
