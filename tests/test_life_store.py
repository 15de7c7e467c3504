"""A pile store's whole life as a state machine (hypothesis's ``RuleBasedStateMachine``).

A life creates a store (``run --layout store``), appends generations (sometimes of files a
live generation already holds), expires (keep N, before a time), collects (``gc``),
materializes, runs a plain shard ``run`` to the store's own name, loads epochs through the
loader, verifies, and interrupts any of these at a random point and runs it again.
Commands run in this process through ``pileshuffle.cli.main`` (the command line without a
new process: 0.1-0.4 s each). An interrupted command runs as the command line does
(``cli.entry``, Ctrl-C handling included) in a forked child that gets a real SIGINT at its
N-th entry into pileshuffle's code: any point, and the same one when hypothesis replays the
life (a timer would not be). The loader is interrupted in this process the same way.

The model is a plain mapping: live generation -> the input files it holds; each input file
holds records that carry their index (``pileshuffle.commands.sample``), so the live records are a
multiset of indices (a set, in half of the lives: a store made with ``--dedup exact``, where a
file appended again with ``--allow_duplicate_inputs`` is hidden while an older copy lives). After every step:
- the loader's epoch (``iter(ShuffledDataset(P))``) is exactly the model's multiset;
- every published manifest is complete JSON of its version, the loader opens the newest,
  and it lists exactly the model's generations and their inputs; no manifest read while a
  command ran (they are read every few milliseconds) was ever half written;
- ``verify --output P`` passes, and the store holds nothing but manifests and the
  generation directories they list (no lock, no temporary names, no work folders) once a
  command finished; within the grace period an expired version still reads whole;
- a refused command (exit code 2, one line) changed nothing: the directory's listing and
  bytes are the same.
``materialize`` writes the loader's ``reshuffle=False`` epoch-0 order (docs/stores.md) and
the model's records, and verifies against the live inputs; while the store holds generation
0 alone its shards are the bytes ``run`` writes for the same inputs, seed and piles (the only
byte-equality docs/stores.md promises: appended generations draw their keys from their own
stream). An interrupted command ends with exit code 130, no traceback and one last line;
the store is then at its old state or its new one, and the same command run again ends it
at the new one.

Bounded for ``make test``; ``PILESHUFFLE_LIFE_EXAMPLES=200`` walks many more lives. A failing
life prints as the list of steps hypothesis shrank it to.
"""

import _thread
import collections
import contextlib
import gc
import glob
import io
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import FAST, read_tfrecord_payloads, shard_bytes, shards, temp_leftovers
from hypothesis import HealthCheck, Phase, event, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, initialize, invariant, multiple, rule

from pileshuffle import cli, names
from pileshuffle.commands import sample
from pileshuffle.formats.tfrecord import frame
from pileshuffle.loader import ShuffledDataset
from pileshuffle.store import layout

LIFE_EXAMPLES = int(os.environ.get("PILESHUFFLE_LIFE_EXAMPLES", "16"))
STEPS_PER_LIFE = 12
POOL_FILES = 10  # input files `append` draws from: few, so that appends overlap often
FILE_INDEX_STRIDE = 1000  # file k holds the records whose indices start at k * 1000
RECORD_BYTES = 60
REFUSED = 2  # the exit code of a refused command (pileshuffle.errors)
INTERRUPTED = 130  # the exit code a command may return once Ctrl-C is handled (128 + SIGINT)
SHORT_GRACE, LONG_GRACE = 0, 3600  # grace periods: collect at once / keep every superseded version
# Where a command is interrupted: at its N-th entry into pileshuffle's code (expire and gc
# make about 100, verify 200, append, materialize and run 450-700); None (most steps): not.
INTERRUPT_AT_CALL = st.one_of(
    st.none(), st.none(), st.none(), st.integers(1, 150), st.integers(151, 750)
)
# The option that lets `append` add files a live generation already holds (issue 19 item 12).
DUPLICATES_OPTION = "--allow_duplicate_inputs"


# --- inputs whose records carry their index ------------------------------------------------------


def records_in_file(k: int) -> int:
    # 50-139: files differ in size (append's "same inputs" compares sizes)
    return 50 + (k * 37) % 90


