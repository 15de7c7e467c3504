"""Profile one default `pileshuffle run` (all its processes) with py-spy and summarize.

    .venv/bin/pip install py-spy                 # once
    .venv/bin/python bench/profile_pileshuffle.py            # 1 GB TFRecord data set (bench/.data, generated if missing)
    .venv/bin/python bench/profile_pileshuffle.py --quick    # 1/50 size
    .venv/bin/python bench/profile_pileshuffle.py --format parquet           # or jsonl: make bench's 1 GB set
    .venv/bin/python bench/profile_pileshuffle.py --format jsonl --balance   # --balance uniform on the imbalanced set
    .venv/bin/python bench/profile_pileshuffle.py --raw bench/.out/profile/pileshuffle-tfrecord.txt   # summarize an existing profile

py-spy samples every process of the run (the launcher and Beam's SDK worker processes)
at --rate Hz, active threads only (on-CPU time, not waiting), and writes collapsed stacks.
The summary gives each process role's share of the samples, the functions where samples
land ("self", by function), and inclusive shares of pileshuffle's own functions and of a
few cost categories. Output: bench/.out/profile/summary-FORMAT.md (and stdout).
"""

import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import datagen  # noqa: E402
from shuffle_rows import BALANCED_RECORDS, IMBALANCE  # noqa: E402

OUT = os.path.join(HERE, ".out", "profile")
# make bench's 1 GB sets
SETS = {
    "tfrecord": (1_000_000, 1000),
    "parquet": (1_000_000, 1000),
    "jsonl": (2_000_000, 500),
}
DATA = os.path.join(HERE, ".data")
_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")

WAIT_LEAVES = (
    "_serve",
    "channel_spin",
    "_try_wait",
    "_wait_for_tstate_lock",
    "join",
    "select",
    "poll",
    "sleep",
    "_blocking",
    "_wait_once",
    "wait",
)
WAIT_FUNCTIONS = ("Queue.get", "SimpleQueue.get", "_UnaryStreamMultiCallable.__call__")


def is_wait(leaf: str) -> bool:
    """Threads blocked in a wait that py-spy still reported as active (grpc polls, Condition.wait)."""
    name = leaf.split(" (")[0]
    return name in WAIT_FUNCTIONS or name.rsplit(".", 1)[-1] in WAIT_LEAVES


CATEGORIES = [  # (name, predicate on a frame's "func (file)") -- inclusive, first match per stack wins
    ("python imports (start-up)", lambda f: "importlib._bootstrap" in f),
    (
        "--balance: counting pass (CountClasses)",
        lambda f: f.startswith(("CountClasses.", "class_counts ")),
    ),
    ("--balance: pass 1 labels (record_labels)", lambda f: f.startswith("record_labels ")),
    (
        "--balance: pass 1 copies (copiers, tallies)",
        lambda f: "copies_of " in f or f.startswith(("_class_tally ", "_code_tally ")),
    ),
    (
        "pass 2: split of a pile over max_pile_bytes (Pile.split)",
        lambda f: f.startswith("Pile.split "),
    ),
    ("pass 1: TFRecord frame walk + CRC (scan_frames)", lambda f: f.startswith("scan_frames ")),
    (
        "pass 1: record fingerprints (record_hashes)",
        lambda f: f.startswith("record_hashes ") and "formats/__init__" in f,
    ),
    ("pass 1: keys (record_keys)", lambda f: f.startswith("record_keys ")),
    ("pass 1: split by pile (take)", lambda f: f.startswith("split_by_pile ")),
    (
        "pass 1: fragment writes (FragmentFiles.append/commit)",
        lambda f: f.startswith("FragmentFiles."),
    ),
    (
        "pass 1: reading input blocks",
        lambda f: f.startswith("read_block ") or f.startswith("read_chunks "),
    ),
    (
        "pass 2: reading fragments (read_table)",
        lambda f: f.startswith("read_table ") or f.startswith("read_batches "),
    ),
    (
        "pass 2: order + take (Pile.ordered)",
        lambda f: f.startswith(("Pile.tables ", "Pile.ordered ")),
    ),
    ("pass 2: output fingerprints (fingerprint_of)", lambda f: f.startswith("fingerprint_of ")),
    (
        "pass 2: shard writes (write_shard)",
        lambda f: ".write_shard " in f or f.startswith("write_shard "),
    ),
    ("plan: mean_record_bytes / check", lambda f: f.startswith("make_plan ")),
    ("Beam runner / worker machinery (other)", lambda f: "apache_beam" in f),
]


def parse(path):
    """{(role, stack tuple): samples}."""
    stacks = collections.Counter()
    with open(path, errors="replace") as handle:
        for line in handle:
            line = line.rstrip("\n")
            if not line:
                continue
            body, _, count = line.rpartition(" ")
            frames = body.split(";")
            processes = [f for f in frames if f.startswith("process ")]
            code = [f for f in frames if not f.startswith("process ")]
            cmd = processes[-1] if processes else ""
            role = (
                "SDK worker"
                if "sdk_worker_main" in cmd
                else ("launcher (main)" if processes else "?")
            )
            if "/bin/sh -c" in cmd:
                role = "shell"
            stacks[(role, tuple(code))] += int(count)
    return stacks


def function_of(frame):
    match = _FRAME.match(frame)
    if not match:
        return frame
    file = match.group("file")
    for marker in ("site-packages/", "lib/python3"):
        if marker in file:
            file = file.split(marker, 1)[1]
    return f"{match.group('func')} ({file})"


