"""How soon a command ends when it must: after Ctrl-C, when the remote end is unreachable, when a
request is refused before Beam's import. These bounds were once asserted by tests (issue 54 moved
them here: tests/ now check what happens and wait against a hang only, on a noisy 2-core machine).

    python bench/exits.py              # every row, 3 rounds, a table on stdout
    python bench/exits.py --repeat 5

Rows (seconds from the cue to the process's exit; the bound is the claim the docs make):

- ``run-sigint``            Ctrl-C in pass 1 (30 MB of TFRecord, runs on disk): exit 130, clean-up (bound 10 s)
- ``loader-sigint``         Ctrl-C while the loader waits for a pile that takes 3 s to load (bound 1.5 s)
- ``loader-stop``           the consumer stops iterating while a pile loads (3 s): the process ends (1.5 s)
- ``gcs-no-endpoint-CMD``   ``run``, ``verify``, the loader, ``generate`` on gs:// with nothing listening
                            at STORAGE_EMULATOR_HOST: the one-line failure, from the start (30 s: docs/gcs.md)
- ``dask-unreachable``      ``run --runner=DaskRunner`` at a scheduler address nothing listens on, with the
                            default connect timeout: the one-line failure, from the start (30 s: docs/cli.md)
- ``plan-refusal-cpu``      CPU seconds of ``plan --num_piles 1000000000``, refused before Beam's import (1 s)
"""

import argparse
import glob
import os
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from workspace import OUT, PY, log  # noqa: E402

WORK = os.path.join(OUT, "exits")
LOAD_SECONDS = 3.0
BOUNDS = {
    "run-sigint": 10.0,
    "loader-sigint": 1.5,
    "loader-stop": 1.5,
    "dask-unreachable": 30.0,
    "plan-refusal-cpu": 1.0,
    **{f"gcs-no-endpoint-{c}": 30.0 for c in ("run", "verify", "loader", "generate")},
}

