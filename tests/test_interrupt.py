"""Ctrl-C (issue 19 item 9). The real command line, started as a subprocess on generated
data, gets SIGINT while it works (the moment is found by what the command has started:
its work folder, a staging folder, a store generation, a file it has open), and then:
exit code 130, one line on stderr that names what was interrupted and says nothing was
published, no manifest, no temp file or lock left, and the same command run again writes
exactly the bytes of a run that was never interrupted (interrupted as it publishes: all or
nothing is published, and the line says which). The loader's prefetch thread never holds up the exit of a
process that was interrupted or stopped iterating. Each test failed before the fix
(tracebacks and a killed-by-signal status; the loader waited for the pile being loaded)."""

import glob
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest
from helpers import final_outputs, run_shuffle, shard_bytes, temp_leftovers

from pileshuffle.commands import sample

PY = sys.executable
SIGNAL_EXIT_CODE = 130  # 128 + SIGINT
PILES = 6
SEED_OPTIONS = ["--seed=3", f"--num_piles={PILES}"]


# --- driving a command -----------------------------------------------------------------------


class Interrupted:
    """What a command that got SIGINT did: its exit code, the stderr lines it wrote
    before and after the signal, and how long it took to exit (for messages: bench/exits.py
    times it; the wait for the exit has a limit against a hang only)."""

    def __init__(self, code, before, after, seconds):
        self.code, self.before, self.after, self.seconds = code, before, after, seconds

    def check(self, command: str, *words, code=SIGNAL_EXIT_CODE):
        """Exit code 130 (or ``code``); one line after the signal (at most one more that was
        already on its way), naming the command and saying it was interrupted; no traceback."""
        everything = "".join(self.before + self.after)
        assert self.code == code, (
            self.code,
            f"{self.seconds:.1f} s after the signal",
            everything[-3000:],
        )
        assert "Traceback" not in everything and "KeyboardInterrupt" not in everything, everything[
            -3000:
        ]
        assert 1 <= len(self.after) <= 2, self.after
        last = self.after[-1]
        assert last.startswith(f"pileshuffle {command}: interrupted") or (
            code != SIGNAL_EXIT_CODE and last.startswith(f"pileshuffle {command} (")
        ), last
        for word in words:
            assert word in last, (word, last)


def _no_sigint_inherited():
    """Ctrl-C, SIGTERM and SIGHUP reach the child as they reach a command in a terminal (a test
    runner that ignores them, such as one started with nohup, would otherwise pass that on, and
    pileshuffle leaves an ignored signal alone)."""
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)


def interrupt_when(argv, started, cwd=None, timeout=120, signum=signal.SIGINT) -> Interrupted:
    """Run ``pileshuffle ARGV``; once ``started(pid)`` is true, send SIGINT (or ``signum``)."""
    process = subprocess.Popen(
        [PY, "-m", "pileshuffle", *argv],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        cwd=cwd,
        preexec_fn=_no_sigint_inherited,
    )
    lines = []
    reader = threading.Thread(target=lambda: lines.extend(process.stderr), daemon=True)
    reader.start()
    deadline = time.time() + timeout
    while not started(process.pid):
        assert process.poll() is None, (
            f"finished before it could be interrupted: {''.join(lines)[-2000:]}"
        )
        assert time.time() < deadline, "never started"
        time.sleep(0.002)
    seen = len(lines)
    process.send_signal(signum)
    sent = time.time()
    try:
        code = process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        raise AssertionError("did not exit after SIGINT")
    seconds = time.time() - sent
    reader.join(timeout=10)
    return Interrupted(code, lines[:seen], lines[seen:], seconds)


def exists(pattern):
    return lambda pid: bool(glob.glob(pattern))


def has_open(directory):
    """The process has a file under ``directory`` open (it is reading or writing there)."""
    directory = os.path.realpath(directory)

    def started(pid):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            return False
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}").startswith(directory + os.sep):
                    return True
            except OSError:
                continue
        return False

    return started


