"""Three promises of docs/guarantees.md that had no test (issue 54), each checked on the real
command line over real files:

- a lock held from another host is never taken over, even when its pid runs nowhere here
  (``FileLock._stale``): the output's lock and a store's ``LOCK`` alike;
- a signal the caller ignores stays ignored (``interrupt.handling``): ``pileshuffle run`` started
  by ``nohup`` (SIGHUP ignored) or as a background job of a non-interactive shell (SIGINT ignored)
  finishes and publishes while that signal keeps coming;
- a second Ctrl-C exits at once (``interrupt._on_sigint``): while the first one waits for a
  shard that is being written (here: never finishes), the second ends the run with code 130 and
  its one line; what it leaves (its lock, its staging folder) the same command run again removes.

Each fails with its guard removed (checked by hand, see issue 54's note).
"""

import glob
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
from helpers import final_outputs, refused, run_shuffle, shard_bytes, succeeded, temp_leftovers

from pileshuffle.commands import sample

PY = sys.executable
SEED_OPTIONS = ["--seed=3", "--num_piles=4"]
HANG_SECONDS = 120  # against hangs only: each command here ends in seconds


def dead_pid() -> int:
    """The pid of a process that has ended (no process runs under it now)."""
    process = subprocess.Popen([PY, "-c", "pass"])
    process.wait()
    return process.pid


def default_signals():
    """The child starts with SIGINT, SIGTERM and SIGHUP at their defaults, as from a terminal (a
    test runner started in the background or by nohup would pass its SIG_IGN on)."""
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)


