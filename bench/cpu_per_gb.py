"""CPU seconds per GB: pileshuffle against DuckDB, in one run, interleaved, medians (issue 56).

    .venv/bin/python bench/cpu_per_gb.py                      # 3 rounds, 1 GB Parquet and 2 GB JSONL
    .venv/bin/python bench/cpu_per_gb.py --before /tmp/old    # also pileshuffle from another tree (A/B)
    .venv/bin/python bench/cpu_per_gb.py --before /tmp/old --after /tmp/new --no-stages   # two trees
    .venv/bin/python bench/cpu_per_gb.py --formats parquet --no-stages --rounds 5
    .venv/bin/python bench/cpu_per_gb.py --formats parquet --scale 10 --memory 2GB --no-stages

Rows, each one process measured by ``os.wait4`` (user and system CPU of it and its waited-for
children, peak RSS of the largest) and wall time, run in turn round by round on warm files:
- ``pileshuffle``: ``pileshuffle run --seed 1`` with its defaults;
- ``duckdb``: ``COPY (SELECT * FROM <input> ORDER BY random()) TO ...`` in RAM on 2 threads
  (bench/duckdb_shuffle.py, in the peers' venv if built, else this one);
- ``before`` / ``after`` (``--before TREE``, ``--after TREE``): the same pileshuffle command from
  TREE (first on ``PYTHONPATH``, run in the bench's work folder so that no other checkout
  shadows it); ``after`` replaces the ``pileshuffle`` row (this checkout, the same way).
- ``--memory 2GB``: two rows more, ``pileshuffle run --memory 2GB`` and DuckDB with
  ``memory_limit='2GB'`` (spilling to disk); each budget row is compared with the other's.
Data sets (bench/datagen.py, cached in bench/.data): 1,000,000 Parquet rows of ~1 KB and
4,000,000 JSONL lines of ~500 bytes, 8 files each (``--scale N``: N times the rows and files).
Per GB means per 1e9 input bytes; "speed vs DuckDB" is DuckDB's wall time over the row's.
Each measured tree's package is compiled to bytecode first, as an installed package is.

Stages: one more pileshuffle run per format under py-spy (100 Hz, on-CPU samples of every
thread), each sample given to the innermost frame that names a stage (``STAGES``); a stage's
CPU per GB is its share of the samples times the row's median user + system CPU per GB.
The tables (markdown) go to stdout, progress to stderr.
"""

import argparse
import collections
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import datagen  # noqa: E402
from workspace import DATA, GB, OUT, PEERS_PY, PY, log  # noqa: E402

# (records, bytes a record), 8 files
SETS = {
    "parquet": (1_000_000, 1000),
    "jsonl": (4_000_000, 500),
}
WORK = os.path.join(OUT, "cpu_per_gb")
SEED = 1

# (stage, does a frame "function (file:line)" name it): a sample goes to the innermost frame that
# matches any stage, in this order of precedence within one frame.
STAGES = [
    ("write (file, CRC32C)", lambda f: f.startswith(("Crc32cWriter.write ", "_LeftOpen."))),
    (
        "encode (shard format)",
        lambda f: (
            f.startswith(("_write_group ", "ParquetWriter.write"))
            or (".write_shard " in f and "pileshuffle/formats" in f)
        ),
    ),
    ("pass-2 check (fingerprint)", lambda f: f.startswith("WriteShard._write.<locals>.counted ")),
    (
        "pass-2 read/take",
        lambda f: f.startswith(
            (
                "in_key_order ",
                "read_joined ",
                "PileGroup.ordered ",
                "Pile.ordered ",
                "_one_batch ",
                "_segment_bytes ",
                "read_table ",
            )
        ),
    ),
    (
        "pass-1 gather/encode",
        lambda f: (
            "pileshuffle/engine/runs.py" in f
            or "pileshuffle/engine/memory_runs.py" in f
            or f.startswith("segment_encoder.<locals>")
        ),
    ),
    (
        "key + fingerprint",
        lambda f: (
            f.startswith(("position_keys ", "record_keys "))
            or "pileshuffle/records/fingerprint.py" in f
            or ".record_hashes " in f
            or ".record_lengths " in f
            or f.startswith(("keyed_rows ", "SourcePiles.keyed "))
        ),
    ),
    ("decode (input)", lambda f: "pileshuffle/formats/" in f and ".write_shard " not in f),
]
OTHER = "Beam, plan, start-up, no Python frame"
SPY = os.path.join(os.path.dirname(PY), "py-spy")  # `.venv/bin/pip install py-spy` for the stages
ROOT = os.path.dirname(HERE)  # the checkout this bench is in: the pileshuffle row's tree
TREES = {}  # row -> the tree it runs pileshuffle from (--before, --after)
BUDGET = {}  # "limit": --memory's value for the budget rows ("pileshuffle <limit>", "duckdb <limit>")


