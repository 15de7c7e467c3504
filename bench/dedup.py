"""Exact deduplication inside the shuffle, ``pileshuffle run --dedup exact``, against a plain run of
the same input and against what users do today with DuckDB (bench/README.md, "dedup").

    .venv/bin/python bench/dedup.py                                  # 1 GB of Parquet, 10% and 50% copies, 3 rounds
    .venv/bin/python bench/dedup.py --size 10GB                      # the paper figure (~20 GB of data, ~30 GB while a row runs)
    .venv/bin/python bench/dedup.py --size 100MB --dup_fraction 0.1  # a smoke run

Input: Parquet like datagen's (``index`` int64, ``label`` int32, ``weight`` float64, ``name`` string,
``payload`` binary: 960 bytes, the index's 12 digits, ``|``, a-z filler), ``--size`` bytes of it (~1,000 a
record) in ``--files`` files. ``--dup_fraction F``: the share of the N input records that are exact copies
(every column equal) of another input record: K = round(F x N) copies, U = N - K distinct records (what a
dedup writes; dataset.json's ``distinct_records``). One hot record has round(--hot_fraction x N) of the
copies, the rest copy distinct records drawn uniformly; all N are put in a random order, so copies land in
other files and (~1 in --files) in their original's file. A record is a function of its id (``index``,
0..U-1). Cached in bench/.data/parquet-dedup-NxBYTES-Ff-dF-hH-sSEED.

Rows (each one process tree, bench/measure.py: wall, peak tree RSS, CPU), interleaved (round r starts at
row r), medians over --rounds:
  pileshuffle            pileshuffle run --format parquet --seed 1: N records out
  pileshuffle-dedup      the same with --dedup exact: U out; target <= 1.15 x pileshuffle (medians)
  duckdb-2step           one DuckDB process (.peers-venv, 2 threads): COPY (SELECT DISTINCT * FROM read_parquet(IN))
                         TO tmp, then COPY (SELECT * FROM read_parquet(tmp) ORDER BY random()) TO out; both timed
  duckdb-1query          COPY (SELECT * FROM (SELECT DISTINCT * FROM read_parquet(IN)) ORDER BY random()) TO out
  pileshuffle-dedup-key  (--rows only) --dedup_key index: also U out here
Each output's count (manifest ``totals.records``; DuckDB: the Parquet footer) must be N (plain) or U and its
``index`` column must hold every id 0..U-1 (once, deduplicated), else the row FAILs loudly (exit status 1). A
row whose option ``pileshuffle run --help`` lacks is skipped. Results: stdout, bench/.out/dedup/dedup-SIZE.md
and .json (every run); outputs are deleted after each run.
"""

# This script runs and checks the rows; the data set is bench/dedup_data.py's, the DuckDB rows are
# bench/dedup_duckdb.py's (run in the peers' venv), the medians, ratios and table bench/dedup_report.py's.

import argparse
import glob
import json
import os
import re
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

# one DuckDB row, in bench/.peers-venv: no numpy, psutil, ... (bench/dedup_duckdb.py runs it)
if __name__ == "__main__" and sys.argv[1:2] == ["--duckdb"]:
    from dedup_duckdb import main as duckdb_main

    sys.exit(duckdb_main(sys.argv[2:]))

import numpy as np  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
from dedup_data import dataset  # noqa: E402
from dedup_report import add_ratios, summarize, table  # noqa: E402
from machine import machine, machine_lines  # noqa: E402
from measure import log_tail, measure, stdout_json, wait_for_idle, warm  # noqa: E402
from workspace import DATA, GB, OUT, PEERS_PY, log, pileshuffle_command  # noqa: E402

SEED = 1  # pileshuffle's --seed in every row
ROWS = ("pileshuffle", "pileshuffle-dedup", "duckdb-2step", "duckdb-1query")
PILESHUFFLE_ARGS = {
    "pileshuffle": (),
    "pileshuffle-dedup": ("--dedup", "exact"),
    "pileshuffle-dedup-key": ("--dedup_key", "index"),
}
DUCKDB_ROWS = {"duckdb-2step": "two-step", "duckdb-1query": "one-query"}


def missing_option(row):
    """Why ``row`` cannot run here, or None."""
    if row in DUCKDB_ROWS:
        return None if os.path.exists(PEERS_PY) else f"skipped: no {PEERS_PY} (make peers)"
    if not PILESHUFFLE_ARGS[row]:
        return None
    option, got = (
        PILESHUFFLE_ARGS[row][0],
        subprocess.run([*pileshuffle_command(), "run", "--help"], capture_output=True, text=True),
    )
    return (
        None
        if re.search(re.escape(option) + r"(?!\w)", got.stdout + got.stderr)
        else f"skipped: `pileshuffle run --help` has no {option}"
    )