SLOW_LOADER = r"""
import sys, time
import pyarrow.fs as pafs
from pileshuffle.loader import ShuffledDataset

class FarAway(pafs.FileSystemHandler):
    '''The local disk, with every pile taking a few seconds to open.'''
    def __init__(self, seconds):
        self.local, self.seconds = pafs.LocalFileSystem(), seconds
    def get_type_name(self): return "far-away"
    def normalize_path(self, path): return path
    def equals(self, other): return self is other
    def get_file_info(self, paths): return self.local.get_file_info(paths)
    def get_file_info_selector(self, selector): return self.local.get_file_info(selector)
    def open_input_stream(self, path): return self.local.open_input_stream(path)
    def open_input_file(self, path):
        if not path.endswith(".json"):
            time.sleep(self.seconds)
        return self.local.open_input_file(path)
    def create_dir(self, *a): raise OSError("read only")
    delete_dir = delete_dir_contents = delete_root_dir_contents = delete_file = move = copy_file = create_dir
    open_output_stream = open_append_stream = create_dir

prefix, seconds, how = sys.argv[1], float(sys.argv[2]), sys.argv[3]
records = iter(ShuffledDataset(prefix, seed=0, filesystem=pafs.PyFileSystem(FarAway(seconds))))
next(records)
print("reading", flush=True)  # the next pile is loading now
if how == "stop":
    records.close()
else:
    for record in records:
        pass
"""
LOADER = "import sys; from pileshuffle.loader import ShuffledDataset; print(len(list(ShuffledDataset(sys.argv[1]))))"


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def prepare() -> tuple:
    """(input pattern, a finished output prefix) under bench/.out/exits."""
    from pileshuffle.commands import sample

    shutil.rmtree(WORK, ignore_errors=True)
    sample.write_tfrecord(os.path.join(WORK, "in"), records=60_000, files=4, record_bytes=500)
    pattern, output = os.path.join(WORK, "in", "*.tfrecord"), os.path.join(WORK, "done", "data")
    subprocess.run(
        [
            PY,
            "-m",
            "pileshuffle",
            "run",
            f"--input={pattern}",
            f"--output={output}",
            "--num_piles=6",
            "--quiet",
        ],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return pattern, output


def run_sigint(pattern: str) -> float:
    output = os.path.join(WORK, "interrupted", "data")
    shutil.rmtree(os.path.dirname(output), ignore_errors=True)
    process = subprocess.Popen(
        [
            PY,
            "-m",
            "pileshuffle",
            "run",
            f"--input={pattern}",
            f"--output={output}",
            "--num_piles=6",
            "--memory=1MiB",
            "--quiet",
        ],
        stderr=subprocess.DEVNULL,
    )
    runs = os.path.join(os.path.dirname(output), ".pileshuffle-work-*", "fragments", "*")
    while not glob.glob(runs):  # pass 1 has written runs
        if process.poll() is not None:
            raise SystemExit("run-sigint: the run finished before it could be interrupted")
        time.sleep(0.002)
    process.send_signal(signal.SIGINT)
    cue = time.perf_counter()
    if process.wait(timeout=300) != 130:
        raise SystemExit(f"run-sigint: exit code {process.returncode}, not 130")
    return time.perf_counter() - cue


def slow_loader(output: str, how: str) -> float:
    process = subprocess.Popen(
        [PY, "-c", SLOW_LOADER, output, str(LOAD_SECONDS), how],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    if process.stdout.readline() != "reading\n":
        raise SystemExit(f"loader-{how}: the loader did not start")
    cue = time.perf_counter()
    if how == "sigint":
        time.sleep(LOAD_SECONDS / 4)  # the first pile is used up: it waits for the next one
        process.send_signal(signal.SIGINT)
        cue = time.perf_counter()
    process.wait(timeout=300)
    return time.perf_counter() - cue


def failing(argv, env=None) -> float:
    """Seconds from start to exit of a command that must fail; it must fail."""
    started = time.perf_counter()
    done = subprocess.run(
        [PY, *argv], capture_output=True, text=True, timeout=600, env={**os.environ, **(env or {})}
    )
    if done.returncode == 0:
        raise SystemExit(f"{argv}: succeeded where it must fail")
    return time.perf_counter() - started


def no_endpoint(command: str) -> float:
    where = "gs://no-such-endpoint-bucket/out/t"
    argv = {
        "run": ["-m", "pileshuffle", "run", f"--input={where}-in*", f"--output={where}"],
        "verify": ["-m", "pileshuffle", "verify", f"--output={where}"],
        "loader": ["-c", LOADER, where],
        "generate": [
            "-m",
            "pileshuffle",
            "generate",
            f"--output_dir={where}",
            "--records=10",
            "--files=1",
        ],
    }[command]
    return failing(argv, {"STORAGE_EMULATOR_HOST": f"http://127.0.0.1:{closed_port()}"})


def dask_unreachable(pattern: str) -> float:
    return failing(
        [
            "-m",
            "pileshuffle",
            "run",
            f"--input={pattern}",
            f"--output={WORK}/dask/t",
            "--runner=DaskRunner",
            f"--dask_client_address=tcp://127.0.0.1:{closed_port()}",
            "--quiet",
        ]
    )


def plan_refusal_cpu(pattern: str) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    failing(
        [
            "-m",
            "pileshuffle",
            "plan",
            f"--input={pattern}",
            f"--output={WORK}/never/t",
            "--num_piles=1000000000",
        ]
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)


def rows(pattern: str, output: str) -> dict:
    """Row name -> a function measuring it once."""
    return {
        "run-sigint": lambda: run_sigint(pattern),
        "loader-sigint": lambda: slow_loader(output, "sigint"),
        "loader-stop": lambda: slow_loader(output, "stop"),
        **{
            f"gcs-no-endpoint-{c}": (lambda c=c: no_endpoint(c))
            for c in ("run", "verify", "loader", "generate")
        },
        "dask-unreachable": lambda: dask_unreachable(pattern),
        "plan-refusal-cpu": lambda: plan_refusal_cpu(pattern),
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="rounds: every row once per round")
    args = parser.parse_args(argv)
    pattern, output = prepare()
    measures = rows(pattern, output)
    times = {name: [] for name in measures}
    for round_ in range(args.repeat):
        for name, once in measures.items():
            times[name].append(once())
            log(f"round {round_ + 1}: {name} {times[name][-1]:.2f} s")
    print("| row | median s | min s | max s | bound s | within |")
    print("|---|---|---|---|---|---|")
    for name, seen in times.items():
        median = statistics.median(seen)
        print(
            f"| {name} | {median:.2f} | {min(seen):.2f} | {max(seen):.2f} | {BOUNDS[name]:g} | "
            f"{'yes' if max(seen) < BOUNDS[name] else 'NO'} |"
        )
    shutil.rmtree(WORK, ignore_errors=True)


if __name__ == "__main__":
    main()
