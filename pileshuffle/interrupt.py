"""Ctrl-C in a command: one line on stderr, exit code 130, nothing half published, no
temp file left behind. SIGTERM (what ``timeout``, Docker, Kubernetes and Slurm send) and
SIGHUP (a closed terminal) are handled alike, with exit codes 143 and 129 (128 + the signal).

``handling(command)`` wraps a command-line command (``cli.entry``). The local runner runs
DoFns in worker threads that go on after Ctrl-C stops the main thread, so:
- every step that changes files runs inside ``writing()`` (temp files: fragments, staged
  shards, store files) or ``publishing()`` (what makes a result visible: renames into
  place, a manifest written last). Ctrl-C first lets no such step start, in any thread,
  then waits until the steps other threads are inside have ended; a step the main thread
  is publishing in finishes before Ctrl-C takes effect. So a result is published whole or
  not at all, and once the command unwinds no thread writes any more;
- ``KeyboardInterrupt`` then unwinds the main thread, so the command's own ``except`` /
  ``finally`` clean-up runs as for any failure (temp and staging folders, an unpublished
  store generation, locks) with nothing writing beside it;
- from Ctrl-C on nothing reaches stderr (the runner's threads fail noisily once nobody
  drives them) except, at the end, one line saying what was interrupted; the process then
  exits at once with ``EXIT_CODE`` (running threads do not keep it alive). A second
  Ctrl-C exits at once.
Whatever a command leaves when it is killed outright, the same command run again removes
(``plan.make_plan``, ``store.layout.remove_unpublished``, stale locks), so an interrupt
never changes what a re-run writes.
"""

import contextlib
import functools
import os
import signal
import sys
import threading
import time

__all__ = [
    "EXIT_CODE",
    "interrupted",
    "describe",
    "writing",
    "writes",
    "publishing",
    "not_cut",
    "handling",
    "message",
    "stop_writes",
    "allow_writes",
]

EXIT_CODE = 130  # 128 + SIGINT: what a shell reports for a command Ctrl-C stopped
_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # each stops a command as Ctrl-C does
_STEP_WAIT_SECONDS = 60.0  # Ctrl-C waits this long at most for other threads' steps to end
_WAIT_SLICE_SECONDS = 0.1  # ... in waits this long, so that a second signal is acted on
_UNWIND_SECONDS = 10.0  # then the command's clean-up; past this the process exits anyway


class _State:
    command = None  # the command's name, e.g. "run"
    stderr = None  # a duplicate of file descriptor 2 taken before any redirection
    unfinished = None  # what the line says when nothing was published (``describe``)
    finished = None  # what it says when the result was published before Ctrl-C came
    interrupted = False
    signum = signal.SIGINT  # the signal that stopped the command: its exit code is 128 + it
    published = False
    steps = {}  # thread id -> how many writing steps it is inside
    not_cut_main = False  # the main thread is inside a step Ctrl-C does not cut (``not_cut``)
    deferred = False  # Ctrl-C came then: it takes effect when that step ends
    stopped = False  # a run failed: its runner's threads start no writing step (``stop_writes``)
    lines = None  # sys.stderr while the command runs (``_LineEnds``)


class _LineEnds:
    """``sys.stderr`` as it was, remembering whether what was written last ended a line (a
    ``print`` is two writes: Ctrl-C can come between the text and its newline)."""

    def __init__(self, stream):
        self._stream, self.at_line_start = stream, True

    def write(self, text):
        if text:
            self.at_line_start = text.endswith(("\n", "\r"))
        return self._stream.write(text)

    def __getattr__(self, name):
        return getattr(self._stream, name)


_steps = threading.Condition()  # guards ``_State.steps`` and ``_State.interrupted``


def interrupted() -> bool:
    """Whether Ctrl-C has come."""
    return _State.interrupted


def describe(unfinished: str, finished: str = None):
    """What the interrupted command's line says: ``unfinished`` when it published nothing
    (name what it would have published, and what running it again does), ``finished`` when
    its result was published before Ctrl-C came."""
    _State.unfinished, _State.finished = unfinished, finished


@contextlib.contextmanager
def writing():
    """A step that changes files. Raises ``KeyboardInterrupt`` instead of starting once
    Ctrl-C has come; Ctrl-C's clean-up waits for it to end (in a thread that is not the
    main thread: the main thread's own step is cut by the ``KeyboardInterrupt``)."""
    me = threading.get_ident()
    with _steps:
        if _State.interrupted:
            raise KeyboardInterrupt("interrupted (Ctrl-C)")
        if _State.stopped and threading.current_thread() is not threading.main_thread():
            raise RuntimeError("the run has failed: its workers write nothing more")
        _State.steps[me] = _State.steps.get(me, 0) + 1
    try:
        yield
    finally:
        with _steps:
            _State.steps[me] -= 1
            if not _State.steps[me]:
                del _State.steps[me]
            _steps.notify_all()


def writes(function):
    """``function`` (not a generator) as one ``writing()`` step."""

    @functools.wraps(function)
    def step(*args, **kwargs):
        with writing():
            return function(*args, **kwargs)

    return step