def dataset(fmt: str, scale: int = 1) -> dict:
    records, record_bytes = SETS[fmt]
    return datagen.dataset(DATA, fmt, records * scale, 8 * scale, record_bytes, log=log)


def peer_of(row: str) -> str:
    """The DuckDB row a row is compared with: the one with the same budget."""
    return "duckdb" + row[len(row.split(" ")[0]) :]


def command(row: str, fmt: str, data: dict, out_dir: str) -> tuple:
    """``(argv, extra environment)`` of one row."""
    prefix = os.path.join(out_dir, "train")
    budget = ["--memory_limit", BUDGET["limit"]] if row.endswith(" budget") else []
    if row.startswith("duckdb"):
        python = PEERS_PY if os.path.exists(PEERS_PY) else PY
        return [
            python,
            os.path.join(HERE, "duckdb_shuffle.py"),
            "--format",
            fmt,
            "--input",
            data["pattern"],
            "--output",
            prefix,
            *budget,
        ], {}
    run = [
        "run",
        "--input",
        data["pattern"],
        "--output",
        prefix,
        "--format",
        fmt,
        "--seed",
        str(SEED),
        *(["--memory", BUDGET["limit"]] if budget else []),
    ]
    # the tree first on the path, and a working folder without a pileshuffle package: a child's
    # sys.path starts with its working folder (a checkout's root shadowed every other tree), and
    # the venv's editable install names the checkout it was installed from
    tree = ROOT if row.startswith("pileshuffle") else TREES[row.split(" ")[0]]
    return [PY, "-m", "pileshuffle.cli", *run], {"PYTHONPATH": tree}