def cli(*argv, cwd=None):
    done = subprocess.run(
        [PY, "-m", "pileshuffle", *argv], capture_output=True, text=True, timeout=300, cwd=cwd
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def tree_bytes(directory, skip=()):
    """Every file under ``directory``: relative path -> bytes (names in ``skip`` left out)."""
    found = {}
    for root, _, files in os.walk(directory):
        for name in files:
            if not any(s in name for s in skip):
                path = os.path.join(root, name)
                found[os.path.relpath(path, directory)] = open(path, "rb").read()
    return found


def store_files(prefix):
    """A store's data files (relative path -> bytes): what a generation holds."""
    return tree_bytes(f"{prefix}-store", skip=("manifest-", "LOCK"))


def store_versions(prefix):
    return sorted(os.path.basename(p) for p in glob.glob(f"{prefix}-store/manifest-*.json"))


# --- data ------------------------------------------------------------------------------------

RECORDS, FILES, RECORD_BYTES = 60_000, 4, 500  # 30 MB: a second or so of work for each command


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Input files, and the output of an uninterrupted run over them (in this process)."""
    root = tmp_path_factory.mktemp("interrupt")
    sample.write_tfrecord(str(root / "in"), records=RECORDS, files=FILES, record_bytes=RECORD_BYTES)
    reference = str(root / "reference" / "data")
    run_shuffle(str(root / "in" / "*.tfrecord"), reference, *SEED_OPTIONS)
    return root


def inputs(data):
    return str(data / "in" / "*.tfrecord")


# --- run ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "intermediate, memory", [("files", "1MiB"), ("files", "auto"), ("shuffle", "auto")]
)
def test_run_interrupted_publishes_nothing_and_the_rerun_writes_the_same_bytes(
    data, tmp_path, intermediate, memory
):
    """Files mode with runs on disk (``--memory`` too small to keep any): interrupted in pass 1,
    once the work folder holds runs. Runs kept in memory, and shuffle mode: in pass 2, once the
    staging folder holds a shard."""
    output = str(tmp_path / "out" / "data")
    argv = [
        "run",
        f"--input={inputs(data)}",
        f"--output={output}",
        f"--intermediate={intermediate}",
        *SEED_OPTIONS,
        f"--memory={memory}",
    ]
    started = (
        exists(str(tmp_path / "out" / ".pileshuffle-work-*" / "fragments" / "*"))
        if memory == "1MiB"
        else exists(f"{output}.pileshuffle-staging/shard-*")
    )
    interrupt_when(argv, started).check("run", output, "nothing was published")
    assert final_outputs(output) == []
    assert temp_leftovers(str(tmp_path / "out")) == []  # fragments, staging, the output's lock
    cli(*argv)
    assert shard_bytes(output) == shard_bytes(str(data / "reference" / "data"))
    assert temp_leftovers(str(tmp_path / "out")) == []


@pytest.mark.parametrize("signum, name", [(signal.SIGTERM, "SIGTERM"), (signal.SIGHUP, "SIGHUP")])
def test_run_terminated_or_hung_up_is_stopped_as_ctrl_c_stops_it(data, tmp_path, signum, name):
    """SIGTERM (timeout, Docker, Kubernetes, Slurm) and SIGHUP (a closed terminal) mid-pass-1:
    exit 128 + the signal, one line naming it, nothing published or left (lock, work folder),
    and the re-run writes the bytes of a run never stopped. Before: killed by the signal
    (exit -15), nothing said, the lock and the work folder left."""
    output = str(tmp_path / "out" / "data")
    # runs on disk
    argv = [
        "run",
        f"--input={inputs(data)}",
        f"--output={output}",
        *SEED_OPTIONS,
        "--memory=1MiB",
    ]
    started = exists(str(tmp_path / "out" / ".pileshuffle-work-*" / "fragments" / "*"))
    stopped = interrupt_when(argv, started, signum=signum)
    stopped.check("run", output, "nothing was published", code=128 + signum)
    assert stopped.after[-1].startswith(f"pileshuffle run ({name}): interrupted")
    assert final_outputs(output) == [] and temp_leftovers(str(tmp_path / "out")) == []
    cli(*argv)
    assert shard_bytes(output) == shard_bytes(str(data / "reference" / "data"))


@pytest.mark.parametrize("moment", ["staged", "published"])
def test_run_interrupted_as_it_publishes_publishes_all_or_nothing_and_says_which(
    data, tmp_path, moment
):
    """SIGINT once every shard is staged (the run goes on to rename them into place and
    write the manifest), or once the manifest is in place (the run goes on to clean up):
    either nothing is published or the whole output is, the line says which, and no temp
    file is left."""
    output = str(tmp_path / "out" / "data")
    argv = ["run", f"--input={inputs(data)}", f"--output={output}", *SEED_OPTIONS]
    started = (
        (lambda pid: len(glob.glob(f"{output}.pileshuffle-staging/shard-*.tfrecord")) == PILES)
        if moment == "staged"
        else exists(f"{output}-manifest.json")
    )
    result = interrupt_when(argv, started)
    reference = shard_bytes(str(data / "reference" / "data"))
    if os.path.exists(f"{output}-manifest.json"):
        result.check("run", "after it had published", f"{output}-manifest.json")
        assert shard_bytes(output) == reference
    else:
        result.check("run", "nothing was published")
        assert final_outputs(output) == []
        cli(*argv)
        assert shard_bytes(output) == reference
    assert temp_leftovers(str(tmp_path / "out")) == []


def importing(package):
    """The process has mapped a compiled module of ``package``: it is importing it (a time
    after the start was no such moment on a loaded machine: the signal came before Python ran)."""

    def started(pid):
        try:
            with open(f"/proc/{pid}/maps") as maps:
                return f"/{package}/" in maps.read()
        except OSError:
            return False

    return started


def test_run_interrupted_while_it_starts(data, tmp_path):
    """While Python imports Beam: nothing has been written yet."""
    output = str(tmp_path / "out" / "data")
    argv = ["run", f"--input={inputs(data)}", f"--output={output}", *SEED_OPTIONS]
    interrupt_when(argv, importing("apache_beam")).check("run", "nothing was written")
    assert final_outputs(output) == []
    assert temp_leftovers(str(tmp_path)) == []


# --- stores ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def store(data):
    """A store of the first two input files (generation 0), and one with all four
    (generation 1 appended), built uninterrupted by the command line."""
    files = sorted(glob.glob(inputs(data)))
    first, second = ",".join(files[:2]), ",".join(files[2:])
    base = str(data / "store" / "data")
    cli("run", "--layout=store", f"--input={first}", f"--output={base}", *SEED_OPTIONS)
    full = str(data / "store-full" / "data")
    shutil.copytree(f"{base}-store", f"{full}-store")
    cli("append", f"--store={full}", f"--input={second}")
    return base, full, first, second


def test_run_layout_store_interrupted_publishes_no_version_and_the_rerun_writes_the_same_store(
    data, store, tmp_path
):
    base, _, first, _ = store
    prefix = str(tmp_path / "s" / "data")
    argv = ["run", "--layout=store", f"--input={first}", f"--output={prefix}", *SEED_OPTIONS]
    interrupt_when(argv, exists(f"{prefix}-store/g000000/*")).check(
        "run", f"{prefix}-store", "nothing was published"
    )
    # no version, no generation, no lock: nothing at all
    assert not os.path.exists(f"{prefix}-store")
    cli(*argv)
    assert store_files(prefix) == store_files(base)
    assert store_versions(prefix) == store_versions(base)


def test_a_first_run_layout_store_interrupted_before_its_pipeline_leaves_no_store_folder(
    data, tmp_path
):
    """SIGINT as soon as the store's lock exists (while the pipeline is being built, before
    any generation file): the lock and the folders it created go too."""
    prefix = str(tmp_path / "s" / "data")
    argv = ["run", "--layout=store", f"--input={inputs(data)}", f"--output={prefix}", *SEED_OPTIONS]
    interrupt_when(argv, exists(f"{prefix}-store/LOCK")).check(
        "run", f"{prefix}-store", "nothing was published"
    )
    assert not os.path.exists(tmp_path / "s")


def test_append_interrupted_before_its_pipeline_releases_the_lock(store, tmp_path):
    base, _, _, second = store
    prefix = str(tmp_path / "s" / "data")
    shutil.copytree(f"{base}-store", f"{prefix}-store")
    before = tree_bytes(f"{prefix}-store")
    argv = ["append", f"--store={prefix}", f"--input={second}"]
    interrupt_when(argv, exists(f"{prefix}-store/LOCK")).check(
        "append", f"{prefix}-store", "nothing was published"
    )
    assert tree_bytes(f"{prefix}-store") == before and not os.path.exists(f"{prefix}-store/LOCK")


def test_append_interrupted_leaves_the_store_at_its_version_and_the_rerun_adds_the_same_generation(
    store, tmp_path
):
    base, full, _, second = store
    prefix = str(tmp_path / "s" / "data")
    shutil.copytree(f"{base}-store", f"{prefix}-store")
    before = store_versions(prefix)
    argv = ["append", f"--store={prefix}", f"--input={second}"]
    interrupt_when(argv, exists(f"{prefix}-store/g000001/*")).check(
        "append", f"{prefix}-store", "version 1"
    )
    assert store_versions(prefix) == before
    assert not os.path.exists(f"{prefix}-store/LOCK") and not os.path.exists(
        f"{prefix}-store/g000001"
    )
    cli(*argv)
    assert store_files(prefix) == store_files(full)
    assert store_versions(prefix) == store_versions(full)


def test_materialize_interrupted_publishes_nothing_and_the_rerun_writes_the_same_bytes(
    store, tmp_path
):
    base, _, _, _ = store
    reference = str(tmp_path / "reference" / "data")
    cli("materialize", f"--store={base}", f"--output={reference}")
    output = str(tmp_path / "out" / "data")
    argv = ["materialize", f"--store={base}", f"--output={output}"]
    result = interrupt_when(argv, exists(f"{output}.pileshuffle-staging/shard-*"))
    result.check("materialize", output, "nothing was published")
    assert final_outputs(output) == []
    assert temp_leftovers(str(tmp_path / "out")) == []
    cli(*argv)
    assert shard_bytes(output) == shard_bytes(reference)
    assert temp_leftovers(str(tmp_path / "out")) == []


# --- commands that read ------------------------------------------------------------------------


def test_verify_interrupted_says_so_in_one_line_and_changes_nothing(data):
    reference = str(data / "reference" / "data")
    before = tree_bytes(str(data / "reference"))
    argv = ["verify", f"--input={inputs(data)}", f"--output={reference}"]
    # cut while it re-reads the input: a shard is read in one map and checked from memory
    interrupt_when(argv, has_open(str(data / "in"))).check("verify", "changes nothing")
    assert tree_bytes(str(data / "reference")) == before


def test_quality_interrupted_writes_no_report(data, tmp_path):
    report = tmp_path / "report"
    argv = [
        "quality",
        f"--input={inputs(data)}",
        f"--output={data / 'reference' / 'data'}",
        f"--report={report}",
    ]
    interrupt_when(argv, has_open(str(data / "in"))).check("quality", str(report), "no report")
    assert not report.exists() or os.listdir(report) == []


# --- the loader's prefetch thread --------------------------------------------------------------

SLOW_LOADER = r"""
import sys, threading
import pyarrow.fs as pafs
from pileshuffle.loader import ShuffledDataset