def command(row, data, out_dir, args):
    if row in PILESHUFFLE_ARGS:
        return [
            *pileshuffle_command(),
            "run",
            "--input",
            data["pattern"],
            "--output",
            os.path.join(out_dir, "train"),
            "--format",
            "parquet",
            "--seed",
            str(SEED),
            *PILESHUFFLE_ARGS[row],
        ]
    return [
        PEERS_PY,
        os.path.join(HERE, "dedup_duckdb.py"),
        DUCKDB_ROWS[row],
        data["pattern"],
        out_dir,
        str(args.duckdb_threads),
        args.duckdb_memory_limit,
    ]


def check(row, data, out_dir, name):
    """(ok, text, records out, details) of a finished run's output: its count and its ids."""
    expected = data["records"] if row == "pileshuffle" else data["distinct_records"]
    if row in PILESHUFFLE_ARGS:
        files = sorted(glob.glob(os.path.join(out_dir, "train-*-of-*.parquet")))
        with open(os.path.join(out_dir, "train-manifest.json")) as handle:
            manifest = json.load(handle)
        count, source = manifest["totals"]["records"], "manifest"
        details = {
            "pipeline_seconds": manifest.get("seconds"),
            "num_piles": manifest.get("num_piles"),
            "dedup": {k: v for k, v in manifest.get("dedup", {}).items() if k != "largest_groups"},
        }
    else:
        files = [os.path.join(out_dir, "out.parquet")]
        count, source = sum(pq.ParquetFile(f).metadata.num_rows for f in files), "footer"
        details = stdout_json(name)
    ids = np.concatenate([pq.read_table(f, columns=["index"]).column(0).to_numpy() for f in files])
    distinct, read = (
        data["distinct_records"],
        details.get("dedup", {}).get("records_read", data["records"]),
    )
    in_range = len(ids) > 0 and 0 <= ids.min() and ids.max() < distinct
    seen = np.bincount(ids, minlength=distinct) if in_range else np.zeros(distinct, np.int64)
    problems = [
        text
        for bad, text in (
            (count != expected, f"{count:,} records != {expected:,}"),
            (len(ids) != count, f"{len(ids):,} rows in the files, {count:,} in the {source}"),
            (
                read != data["records"],
                f"the manifest's dedup read {read:,} records, not {data['records']:,}",
            ),
            (not in_range, "ids outside 0..U-1"),
            (in_range and seen.min() < 1, f"{int((seen < 1).sum()):,} of the ids 0..U-1 missing"),
            (
                row != "pileshuffle" and seen.max() > 1,
                f"{int((seen > 1).sum()):,} ids more than once",
            ),
        )
        if bad
    ]
    text = f"ok {count:,} ({source})" if not problems else "FAIL: " + "; ".join(problems)
    return not problems, text, count, details


def run_once(row, data, args, label):
    """One measured and checked run of ``row`` in a fresh bench/.out/dedup/ROW (deleted after)."""
    out_dir = os.path.join(OUT, "dedup", row)
    shutil.rmtree(out_dir, ignore_errors=True)
    os.makedirs(out_dir)
    warm(data["files"])
    waited, others = wait_for_idle(args.idle_wait) if args.idle_wait > 0 else (0.0, None)
    if waited >= args.idle_wait > 0:
        log(
            f"[{label} {row}] others still used {others:.2f} cores after {waited:.0f} s: running anyway"
        )
    name = f"dedup-{label}-{row}"
    log(f"[{label} {row}] {' '.join(cmd := command(row, data, out_dir, args))}")
    m = measure(cmd, name, args.timeout, disk_dir=out_dir)
    run = {
        "returncode": m.returncode,
        "wall_seconds": round(m.wall, 3),
        "peak_rss_bytes": m.peak_rss,
        "cpu_seconds": round(m.cpu, 2),
        "cores_used": round(m.cpu / m.wall, 2),
        "others_busy": round(m.others, 3),
        "peak_disk_bytes": m.peak_disk,
        "idle_wait_seconds": round(waited, 1),
        "records_out": None,
    }
    if m.returncode != 0:
        run["check_ok"], run["check"] = False, f"FAIL: exit {m.returncode}"
        log(
            f"[{label} {row}] FAILED (exit {m.returncode}); bench/.out/logs/{name}.err ends:\n{log_tail(name)}"
        )
    else:
        try:
            run["check_ok"], run["check"], run["records_out"], run["details"] = check(
                row, data, out_dir, name
            )
        except Exception as error:  # a missing or malformed output is a failed check, not a crash
            run["check_ok"], run["check"] = False, f"FAIL: {type(error).__name__}: {error}"
        if not run["check_ok"]:
            log(f"!!! [{label} {row}] OUTPUT CHECK {run['check']}")
    shutil.rmtree(out_dir, ignore_errors=True)
    log(f"[{label} {row}] {m.wall:.2f} s, peak RSS {m.peak_rss / GB:.2f} GB, {run['check']}")
    return run