def indices_in_file(k: int) -> range:
    return range(k * FILE_INDEX_STRIDE, k * FILE_INDEX_STRIDE + records_in_file(k))


def write_input(directory: str, fmt: str, k: int) -> str:
    """Input file ``k`` of ``fmt``: the sample generator's records ``indices_in_file(k)``."""
    os.makedirs(directory, exist_ok=True)
    start, count = k * FILE_INDEX_STRIDE, records_in_file(k)
    path = os.path.join(directory, f"f{k:02d}.{fmt}")
    if fmt == "parquet":
        pq.write_table(sample.parquet_table(start, count, RECORD_BYTES), path)
        return path
    payloads = sample.payloads(start, count, RECORD_BYTES, vary=True)
    with open(path, "wb") as handle:
        if fmt == "tfrecord":
            handle.writelines(frame(p) for p in payloads)
        else:  # the sample generator's JSONL line, with this file's indices
            handle.writelines(
                b'{"index": %d, "text": "%s"}\n' % (start + i, p[sample.INDEX_DIGITS + 1 :])
                for i, p in enumerate(payloads)
            )
    return path


def shard_indices(prefix: str, fmt: str) -> list:
    """The indices of a shard output's records in written order, read without the loader."""
    paths = shards(prefix)
    if fmt == "tfrecord":
        return [sample.index_of(p) for p in read_tfrecord_payloads(paths)]
    if fmt == "jsonl":
        return [
            sample.index_of(line) for path in paths for line in open(path, "rb").read().splitlines()
        ]
    return [
        i for path in paths for i in pq.read_table(path, columns=["index"]).column(0).to_pylist()
    ]


# --- running commands ----------------------------------------------------------------------------

Outcome = collections.namedtuple("Outcome", "code stdout stderr")


def pileshuffle(argv) -> Outcome:
    """``pileshuffle ARGV`` in this process; a KeyboardInterrupt comes out as it is."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main(list(argv))
        except SystemExit as done:
            code = done.code
    return Outcome(code, out.getvalue(), err.getvalue())


PACKAGE = os.path.dirname(os.path.abspath(sample.__file__))
CHILD_SECONDS = 120  # an interrupted command that has not exited by then hangs


def on_entering_pileshuffle(at_call: int, act, after=None):
    """A profile function that calls ``act()`` when this thread enters pileshuffle's code
    for the ``at_call``-th time (counting from its entry into the code object ``after``, if
    given): a random point that a replay finds again (a timer would not)."""
    entered, counting = 0, after is None

    def count(frame, event, arg):
        nonlocal entered, counting
        if event != "call" or not frame.f_code.co_filename.startswith(PACKAGE):
            return
        counting = counting or frame.f_code is after
        entered += counting
        if entered == at_call:
            sys.setprofile(None)
            act()

    return count


def interrupted_command(argv, at_call: int, watch=lambda: None) -> Outcome:
    """``pileshuffle ARGV`` exactly as the command line runs it (``cli.entry``, its Ctrl-C
    handling included) in a forked child of this process (Beam is imported already: no
    start-up), sent a real SIGINT when it enters pileshuffle's code the ``at_call``-th time
    from ``cli.main`` on.
    This process calls ``watch()`` every few milliseconds meanwhile."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        pid = os.fork()
        if pid == 0:  # the child: never returns into the test
            code = 1
            try:
                os.dup2(out.fileno(), 1)
                os.dup2(err.fileno(), 2)
                sys.stdout = io.TextIOWrapper(
                    os.fdopen(1, "wb", closefd=False), line_buffering=True
                )
                sys.stderr = io.TextIOWrapper(
                    os.fdopen(2, "wb", closefd=False), line_buffering=True
                )
                sys.argv = ["pileshuffle", *argv]
                # from cli.main on: Ctrl-C while Python starts, before the command's handling is in place,
                # is Python's own KeyboardInterrupt
                sys.setprofile(
                    on_entering_pileshuffle(
                        at_call,
                        lambda: os.kill(os.getpid(), signal.SIGINT),
                        after=cli.main.__code__,
                    )
                )
                cli.entry()
                code = 0
            except SystemExit as done:
                code = done.code if isinstance(done.code, int) else 1
            except BaseException:
                traceback.print_exc()
            finally:
                sys.setprofile(None)
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        deadline = time.time() + CHILD_SECONDS
        while (done := os.waitpid(pid, os.WNOHANG)) == (0, 0):
            if time.time() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                raise AssertionError(
                    f"`pileshuffle {argv[0]}` interrupted at call {at_call} still ran after "
                    f"{CHILD_SECONDS} s: killed"
                )
            watch()
            time.sleep(0.002)
        out.seek(0)
        err.seek(0)
        return Outcome(
            os.waitstatus_to_exitcode(done[1]),
            out.read().decode(errors="replace"),
            err.read().decode(errors="replace"),
        )