def summarize(stacks, top=20):
    everything = sum(stacks.values())
    waiting = sum(n for (_, code), n in stacks.items() if code and is_wait(function_of(code[-1])))
    stacks = {k: n for k, n in stacks.items() if not (k[1] and is_wait(function_of(k[1][-1])))}
    total = sum(stacks.values())
    if not total:
        return "no samples"
    lines = [
        f"samples: {everything:,}, of which {waiting:,} ({100 * waiting / everything:.0f}%) are threads blocked in a wait "
        f"(grpc polling, Condition.wait, ...) and are left out; shares below are of the {total:,} busy samples "
        "of all processes together",
        "",
    ]
    by_role = collections.Counter()
    for (role, _), n in stacks.items():
        by_role[role] += n
    lines.append("| process role | share |")
    lines.append("|---|---|")
    lines += [f"| {role} | {100 * n / total:.1f}% |" for role, n in by_role.most_common()]

    self_time = collections.Counter()
    inclusive = collections.Counter()
    categories = collections.Counter()
    for (role, code), n in stacks.items():
        funcs = [function_of(f) for f in code]
        if funcs:
            self_time[funcs[-1]] += n
        for func in set(funcs):
            inclusive[func] += n
        for name, predicate in CATEGORIES:
            if any(predicate(f) for f in funcs):
                categories[name] += n
                break
        else:
            categories["other"] += n

    lines += [
        "",
        f"Top {top} functions by self time (where the samples land; C calls count in their Python caller):",
        "",
        "| self % | function |",
        "|---|---|",
    ]
    lines += [f"| {100 * n / total:.1f} | `{f}` |" for f, n in self_time.most_common(top)]
    own = [
        (f, n)
        for f, n in inclusive.most_common()
        if "pileshuffle/" in f or f.split(" (")[1].startswith("pileshuffle")
    ]
    lines += [
        "",
        "pileshuffle functions by inclusive time:",
        "",
        "| incl % | function |",
        "|---|---|",
    ]
    lines += [f"| {100 * n / total:.1f} | `{f}` |" for f, n in own[:top]]
    lines += [
        "",
        "Cost categories (inclusive, each sample counted once, first matching category):",
        "",
        "| % | category |",
        "|---|---|",
    ]
    lines += [f"| {100 * n / total:.1f} | {name} |" for name, n in categories.most_common()]
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rate", type=int, default=50, help="samples per second per process")
    parser.add_argument("--raw", help="summarize this existing py-spy raw file instead of running")
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument(
        "--format",
        choices=sorted(SETS),
        default="tfrecord",
        help="the 1 GB data set of make bench to run on",
    )
    parser.add_argument(
        "--balance",
        action="store_true",
        help="jsonl, parquet: --label_field label --balance uniform on make bench's imbalanced set",
    )
    args = parser.parse_args(argv)
    os.makedirs(OUT, exist_ok=True)
    raw = args.raw
    header = []
    if not raw:
        py_spy = os.path.join(os.path.dirname(sys.executable), "py-spy")
        if not os.path.exists(py_spy):
            sys.exit("py-spy is not installed: .venv/bin/pip install py-spy")
        div = 50 if args.quick else 1
        records, record_bytes = BALANCED_RECORDS[args.format] if args.balance else SETS[args.format]
        data = datagen.dataset(
            DATA,
            args.format,
            records // div,
            8,
            record_bytes,
            seed=0,
            log=lambda m: print(m, file=sys.stderr),
            shares=IMBALANCE if args.balance else None,
        )
        extra = ["--label_field", "label", "--balance", "uniform"] if args.balance else []
        run_dir = os.path.join(OUT, "run")
        shutil.rmtree(run_dir, ignore_errors=True)
        os.makedirs(run_dir)
        raw = os.path.join(
            OUT, f"pileshuffle-{args.format}{'-balance' if args.balance else ''}.txt"
        )
        subprocess.run(["cat", *data["files"]], stdout=subprocess.DEVNULL, check=True)
        cmd = [
            py_spy,
            "record",
            "--subprocesses",
            "--nonblocking",
            "--rate",
            str(args.rate),
            "--format",
            "raw",
            "-o",
            raw,
            "--",
            os.path.join(os.path.dirname(sys.executable), "pileshuffle"),
            "run",
            "--input",
            data["pattern"],
            "--output",
            os.path.join(run_dir, "train"),
            "--format",
            args.format,
            "--seed",
            "1",
            *extra,
        ]
        started = time.perf_counter()
        result = subprocess.run(cmd, capture_output=True, text=True)
        wall = time.perf_counter() - started
        summary_lines = "\n".join(
            line
            for line in result.stdout.splitlines()
            if line.strip() and not line.startswith("py-spy>")
        )
        behind = [line for line in result.stdout.splitlines() if "behind in sampling" in line]
        if behind:
            summary_lines += f"\n(py-spy fell behind {len(behind)} time(s); last: {behind[-1]})"
        shutil.rmtree(run_dir, ignore_errors=True)
        if result.returncode != 0:
            sys.exit(f"profiled run failed:\n{result.stderr[-3000:]}")
        header = [
            f"# Profile of `pileshuffle run` on {data['name']} ({data['bytes'] / 1e6:,.0f} MB)",
            "",
            f"command: `{' '.join(cmd[:6])} ... pileshuffle run --input ... --format {args.format} --seed 1 {' '.join(extra)}`",
            "",
            f"wall under py-spy: {wall:.1f} s (sampling slows the run a little)",
            "",
            "pileshuffle's summary:",
            "",
            "```",
            summary_lines,
            "```",
            "",
        ]
    text = "\n".join(header) + summarize(parse(raw), args.top) + "\n"
    with open(
        os.path.join(OUT, f"summary-{args.format}{'-balance' if args.balance else ''}.md"), "w"
    ) as handle:
        handle.write(text)
    print(text)


if __name__ == "__main__":
    main()