def parse_size(text):
    match = re.fullmatch(r"([0-9.]+)([KMGT]?)B?", text.strip().upper())
    if not match:
        raise argparse.ArgumentTypeError(f"{text!r}: a size like 100MB, 1GB, 10GB (decimal units)")
    return float(match.group(1)) * 1000 ** " KMGT".index(match.group(2))


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--size",
        type=parse_size,
        default=1e9,
        help="input bytes (decimal: 100MB, 1GB, 10GB); default 1GB",
    )
    parser.add_argument(
        "--dup_fraction",
        default="0.1,0.5",
        help="comma-separated shares of input records that are copies",
    )
    parser.add_argument(
        "--hot_fraction",
        type=float,
        default=0.001,
        help="copies of the one hot record, as a share of all records",
    )
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0, help="the data set's seed")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--rows",
        default=",".join(ROWS),
        help=f"comma-separated, of {', '.join([*ROWS, 'pileshuffle-dedup-key'])}",
    )
    parser.add_argument("--duckdb_threads", type=int, default=2)
    parser.add_argument(
        "--duckdb_memory_limit", default="", help="e.g. 2GB (default: DuckDB's own, 80%% of RAM)"
    )
    parser.add_argument(
        "--idle_wait",
        type=float,
        default=30,
        help="wait up to S s before each run for others to go quiet",
    )
    parser.add_argument(
        "--timeout", type=float, default=3600, help="seconds before a run is killed"
    )
    args = parser.parse_args(argv)
    fractions = [float(f) for f in args.dup_fraction.split(",") if f.strip()]
    rows = [r.strip() for r in args.rows.split(",") if r.strip()]
    unknown = [r for r in rows if r not in PILESHUFFLE_ARGS and r not in DUCKDB_ROWS]
    if (
        unknown
        or not rows
        or any(not 0 <= f < 1 for f in fractions)
        or not 0 <= args.hot_fraction < 1
    ):
        parser.error(
            f"--rows {unknown or ''} / --dup_fraction in [0, 1) / --hot_fraction in [0, 1)"
        )
    m = machine()
    size_label = f"{args.size / 1e9:g}GB"
    title = f"dedup bench: {size_label} of Parquet in {args.files} files, copies {args.dup_fraction}, {args.rounds} round(s)"
    print(title + "\n" + "\n".join(machine_lines(m)), flush=True)
    skipped = {row: missing_option(row) for row in rows}
    log("\n".join(f"[{row}] {why}" for row, why in skipped.items() if why) or "every row can run")
    sets = []
    for fraction in fractions:
        data = dataset(args.size, fraction, args.files, args.seed, args.hot_fraction)
        if shutil.disk_usage(OUT if os.path.exists(OUT) else DATA).free < 3 * data["bytes"]:
            log(
                f"warning: less than {3 * data['bytes'] / GB:.1f} GB free: DuckDB's rows may fail for lack of disk"
            )
        runs = {row: [] for row in rows}
        for round_index in range(args.rounds):
            log(f"copies {fraction:g}: round {round_index + 1} of {args.rounds}")
            # each round starts one row later
            for row in rows[round_index % len(rows) :] + rows[: round_index % len(rows)]:
                if not skipped[row]:
                    runs[row].append(run_once(row, data, args, f"{size_label}-d{fraction:g}"))
        summary = [summarize(row, runs[row], skipped[row]) for row in rows]
        add_ratios(summary)
        sets.append((data, summary))
    lines = table(sets)
    print("\n" + "\n".join(lines))
    folder = os.path.join(OUT, "dedup")
    os.makedirs(folder, exist_ok=True)
    m["load_average_at_end"], given = (
        [round(x, 2) for x in os.getloadavg()],
        " ".join(sys.argv[1:] if argv is None else argv),
    )
    with open(os.path.join(folder, f"dedup-{size_label}.md"), "w") as handle:
        handle.write(
            f"{title}\n\n`python bench/dedup.py {given}`\n\n"
            + "\n".join(machine_lines(m))
            + "\n\n"
            + "\n".join(lines)
            + "\n"
        )
    with open(os.path.join(folder, f"dedup-{size_label}.json"), "w") as handle:
        json.dump(
            {
                "title": title,
                "command": f"python bench/dedup.py {given}",
                "machine": m,
                "sets": [{"dataset": d, "rows": s} for d, s in sets],
            },
            handle,
            indent=1,
        )
    log(f"wrote {os.path.join(folder, f'dedup-{size_label}')}.md and .json")
    failed = [
        f"{d['params']['dup_fraction']:g} {r['row']}"
        for d, s in sets
        for r in s
        if r["runs"] and r["status"] != "ok"
    ]
    if failed:
        print(f"\n!!! rows that FAILED (exit status or output check): {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