def measure(argv, env) -> dict:
    """Wall seconds, user and system CPU seconds and peak RSS (bytes) of one process and its children."""
    started = time.perf_counter()
    child = subprocess.Popen(
        argv,
        env={**os.environ, **env},
        cwd=WORK,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    stderr = child.stderr.read()
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - started
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode:
        raise RuntimeError(f"{argv} exited {child.returncode}: {stderr.decode()[-2000:]}")
    return {
        "wall": wall,
        "user": usage.ru_utime,
        "sys": usage.ru_stime,
        "rss": usage.ru_maxrss * 1024,
    }


def fresh(path: str) -> str:
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    return path


def compiled(trees):
    """Each tree's ``pileshuffle`` package compiled to bytecode, as ``pip install`` leaves it: where
    the environment sets PYTHONDONTWRITEBYTECODE (this VM does) a checkout would otherwise compile
    its 23,000 lines at every run, 0.2 s of user CPU (a tiny run: 2.20 against 1.99 s)."""
    import compileall

    for tree in trees:
        compileall.compile_dir(os.path.join(tree, "pileshuffle"), quiet=1)


def warm(files):
    for path in files:
        with open(path, "rb") as handle:
            while handle.read(16 << 20):
                pass


def rounds(rows, formats, data, count) -> dict:
    """``{(format, row): [measurement, ...]}``, every row once per round, in turn."""
    results = collections.defaultdict(list)
    for round_number in range(count):
        for fmt in formats:
            for row in rows:
                out_dir = fresh(os.path.join(WORK, "out"))
                result = measure(*command(row, fmt, data[fmt], out_dir))
                results[fmt, row].append(result)
                log(
                    f"round {round_number + 1} {fmt} {row}: {result['wall']:.2f} s wall, user {result['user']:.2f} s, "
                    f"sys {result['sys']:.2f} s, {result['rss'] / GB:.2f} GB"
                )
    shutil.rmtree(os.path.join(WORK, "out"), ignore_errors=True)
    return results


def stage_of(stack) -> str:
    """The stage of one sample (frames root first): its innermost frame that names a stage."""
    for frame in reversed(stack):
        for name, names_it in STAGES:
            if names_it(frame):
                return name
    return OTHER


def profile(row: str, fmt: str, data: dict) -> collections.Counter:
    """``{stage: samples}`` of one pileshuffle run under py-spy."""
    spy = SPY
    out_dir = fresh(os.path.join(WORK, "out"))
    raw = os.path.join(tempfile.mkdtemp(prefix="cpu-per-gb-"), "samples.txt")
    argv, env = command(row, fmt, data, out_dir)
    subprocess.run(
        [
            spy,
            "record",
            "--rate",
            "100",
            "--subprocesses",
            "--nonblocking",
            "--format",
            "raw",
            "--output",
            raw,
            "--",
            *argv,
        ],
        env={**os.environ, **env},
        cwd=WORK,
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    stages = collections.Counter()
    with open(raw, errors="replace") as handle:
        for line in handle:
            body, _, count = line.rstrip("\n").rpartition(" ")
            if body and count.isdigit():
                stack = [f for f in body.split(";") if not f.startswith(("process ", "thread "))]
                stages[stage_of(stack)] += int(count)
    shutil.rmtree(os.path.dirname(raw), ignore_errors=True)
    shutil.rmtree(out_dir, ignore_errors=True)
    return stages


def median(values) -> float:
    return statistics.median(values)


def table(results, formats, rows, data) -> str:
    lines = [
        "| data | row | user CPU s/GB | system CPU s/GB | wall s/GB | peak RSS | user vs DuckDB "
        "| speed vs DuckDB |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for fmt in formats:
        gb = data[fmt]["bytes"] / GB
        for row in rows:
            done, peer = results[fmt, row], results.get((fmt, peer_of(row)))
            user = median(r["user"] for r in done) / gb
            system, wall = median(r["sys"] for r in done) / gb, median(r["wall"] for r in done) / gb
            rss = median(r["rss"] for r in done) / GB
            ratio = f"{user / (median(r['user'] for r in peer) / gb):.2f}x" if peer else ""
            speed = f"{median(r['wall'] for r in peer) / gb / wall:.2f}x" if peer else ""
            lines.append(
                f"| {fmt} {gb:.2f} GB | {row.replace('budget', BUDGET.get('limit', ''))} | "
                f"{user:.2f} | {system:.2f} | {wall:.2f} | {rss:.2f} GB | {ratio} | {speed} |"
            )
    return "\n".join(lines)


def stage_table(stages, results, row, fmt, data) -> str:
    gb = data[fmt]["bytes"] / GB
    cpu = median(r["user"] + r["sys"] for r in results[fmt, row]) / gb
    total = sum(stages.values()) or 1
    lines = [
        f"| {row} {fmt}: stage | share of samples | CPU s/GB (user + system) |",
        "|---|---|---|",
    ]
    for name in [n for n, _ in STAGES] + [OTHER]:
        share = stages.get(name, 0) / total
        lines.append(f"| {name} | {share:.0%} | {share * cpu:.2f} |")
    lines.append(f"| all ({total:,} samples) | 100% | {cpu:.2f} |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--formats", default="parquet,jsonl", help="comma-separated: parquet, jsonl"
    )
    parser.add_argument(
        "--before", help="a tree whose pileshuffle package is measured too (a 'before' row)"
    )
    parser.add_argument("--after", help="a tree measured instead of this checkout (an 'after' row)")
    parser.add_argument(
        "--no-stages", dest="stages", action="store_false", help="no py-spy stage breakdown"
    )
    parser.add_argument("--no-duckdb", dest="duckdb", action="store_false")
    parser.add_argument("--scale", type=int, default=1, help="N times the rows and files")
    parser.add_argument(
        "--memory", help="budget rows too: pileshuffle --memory, DuckDB memory_limit"
    )
    args = parser.parse_args(argv)
    if args.memory:
        BUDGET["limit"] = args.memory
    formats = args.formats.split(",")
    TREES.update(
        {
            row: os.path.abspath(tree)
            for row, tree in (("before", args.before), ("after", args.after))
            if tree
        }
    )
    rows = [
        "after" if args.after else "pileshuffle",
        *(["before"] if args.before else []),
        *(["duckdb"] if args.duckdb else []),
    ]
    rows += [f"{row} budget" for row in rows] if args.memory else []
    data = {fmt: dataset(fmt, args.scale) for fmt in formats}
    compiled([os.path.dirname(HERE), *TREES.values()])
    for fmt in formats:
        warm(data[fmt]["files"])
    results = rounds(rows, formats, data, args.rounds)
    print(
        f"CPU per GB, medians of {args.rounds} interleaved rounds (`{' '.join(['bench/cpu_per_gb.py', *(argv or sys.argv[1:])])}`):\n"
    )
    print(table(results, formats, rows, data))
    if args.stages and not os.path.exists(SPY):
        log(f"no stages: no {SPY} (`.venv/bin/pip install py-spy`)")
    elif args.stages:
        for fmt in formats:
            print()
            print(stage_table(profile(rows[0], fmt, data[fmt]), results, rows[0], fmt, data))


if __name__ == "__main__":
    main()