def cli(*argv):
    done = subprocess.run(
        [PY, "-m", "pileshuffle", *argv],
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=default_signals,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Input files (10 MB) and the shards of a run over them that nothing disturbed."""
    root = tmp_path_factory.mktemp("signals")
    sample.write_tfrecord(str(root / "in"), records=20_000, files=4, record_bytes=500)
    run_shuffle(str(root / "in" / "*.tfrecord"), str(root / "reference" / "data"), *SEED_OPTIONS)
    return root


def inputs(data):
    return str(data / "in" / "*.tfrecord")


def reference(data):
    return shard_bytes(str(data / "reference" / "data"))


# --- a lock held from another host ---------------------------------------------------------

SINCE = "2026-12-06T10:00:00.000000Z"
LOCKS = {  # layout -> (where its lock is, how a refusal names the holder)
    "shards": (
        "{p}.pileshuffle-lock",
        "output {p} is locked by a run started at {since} (pid {pid} on {host}: `{cmd}`)",
    ),
    "store": (
        "{p}-store/LOCK",
        "{p}-store is locked by `{cmd}` (pid {pid} on {host}, since {since})",
    ),
}


def write_lock(path: str, host: str, pid: int):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    holder = {
        "command": "pileshuffle run --input a --output b",
        "host": host,
        "pid": pid,
        "since": SINCE,
        "token": "t",
    }
    with open(path, "w") as handle:
        json.dump(holder, handle)
    return holder


@pytest.mark.parametrize("layout", LOCKS)
def test_a_lock_held_from_another_host_is_never_taken_over(data, tmp_path, capsys, layout):
    """Its pid runs nowhere here, which on this host would make it stale: the host alone decides.
    The same lock naming this host is taken over (the pid is really gone)."""
    prefix = str(tmp_path / "out" / "data")
    where, refusal = LOCKS[layout]
    lock, pid = where.format(p=prefix), dead_pid()
    argv = [
        "run",
        f"--input={inputs(data)}",
        f"--output={prefix}",
        f"--layout={layout}",
        "--quiet",
        *SEED_OPTIONS,
    ]
    holder = write_lock(lock, "another-host.example", pid)
    before = open(lock, "rb").read()
    line = refused(capsys, *argv)
    named = refusal.format(
        p=prefix, since=SINCE, pid=pid, host=holder["host"], cmd=holder["command"]
    )
    assert named in line, line
    assert open(lock, "rb").read() == before
    assert final_outputs(prefix) == [] and not glob.glob(f"{prefix}-store/manifest-*")
    assert [p for p in temp_leftovers(str(tmp_path)) if p != lock] == []  # no work folder begun
    write_lock(lock, socket.gethostname(), pid)
    succeeded(capsys, *argv)
    assert not os.path.exists(lock)


# --- a signal the caller ignores ----------------------------------------------------------


class Ignoring:
    """``pileshuffle ARGV`` started the way a caller that ignores ``signum`` starts it: SIGHUP by
    ``nohup``, SIGINT as a background job of a non-interactive shell (``sh -c 'cmd &'``).
    ``pid``: the pileshuffle process; ``process``: what the test waits for."""

    def __init__(self, signum, argv):
        command = [PY, "-m", "pileshuffle", *argv]
        if signum == signal.SIGHUP:
            self.process = subprocess.Popen(
                ["nohup", *command],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
                preexec_fn=default_signals,
            )
            self.pid = self.process.pid  # nohup execs the command
        else:
            in_background = ["sh", "-c", '"$@" >/dev/null & echo $!; wait $!', "sh", *command]
            self.process = subprocess.Popen(
                in_background,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                preexec_fn=default_signals,
            )
            self.pid = int(self.process.stdout.readline())

    def ignores(self, signum) -> bool:
        """Whether the pileshuffle process has ``signum`` ignored (its SigIgn mask)."""
        with open(f"/proc/{self.pid}/status") as status:
            mask = next(int(line.split()[1], 16) for line in status if line.startswith("SigIgn:"))
        return bool(mask & (1 << (signum - 1)))


@pytest.mark.parametrize(
    "signum", [signal.SIGHUP, signal.SIGINT], ids=["nohup-SIGHUP", "background-SIGINT"]
)
def test_a_signal_the_caller_ignores_stays_ignored(data, tmp_path, signum):
    """The signal is sent again and again from the moment the run holds its output's lock until
    it exits: the run finishes, publishes the shards of an undisturbed run and leaves nothing."""
    output = str(tmp_path / "out" / "data")
    argv = [
        "run",
        f"--input={inputs(data)}",
        f"--output={output}",
        "--quiet",
        "--memory=1MiB",
        *SEED_OPTIONS,
    ]
    run, sent = Ignoring(signum, argv), 0
    deadline = time.time() + HANG_SECONDS
    while not os.path.exists(f"{output}.pileshuffle-lock") and run.process.poll() is None:
        assert time.time() < deadline, "never started"
        time.sleep(0.002)
    still_ignored = run.ignores(signum)  # run's own handlers are in place by now
    while run.process.poll() is None:
        assert time.time() < deadline, "did not finish"
        os.kill(run.pid, signum)
        sent += 1
        time.sleep(0.02)
    stderr = run.process.stderr.read()
    assert sent >= 1
    assert run.process.returncode == 0, stderr[-3000:]
    assert "interrupted" not in stderr, stderr
    assert still_ignored
    assert shard_bytes(output) == reference(data)
    assert temp_leftovers(str(tmp_path / "out")) == []


# --- a second Ctrl-C ----------------------------------------------------------------------

# ``pileshuffle ARGV`` whose pass 2 writes a shard that never ends (a worker thread stays inside
# its writing step), with no fallback timers: only a second Ctrl-C can end it once the first one
# waits for that step. Two files are created to show where it is: ``blocked`` once a worker is
# inside the step, ``waiting`` once the first Ctrl-C has been taken and waits for it.
STUCK_SHARD = r"""
import sys
import threading

from pileshuffle import interrupt
from pileshuffle.formats import get_format

blocked, waiting = sys.argv[1], sys.argv[2]
interrupt._STEP_WAIT_SECONDS = interrupt._UNWIND_SECONDS = 3600.0


def shard_that_never_ends(self, handle, tables, compression, schema=None):
    open(blocked, "w").close()
    threading.Event().wait()


type(get_format("tfrecord")).write_shard = shard_that_never_ends
wait_for_steps = interrupt._wait_for_other_threads_steps


def observed_wait():
    open(waiting, "w").close()
    wait_for_steps()


interrupt._wait_for_other_threads_steps = observed_wait
sys.argv = ["pileshuffle", *sys.argv[3:]]
from pileshuffle.cli import entry

entry()
"""


def wait_for(path, process, lines):
    deadline = time.time() + HANG_SECONDS
    while not os.path.exists(path):
        assert process.poll() is None, f"ended before it got there: {''.join(lines)[-3000:]}"
        assert time.time() < deadline, f"never got to {path}"
        time.sleep(0.002)


def test_a_second_ctrl_c_exits_at_once(data, tmp_path):
    """The first Ctrl-C waits for the shard being written; the second ends the process with code
    130 and one line saying nothing was published. Nothing is published; the lock and staging it
    had no time to remove are there, and the same command run again removes them and writes the
    shards of an undisturbed run."""
    output = str(tmp_path / "out" / "data")
    # pass 2's shards in worker threads
    argv = [
        "run",
        f"--input={inputs(data)}",
        f"--output={output}",
        "--quiet",
        "--direct_num_workers=2",
        *SEED_OPTIONS,
    ]
    blocked, waiting = str(tmp_path / "blocked"), str(tmp_path / "waiting")
    process = subprocess.Popen(
        [PY, "-c", STUCK_SHARD, blocked, waiting, *argv],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=default_signals,
    )
    lines = []
    reader = threading.Thread(target=lambda: lines.extend(process.stderr), daemon=True)
    reader.start()
    try:
        wait_for(blocked, process, lines)
        process.send_signal(signal.SIGINT)
        wait_for(waiting, process, lines)
        assert process.poll() is None  # the first Ctrl-C waits for the step under way
        process.send_signal(signal.SIGINT)
        code = process.wait(timeout=HANG_SECONDS)
    except subprocess.TimeoutExpired:
        raise AssertionError("the second Ctrl-C did not end the process") from None
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    reader.join(timeout=10)
    assert code == 130, "".join(lines)[-3000:]
    said = f"pileshuffle run: interrupted; nothing was published at {output}"
    assert lines and lines[-1].startswith(said), lines
    assert "Traceback" not in "".join(lines), lines
    assert final_outputs(output) == []
    assert os.path.exists(f"{output}.pileshuffle-lock")  # no clean-up: it exited at once
    assert os.path.isdir(f"{output}.pileshuffle-staging")
    cli(*argv)
    assert shard_bytes(output) == reference(data)
    assert temp_leftovers(str(tmp_path / "out")) == []