class FarAway(pafs.FileSystemHandler):
    '''The local disk, where the first pile opened arrives and every other never does.'''
    def __init__(self):
        self.local, self.first, self.stuck = pafs.LocalFileSystem(), None, threading.Event()
    def get_type_name(self): return "far-away"
    def normalize_path(self, path): return path
    def equals(self, other): return self is other
    def get_file_info(self, paths): return self.local.get_file_info(paths)
    def get_file_info_selector(self, selector): return self.local.get_file_info(selector)
    def open_input_stream(self, path): return self.local.open_input_stream(path)
    def open_input_file(self, path):
        if not path.endswith(".json"):
            self.first = self.first or path
            if path != self.first:
                self.stuck.set()
                threading.Event().wait()  # a bucket that never answers
        return self.local.open_input_file(path)
    def create_dir(self, *a): raise OSError("read only")
    delete_dir = delete_dir_contents = delete_root_dir_contents = delete_file = move = copy_file = create_dir
    open_output_stream = open_append_stream = create_dir

prefix, how = sys.argv[1], sys.argv[2]
far = FarAway()
ds = ShuffledDataset(prefix, seed=0, filesystem=pafs.PyFileSystem(far))
records = iter(ds)
next(records)
far.stuck.wait()
print("reading", flush=True)  # the next pile is loading now, and never arrives
if how == "stop":
    records.close()  # a consumer that stops iterating (a break, a return from a loop) and ends