def stop_writes():
    """A run failed in the main thread while the local runner's worker threads may still run
    its other bundles: from now on no writing step starts outside the main thread (until
    ``allow_writes``, as the next run starts), and those under way are waited for, so the
    clean-up that follows removes everything the failed run wrote."""
    with _steps:
        _State.stopped = True
        _wait_for_other_threads_steps()


def _wait_for_other_threads_steps():
    """Under ``_steps``: wait (at most ``_STEP_WAIT_SECONDS``) until no other thread is inside a
    writing step."""
    me = threading.get_ident()
    deadline = time.monotonic() + _STEP_WAIT_SECONDS
    # in slices: a second signal the kernel hands to another thread wakes no wait of the main
    # thread, whose handler runs only when it is back in Python (a second Ctrl-C hung 1 run in 6)
    while any(n for thread, n in _State.steps.items() if thread != me):
        left = deadline - time.monotonic()
        if left <= 0:
            return
        _steps.wait(min(left, _WAIT_SLICE_SECONDS))


def allow_writes():
    """A run starts: its workers may write (``stop_writes`` ended a failed one's)."""
    _State.stopped = False


@contextlib.contextmanager
def publishing():
    """A ``writing()`` step that makes the command's result visible: Ctrl-C takes effect
    before it starts or after it has ended, never in between, also in the main thread."""
    with writing(), not_cut():
        yield
        _State.published = True


@contextlib.contextmanager
def not_cut():
    """A main-thread step that Ctrl-C does not cut (a publication, releasing a lock): a
    Ctrl-C that comes inside it takes effect once it has ended. Unlike ``writing()`` it also
    runs after Ctrl-C came: the clean-up that releases a lock is such a step."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    outer, _State.not_cut_main = _State.not_cut_main, True
    try:
        yield
    finally:
        _State.not_cut_main = outer
    if not outer and _State.deferred:
        _State.deferred = False
        _interrupt()


@contextlib.contextmanager
def handling(command: str):
    """Run a command's ``main`` so that Ctrl-C, SIGTERM and SIGHUP end it as this module says.
    A signal that is ignored or handled by someone else (a background job, ``nohup``, an
    embedding program) is left alone; outside the main thread nothing is done."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    defaults = {
        signal.SIGINT: signal.default_int_handler,
        signal.SIGTERM: signal.SIG_DFL,
        signal.SIGHUP: signal.SIG_DFL,
    }
    ours = [s for s in _SIGNALS if signal.getsignal(s) is defaults[s]]
    if not ours:
        yield
        return
    _State.command, _State.stderr, _State.published = command, os.dup(2), False
    previous, stream = {s: signal.signal(s, _on_sigint) for s in ours}, sys.stderr
    sys.stderr = _State.lines = _LineEnds(stream)
    try:
        yield
    except BaseException:
        if _State.interrupted:
            _exit()
        raise
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
        if sys.stderr is _State.lines:
            sys.stderr = stream
    if _State.interrupted:  # a command that caught the interrupt and returned
        _exit()


def _on_sigint(signum, frame):
    if _State.interrupted:  # a second Ctrl-C: stop waiting and cleaning up
        if not _State.not_cut_main:
            _exit()
        return
    _State.signum = signum
    _silence()
    if _State.not_cut_main:  # let the main thread finish that step first
        _State.deferred = True
        return
    _interrupt()


def _interrupt():
    """Let no step start, wait for other threads' steps to end, then unwind the main thread."""
    with _steps:
        _State.interrupted = True
        _wait_for_other_threads_steps()
    watchdog = threading.Timer(_UNWIND_SECONDS, _exit)
    watchdog.daemon = True
    watchdog.start()
    raise KeyboardInterrupt


def _silence():
    """Nothing but the final line reaches stderr any more: not the runner's logging, not
    threads' tracebacks, not what is written to ``sys.stderr`` or file descriptor 2."""
    import logging

    logging.disable(logging.CRITICAL)
    threading.excepthook = lambda args: None
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 2)
        os.close(null)
        sys.stderr = open(os.devnull, "w")
    except OSError:
        pass


def message() -> str:
    """The one line: what was interrupted, and whether it had published its result."""
    name = f"pileshuffle {_State.command}" if _State.command else "pileshuffle"
    if _State.signum != signal.SIGINT:
        name += f" ({signal.Signals(_State.signum).name})"
    if _State.published:
        return f"{name}: interrupted after {_State.finished or 'it had published its result'}"
    return (
        f"{name}: interrupted; {_State.unfinished}" if _State.unfinished else f"{name}: interrupted"
    )


def _exit():
    """Write the one line and end the process now (threads still running included)."""
    try:
        start = "" if _State.lines is None or _State.lines.at_line_start else "\n"
        os.write(
            _State.stderr if _State.stderr is not None else 2, (start + message() + "\n").encode()
        )
    except OSError:
        pass
    os._exit(128 + _State.signum)