def interrupted(call, at_call: int):
    """``call()`` in this process with a KeyboardInterrupt delivered to the main thread
    (``_thread.interrupt_main``) at its ``at_call``-th entry into pileshuffle's code.
    Returns what ``call`` returned, or None if the interrupt came out of it."""
    try:
        try:
            sys.setprofile(on_entering_pileshuffle(at_call, _thread.interrupt_main))
            return call()
        finally:
            sys.setprofile(None)
    except KeyboardInterrupt:
        return None


def snapshot(directory: str) -> dict:
    """Every entry under ``directory``: relative path -> bytes (None for a directory)."""
    found = {}
    for root, dirs, files in os.walk(directory):
        for name in dirs:
            found[os.path.relpath(os.path.join(root, name), directory)] = None
        for name in files:
            path = os.path.join(root, name)
            with open(path, "rb") as handle:
                found[os.path.relpath(path, directory)] = handle.read()
    return found


def changes(before: dict, after: dict) -> list:
    return sorted(
        f"{'+' if p not in before else '-' if p not in after else '~'} {p}"
        for p in set(before) | set(after)
        if before.get(p, 0) != after.get(p, 0)
    )


class ManifestWatcher:
    """While a command runs, reads every ``manifest-*.json`` of the store over and over:
    each must always be whole JSON of the version its name says."""

    def __init__(self, store: str):
        self.store, self.problems = store, []
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._watch, name="life-manifest-watcher", daemon=True
        )

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        return False

    def _watch(self):
        while not self._stop.wait(0.002):
            note_manifest_problems(self.store, self.problems)


def note_manifest_problems(store: str, problems: list):
    for path in glob.glob(os.path.join(store, "manifest-*.json")):
        problem = manifest_problem(path)
        if problem and problem not in problems:
            problems.append(problem)


def manifest_problem(path: str):
    """None if ``path`` is a whole store manifest of the version its name says (or is gone)."""
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except FileNotFoundError:
        return None  # collected meanwhile
    try:
        manifest = json.loads(data)
    except ValueError as error:
        return f"{path}: not whole JSON ({len(data)} bytes: {error})"
    match = names.STORE_MANIFEST_NAME.match(os.path.basename(path))
    if manifest.get("kind") != names.STORE_KIND or manifest.get("version") != int(match.group(1)):
        return f"{path}: kind {manifest.get('kind')!r}, version {manifest.get('version')!r}"
    return None


def command_name(argv) -> str:
    return f"{argv[0]} --layout=store" if "--layout=store" in argv else argv[0]


def check_ctrl_c(argv, outcome: Outcome):
    """What Ctrl-C must leave on the command line: exit code 130, no traceback, and one last
    line naming the command (or the command's own outcome, when it ended before the signal)."""
    event(f"{command_name(argv)} interrupted: exit code {outcome.code}")
    assert outcome.code in (0, REFUSED, INTERRUPTED), (
        f"`pileshuffle {argv[0]}` interrupted: exit code {outcome.code}: {outcome.stderr.strip()[-3000:]}"
    )
    if outcome.code == INTERRUPTED:
        lines = outcome.stderr.strip().splitlines()
        assert (
            lines
            and lines[-1].startswith(f"pileshuffle {argv[0]}: interrupted")
            and "Traceback" not in outcome.stderr
        ), f"`pileshuffle {argv[0]}` interrupted: {outcome.stderr.strip()[-3000:]}"


@pytest.fixture(autouse=True)
def _process_settings_restored():
    """``cli.main`` tunes malloc and Arrow's pool for a command (``tuning.keep_freed_memory``)
    and exports them in the environment: later tests' subprocesses get the suite's back."""
    environ, pool = dict(os.environ), pa.default_memory_pool()
    yield
    os.environ.clear()
    os.environ.update(environ)
    pa.set_memory_pool(pool)