else:
    for record in records:  # waits for the next pile when the first one is used up
        pass
"""


def run_slow_loader(prefix, how):
    """Start the loader script, whose second pile never arrives, and wait for it to exit: it can
    only if nothing waits for that pile (the limit is against a hang)."""
    process = subprocess.Popen(
        [PY, "-c", SLOW_LOADER, prefix, how],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_no_sigint_inherited,
    )
    assert process.stdout.readline() == "reading\n", process.stderr.read()
    if how == "interrupt":
        time.sleep(0.5)  # the first pile is used up by then: it waits for the next one
        process.send_signal(signal.SIGINT)
    try:
        process.wait(timeout=120)
    except subprocess.TimeoutExpired:
        process.kill()
        raise AssertionError("the loader's process waited for a pile that never arrives")
    return process


@pytest.fixture(scope="module")
def piles(data):
    return str(data / "reference" / "data")


def test_an_interrupted_loader_exits_without_waiting_for_the_pile_being_loaded(piles):
    process = run_slow_loader(piles, "interrupt")
    # the script's own
    assert process.returncode != 0 and "KeyboardInterrupt" in process.stderr.read()


def test_a_loader_that_stops_iterating_exits_without_waiting_for_the_pile_being_loaded(piles):
    process = run_slow_loader(piles, "stop")
    assert process.returncode == 0, process.stderr.read()


def test_the_line_starts_on_its_own_line_after_a_print_cut_between_text_and_newline(tmp_path):
    """``print`` writes its text and its newline apart: Ctrl-C between them must not glue the
    interrupt line to the half-printed one (seen once in a full suite run)."""
    script = tmp_path / "cut.py"
    script.write_text(
        "import sys\n"
        "from pileshuffle import interrupt\n"
        "with interrupt.handling('x'):\n"
        "    sys.stderr.write('pileshuffle: a line without its newline')\n"
        "    interrupt._State.interrupted = True\n"
        "    raise KeyboardInterrupt\n"
    )
    # a background job's SIG_IGN would keep handling() out
    done = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=_no_sigint_inherited,
    )
    assert done.returncode == 130
    assert done.stderr.splitlines()[-1] == "pileshuffle x: interrupted", done.stderr


def test_a_closed_stdout_ends_the_command_quietly(data, tmp_path):
    """`pileshuffle plan ... | head` with the reader gone before the plan is printed: no
    BrokenPipeError traceback, nothing on stderr, exit 141 (as a shell reports SIGPIPE). Before:
    a traceback and exit 1."""
    process = subprocess.Popen(
        [PY, "-m", "pileshuffle", "plan", f"--input={inputs(data)}", f"--output={tmp_path}/o"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    process.stdout.close()  # the reader is gone before anything is written
    _, err = process.communicate(timeout=120)
    assert (process.returncode, err.decode()) == (141, "")
