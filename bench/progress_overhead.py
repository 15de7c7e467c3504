"""What progress reporting costs: the same `pileshuffle run` with `--quiet`, with plain
progress lines (stderr not a terminal) and with tqdm's live line (stderr a pseudo-terminal),
interleaved round by round on the 1 GB TFRecord set. Reports median wall and CPU seconds
(user + system of the run's process tree) per mode and each mode's ratio to `--quiet`.

    python bench/progress_overhead.py                 # 1 GB TFRecord (bench/datagen.py, cached), 5 rounds
    python bench/progress_overhead.py --rounds 3 --data /tmp/data
"""

import argparse
import os
import pty
import resource
import shutil
import statistics
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import datagen  # noqa: E402

MODES = ("quiet", "plain", "terminal")


def run_once(mode, pattern, output):
    shutil.rmtree(os.path.dirname(output), ignore_errors=True)
    command = [
        sys.executable,
        "-m",
        "pileshuffle",
        "run",
        "--input",
        pattern,
        "--output",
        output,
        "--seed",
        "1",
    ]
    if mode == "quiet":
        command.append("--quiet")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    if mode == "terminal":
        leader, follower = pty.openpty()
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=follower)
        os.close(follower)
        drained = threading.Thread(target=_drain, args=(leader,))
        drained.start()
        process.wait()
        drained.join()
        os.close(leader)
    else:
        process = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if process.returncode != 0:
        raise RuntimeError(f"{mode} run failed")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def _drain(fd):
    while True:
        try:
            if not os.read(fd, 65536):
                return
        except OSError:
            return


def call_cost(data, live, chunk_bytes=16 << 20, piles=16):
    """Seconds spent in the reporter's calls of one run over ``data``: the same calls
    (one ``read`` per 16 MiB chunk, one ``file_read`` per file, one ``pile_written`` per
    pile) made in a row, writing to /dev/null; tqdm's live line when ``live``."""
    from pileshuffle.engine.progress import Progress
    from pileshuffle.engine.transforms.assign import Source

    sources = [Source(i, path, os.path.getsize(path)) for i, path in enumerate(data["files"])]
    with open(os.devnull, "w") as sink:
        started = time.perf_counter()
        progress = Progress(len(sources), sum(s.size for s in sources), piles, sink, live=live)
        for source in sources:
            for _ in range(0, source.size, chunk_bytes):
                progress.read(source, chunk_bytes)
            progress.file_read(source)
        for _ in range(piles):
            progress.pile_written()
        progress.close()
        return time.perf_counter() - started


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--data", default=os.path.join(HERE, ".data"))
    parser.add_argument("--out", default=os.path.join(HERE, ".out", "progress"))
    args = parser.parse_args(argv)
    data = datagen.dataset(args.data, "tfrecord", 1_000_000, 8, 1000)
    results = {mode: [] for mode in MODES}
    for round_index in range(args.rounds):
        # each mode runs first, second and last equally often: no position bias
        turn = round_index % len(MODES)
        for mode in MODES[turn:] + MODES[:turn]:
            wall, cpu = run_once(mode, data["pattern"], os.path.join(args.out, mode, "train"))
            results[mode].append((wall, cpu))
            print(
                f"round {round_index + 1} {mode:8s} wall {wall:6.2f} s  cpu {cpu:6.2f} s",
                file=sys.stderr,
            )
    base_wall = statistics.median(w for w, _ in results["quiet"])
    base_cpu = statistics.median(c for _, c in results["quiet"])
    print(
        f"| mode | median wall s | x quiet | median cpu s | x quiet |  ({args.rounds} rounds, {data['bytes']:,} bytes)"
    )
    print("|---|---|---|---|---|")
    for mode in MODES:
        wall = statistics.median(w for w, _ in results[mode])
        cpu = statistics.median(c for _, c in results[mode])
        print(
            f"| {mode} | {wall:.2f} | {wall / base_wall:.3f} | {cpu:.2f} | {cpu / base_cpu:.3f} |"
        )
    for live in (False, True):
        cost = statistics.median(call_cost(data, live) for _ in range(5))
        print(
            f"reporter calls of one run ({'terminal' if live else 'plain'}): {cost * 1e3:.2f} ms = "
            f"{cost / base_wall:.4%} of the quiet run's median wall time"
        )
    shutil.rmtree(args.out, ignore_errors=True)


if __name__ == "__main__":
    main()