# --- the life ------------------------------------------------------------------------------------

FILES = st.lists(st.integers(0, POOL_FILES - 1), min_size=1, max_size=3, unique=True)


class StoreLife(RuleBasedStateMachine):
    """One store from creation on; ``self.live`` (generation -> input file numbers) is the model."""

    generations = Bundle("generations")

    def __init__(self):
        super().__init__()
        self.root = tempfile.mkdtemp(prefix="pileshuffle-life-")
        self.prefix = os.path.join(self.root, "out", "data")
        self.store = names.store_dir(self.prefix)
        self.live = {}  # generation -> tuple of input file numbers, ascending
        self.created = {}  # every generation ever published -> its "created" time (for --before)
        self.next_generation = 0
        self.used = set()  # input files some generation held
        self.outputs = 0  # materialized outputs so far (each gets its own prefix)
        self.steps = 0

    def teardown(self):
        shutil.rmtree(self.root, ignore_errors=True)

    # --- the model -----------------------------------------------------------------------------
    def input_path(self, k: int) -> str:
        path = os.path.join(self.root, "in", f"f{k:02d}.{self.fmt}")
        return (
            path
            if os.path.exists(path)
            else write_input(os.path.join(self.root, "in"), self.fmt, k)
        )

    def inputs(self, files) -> str:
        return ",".join(self.input_path(k) for k in files)

    def expected(self, live=None) -> collections.Counter:
        """The live records: every record of every live input, or, in a ``--dedup`` store, each once."""
        live = self.live if live is None else live
        found = collections.Counter(
            i for files in live.values() for k in files for i in indices_in_file(k)
        )
        return collections.Counter(set(found)) if self.dedup else found

    def live_files(self) -> list:
        return [k for g in sorted(self.live) for k in self.live[g]]

    def shard_options(self) -> list:
        return [
            f"--format={self.fmt}",
            f"--num_piles={self.piles}",
            f"--seed={self.seed}",
            *FAST,
            *(["--dedup=exact"] if self.dedup else []),
        ]

    def published(self) -> dict:
        """The store's live generations as the current manifest lists them: generation -> input files."""
        manifest = layout.read_store_manifest(self.prefix)
        if manifest is None:
            return {}
        return {
            g["generation"]: tuple(
                sorted(int(os.path.basename(i["path"])[1:].split(".")[0]) for i in g["inputs"])
            )
            for g in manifest["generations"]
        }

    # --- one command, its interrupted attempt and its outcome ----------------------------------
    def command(self, argv, interrupt_at_call, expect_live, refused=False) -> Outcome:
        """Run ``argv`` (first interrupted, then again, if ``interrupt_at_call``); the store
        must end with ``expect_live`` live, or, if ``refused``, unchanged and exit code 2."""
        before, old_live = snapshot(os.path.dirname(self.prefix)), dict(self.live)
        if interrupt_at_call is not None:
            seen = []
            first = interrupted_command(
                argv, interrupt_at_call, lambda: note_manifest_problems(self.store, seen)
            )
            assert not seen, f"a half-written manifest was visible: {seen}"
            self.check_interrupted(argv, first, old_live, expect_live, refused, before)
        with ManifestWatcher(self.store) as watcher:  # a thread: never there when forking
            outcome = pileshuffle(argv)
        assert not watcher.problems, f"a half-written manifest was visible: {watcher.problems}"
        result = "refused" if refused else "unchanged" if expect_live == old_live else "changed"
        event(f"{command_name(argv)}: {result}")
        if refused:
            self.check_refused(outcome, argv, before)
            return outcome
        assert outcome.code == 0, (
            f"`{' '.join(argv[:1])}` failed ({outcome.code}): {outcome.stderr.strip()[-2000:]}"
        )
        assert self.published() == expect_live, (
            f"the store lists {self.published()}, "
            f"the model {expect_live}: {outcome.stderr.strip()[-500:]}"
        )
        self.live = dict(expect_live)
        return outcome

    def check_refused(self, outcome, argv, before):
        assert outcome.code == REFUSED, (
            f"`pileshuffle {argv[0]}` should be refused (exit {REFUSED}), got exit "
            f"{outcome.code}: {outcome.stderr.strip()[-500:]}"
        )
        lines = outcome.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("pileshuffle: error:"), (
            f"not one line: {outcome.stderr}"
        )
        after = snapshot(os.path.dirname(self.prefix))
        assert after == before, f"a refused `{argv[0]}` changed: {changes(before, after)}"

    def check_interrupted(self, argv, outcome, old_live, new_live, refused, before):
        """Right after an interrupted command: it ended (finished, refused, or exit code 130
        and one line), the store is at its old state or the new one, whole, and verifies;
        a command that is refused anyway changed nothing."""
        check_ctrl_c(argv, outcome)
        for path in glob.glob(os.path.join(self.store, "manifest-*.json")):
            assert manifest_problem(path) is None, manifest_problem(path)
        if refused:
            after = snapshot(os.path.dirname(self.prefix))
            assert after == before, (
                f"an interrupted command that is refused changed: {changes(before, after)}"
            )
            return
        now = self.published()
        assert now in (old_live, new_live), (
            f"interrupted: the store lists {now}, neither {old_live} nor {new_live}"
        )
        if now:
            self.check_loader(now)
            self.check_verifies()

    # --- rules ---------------------------------------------------------------------------------
    @initialize(
        target=generations,
        fmt=st.sampled_from(["tfrecord", "jsonl", "parquet"]),
        piles=st.integers(2, 4),
        seed=st.integers(0, 1000),
        files=FILES,
        interrupt_at_call=INTERRUPT_AT_CALL,
        dedup=st.booleans(),
    )
    def create(self, fmt, piles, seed, files, interrupt_at_call, dedup):
        """``run --layout store`` of ``files`` (with ``--dedup exact``: a store that shows each
        record of the window once): generation 0, version 1."""
        self.fmt, self.piles, self.seed, self.dedup = fmt, piles, seed, dedup
        event(f"store: {'dedup' if dedup else 'plain'}")
        self.command(self.create_argv(files), interrupt_at_call, {0: tuple(sorted(files))})
        return self.published_generation(0)

    def create_argv(self, files):
        return [
            "run",
            "--layout=store",
            f"--input={self.inputs(files)}",
            f"--output={self.prefix}",
            *self.shard_options(),
        ]

    @rule(files=FILES, interrupt_at_call=INTERRUPT_AT_CALL)
    def create_again(self, files, interrupt_at_call):
        """``run --layout store`` onto the store: generation 0's inputs while it is alone: nothing
        to do; else refused."""
        again = self.live == {0: tuple(sorted(files))}
        self.command(self.create_argv(files), interrupt_at_call, self.live, refused=not again)

    @rule(target=generations, count=st.integers(1, 3), interrupt_at_call=INTERRUPT_AT_CALL)
    def append_new_files(self, count, interrupt_at_call):
        """``append`` of ``count`` files no generation ever held."""
        fresh = [k for k in range(len(self.used) + count) if k not in self.used][:count]
        return self.append(fresh, False, interrupt_at_call)

    @rule(
        target=generations,
        files=FILES,
        duplicates=st.booleans(),
        interrupt_at_call=INTERRUPT_AT_CALL,
    )
    def append(self, files, duplicates, interrupt_at_call):
        """A new generation; the newest generation's inputs again: nothing to do; files a live
        generation holds: refused unless asked for (issue 19 item 12)."""
        files = tuple(sorted(files))
        argv = ["append", f"--store={self.prefix}", f"--input={self.inputs(files)}", *FAST]
        if duplicates:
            argv.append(DUPLICATES_OPTION)
        newest = self.live[max(self.live)]
        if set(files) == set(newest):
            self.command(argv, interrupt_at_call, self.live)
            return multiple()
        if set(files) & set(self.live_files()) and not duplicates:
            outcome = self.command(argv, interrupt_at_call, self.live, refused=True)
            held = sorted(set(files) & set(self.live_files()))
            assert os.path.basename(self.input_path(held[0])) in outcome.stderr, (
                "the refusal names no file"
            )
            return multiple()
        if set(files) & set(self.live_files()):
            event("append: files a live generation holds, with " + DUPLICATES_OPTION)
        generation = self.next_generation
        self.command(argv, interrupt_at_call, {**self.live, generation: files})
        return self.published_generation(generation)

    def published_generation(self, generation):
        manifest = layout.read_store_manifest(self.prefix)
        listed = next(g for g in manifest["generations"] if g["generation"] == generation)
        self.created[generation] = listed["created"]
        self.used |= set(self.live[generation])
        self.next_generation = generation + 1
        return generation

    @rule(
        keep=st.integers(1, 3),
        grace=st.sampled_from([SHORT_GRACE, LONG_GRACE]),
        interrupt_at_call=INTERRUPT_AT_CALL,
    )
    def expire_keeping(self, keep, grace, interrupt_at_call):
        kept = sorted(self.live)[-keep:]
        self.expire(
            f"--keep_generations={keep}", {g: self.live[g] for g in kept}, grace, interrupt_at_call
        )

    @rule(
        generation=generations,
        grace=st.sampled_from([SHORT_GRACE, LONG_GRACE]),
        interrupt_at_call=INTERRUPT_AT_CALL,
    )
    def expire_before(self, generation, grace, interrupt_at_call):
        """Drop the generations created before ``generation`` was (never the newest: item 14's
        "expire would drop everything" is another rule's business)."""
        cutoff = self.created[generation]
        kept = {g: files for g, files in self.live.items() if self.created[g] >= cutoff}
        self.expire(f"--before={cutoff}", kept, grace, interrupt_at_call)

    def expire(self, option, kept, grace, interrupt_at_call):
        """``expire OPTION`` leaves ``kept``; within the grace period a reader of the version
        before still reads all of it."""
        version, live = layout.manifest_versions(self.prefix)[-1], dict(self.live)
        self.command(
            ["expire", f"--store={self.prefix}", option, f"--grace_seconds={grace}"],
            interrupt_at_call,
            kept,
        )
        self.check_collected(grace)
        if grace == LONG_GRACE:
            self.check_loader(live, version)

    @rule(grace=st.sampled_from([SHORT_GRACE, LONG_GRACE]), interrupt_at_call=INTERRUPT_AT_CALL)
    def collect(self, grace, interrupt_at_call):
        """``gc``."""
        before = sorted(os.listdir(self.store))
        self.command(
            ["gc", f"--store={self.prefix}", f"--grace_seconds={grace}"],
            interrupt_at_call,
            self.live,
        )
        self.check_collected(grace, before)

    def check_collected(self, grace, before=None):
        """With no grace, the store is the current manifest and the live generations' directories;
        with a long one, nothing a superseded version lists is gone."""
        present = sorted(os.listdir(self.store))
        current = names.store_manifest_name(layout.manifest_versions(self.prefix)[-1])
        if grace == SHORT_GRACE:
            assert present == sorted([current, *map(names.generation_dir_name, self.live)]), (
                f"left: {present}"
            )
        elif before is not None:
            assert present == before, (
                f"gc with a grace period of {grace} s deleted {sorted(set(before) - set(present))}"
            )

    @rule(interrupt_at_call=INTERRUPT_AT_CALL)
    def materialize(self, interrupt_at_call):
        """The second pass: the loader's reshuffle=False epoch-0 order, the live records, and
        while generation 0 is alone, ``run``'s bytes."""
        self.outputs += 1
        output = os.path.join(self.root, "mat", f"m{self.outputs}")
        argv = ["materialize", f"--store={self.prefix}", f"--output={output}", *FAST]
        finished_first = False
        if interrupt_at_call is not None:
            check_ctrl_c(argv, interrupted_command(argv, interrupt_at_call))
            finished_first = os.path.exists(f"{output}-manifest.json")
            if finished_first:
                self.check_materialized(output)
        outcome = pileshuffle(argv)
        # the interrupt came after publication: the output stands, a re-run says so
        if finished_first:
            assert outcome.code == REFUSED and "already exists" in outcome.stderr, outcome.stderr
        else:
            assert outcome.code == 0, (
                f"materialize failed ({outcome.code}): {outcome.stderr.strip()[-2000:]}"
            )
        self.check_materialized(output)

    def check_materialized(self, output):
        written = shard_indices(output, self.fmt)
        assert collections.Counter(written) == self.expected(), (
            "materialize wrote other records than the live ones"
        )
        in_order = [
            sample.index_of(r)
            for r in ShuffledDataset(self.prefix, seed=self.seed, reshuffle=False)
        ]
        assert written == in_order, (
            "materialize's order is not the loader's reshuffle=False epoch 0"
        )
        if list(self.live) == [0]:
            reference = os.path.join(self.root, "run", "r")
            if not os.path.exists(f"{reference}-manifest.json"):
                done = pileshuffle(
                    [
                        "run",
                        f"--input={self.inputs(self.live[0])}",
                        f"--output={reference}",
                        *self.shard_options(),
                    ]
                )
                assert done.code == 0, done.stderr
            assert shard_bytes(output) == shard_bytes(reference), (
                "materialize of generation 0 is not run's bytes"
            )
        files = self.live_files()
        if len(set(files)) == len(files):  # verify reads a file named twice once
            done = pileshuffle(["verify", f"--input={self.inputs(files)}", f"--output={output}"])
            assert done.code == 0, (
                f"verify of the materialized output against the live inputs: {done.stderr[-2000:]}"
            )
        left = temp_leftovers(os.path.dirname(output))
        assert not left, f"materialize left {left}"

    @rule(interrupt_at_call=INTERRUPT_AT_CALL)
    def shard_run_to_the_store_name(self, interrupt_at_call):
        """``run --output P`` while ``P-store/`` exists: refused, nothing changed (issue 19 item 5)."""
        argv = [
            "run",
            f"--input={self.inputs(self.live_files())}",
            f"--output={self.prefix}",
            *self.shard_options(),
        ]
        self.command(argv, interrupt_at_call, self.live, refused=True)

    @rule(epoch=st.integers(0, 3), mix=st.integers(1, 2), interrupt_at_call=INTERRUPT_AT_CALL)
    def load_epoch(self, epoch, mix, interrupt_at_call):
        """One epoch through the loader (interrupted: a fresh one afterwards reads it whole)."""

        def read():
            return [
                sample.index_of(r)
                for r in ShuffledDataset(self.prefix, seed=self.seed, epoch=epoch, mix=mix)
            ]

        if interrupt_at_call is not None:
            event(
                f"load_epoch interrupted: {'no' if interrupted(read, interrupt_at_call) else 'yes'}"
            )
            gc.collect()
            for thread in [t for t in threading.enumerate() if t.name == "pileshuffle-prefetch"]:
                # it ends after the load it may be doing; the limit is against a hang
                thread.join(timeout=120)
            assert not any(t.name == "pileshuffle-prefetch" for t in threading.enumerate()), (
                "the prefetch thread of an interrupted epoch still runs"
            )
        first, again = read(), read()
        assert collections.Counter(first) == self.expected() and first == again

    @rule(interrupt_at_call=INTERRUPT_AT_CALL)
    def verify(self, interrupt_at_call):
        """``verify --output P --input (the live inputs)``, when no file is live twice."""
        files = self.live_files()
        argv = ["verify", f"--output={self.prefix}"]
        if len(set(files)) == len(files):
            argv.append(f"--input={self.inputs(files)}")
        self.command(argv, interrupt_at_call, self.live)

    # --- invariants ----------------------------------------------------------------------------
    @invariant()
    def matches_the_model(self):
        """The loader reads the model's records from the newest version; the store is whole,
        tidy and verifies (one invariant: a failing life prints one line per step)."""
        self.steps += 1
        self.check_loader(self.live)
        self.check_whole_and_tidy()
        self.check_verifies()

    def check_loader(self, live, version=None):
        """An epoch of the store (of manifest ``version``; default: the newest, found by the loader)."""
        where = (
            self.prefix
            if version is None
            else os.path.join(self.store, names.store_manifest_name(version))
        )
        dataset = ShuffledDataset(where, seed=self.seed, epoch=self.steps % 5)
        newest = names.store_manifest_name(version or layout.manifest_versions(self.prefix)[-1])
        assert dataset.output.kind == "store", (
            f"the loader reads {dataset.output.location}, not the store"
        )
        assert os.path.basename(dataset.output.location) == newest, (
            f"the loader opened {dataset.output.location}"
        )
        found = collections.Counter(sample.index_of(r) for r in dataset)
        assert found == self.expected(live), describe_difference(found, self.expected(live))

    def check_whole_and_tidy(self):
        found = os.listdir(self.store)
        assert sorted(self.published()) == sorted(self.live)
        listed = set()
        for name in found:
            if names.STORE_MANIFEST_NAME.match(name):
                path = os.path.join(self.store, name)
                assert manifest_problem(path) is None, manifest_problem(path)
                listed |= {g["generation"] for g in json.load(open(path))["generations"]}
        strays = [
            n
            for n in found
            if not names.STORE_MANIFEST_NAME.match(n)
            and not (names.GENERATION_DIR.match(n) and int(n[1:]) in listed)
        ]
        assert not strays, (
            f"the store holds {strays} besides manifests and the generations they list"
        )
        assert not temp_leftovers(os.path.dirname(self.prefix)), (
            f"left: {temp_leftovers(os.path.dirname(self.prefix))}"
        )

    def check_verifies(self):
        done = pileshuffle(["verify", f"--output={self.prefix}"])
        assert done.code == 0, done.stderr.strip()[-2000:]


def describe_difference(found: collections.Counter, expected: collections.Counter) -> str:
    missing, extra = expected - found, found - expected
    return (
        f"the loader's epoch has {sum(found.values())} records, the model {sum(expected.values())}: "
        f"missing {sorted(missing.elements())[:10]}, extra {sorted(extra.elements())[:10]}"
    )


# One failure at a time, shrunk to its steps; no "explain" phase (it re-runs lives under a tracer).
StoreLife.TestCase.settings = settings(
    max_examples=LIFE_EXAMPLES,
    stateful_step_count=STEPS_PER_LIFE,
    deadline=None,
    report_multiple_bugs=False,
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink],
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestStoreLife = StoreLife.TestCase


# --- what lives found, pinned down ---------------------------------------------------------------


def test_expire_keeping_more_generations_than_are_live_drops_none(tmp_path):
    """Found by a life: ``expire --keep_generations 3`` on a store of 2 generations dropped
    generation 0 (a negative slice start), so the docs' "keep the last 30 days" lost data
    during the first 30 days."""
    prefix = str(tmp_path / "s")
    first, second = (write_input(str(tmp_path / "in"), "tfrecord", k) for k in (0, 1))
    created = pileshuffle(
        ["run", "--layout=store", f"--input={first}", f"--output={prefix}", "--num_piles=2", *FAST]
    )
    assert created.code == 0
    assert pileshuffle(["append", f"--store={prefix}", f"--input={second}", *FAST]).code == 0
    for keep in (2, 3, 4):
        done = pileshuffle(["expire", f"--store={prefix}", f"--keep_generations={keep}"])
        assert done.code == 0 and "expired   0 generation(s)" in done.stdout, done.stdout
    assert [g["generation"] for g in layout.read_store_manifest(prefix)["generations"]] == [0, 1]


@settings(max_examples=1, deadline=None, phases=[Phase.generate])
@given(st.just(None))  # the rules record hypothesis events: they run inside a test
def test_a_refused_append_interrupted_while_it_releases_the_lock_leaves_no_lock(_):
    """Found by a life (the shrunk steps, replayed): a refused ``append`` hit by Ctrl-C
    while it released the store's lock left ``LOCK`` behind; releasing a lock is now a
    step Ctrl-C does not cut (``interrupt.not_cut``)."""
    life = StoreLife()
    try:
        life.create(
            fmt="tfrecord", piles=2, files=[0, 1, 9], interrupt_at_call=None, seed=0, dedup=False
        )
        life.append(duplicates=True, files=[0], interrupt_at_call=None)
        life.append(duplicates=True, files=[0], interrupt_at_call=53)
        life.append(duplicates=True, files=[0, 1], interrupt_at_call=None)
        life.append(duplicates=False, files=[0, 1, 2], interrupt_at_call=1)
        life.append(duplicates=True, files=[0], interrupt_at_call=None)
        # asserts nothing changed
        life.append(duplicates=False, files=[0, 1, 2], interrupt_at_call=173)
        life.matches_the_model()
    finally:
        life.teardown()
