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

import argparse
import json
import os
import sys
import time

DUCKDB_PARQUET = "(FORMAT parquet, COMPRESSION snappy)"


def duckdb_dedup(form, pattern, out_dir, threads, memory_limit):
    """The DuckDB rows, run in the peers' venv (only duckdb and the standard library imported)."""
    import duckdb

    config = {
        "threads": threads,
        "temp_directory": os.path.join(out_dir, "spill"),
        **({"memory_limit": memory_limit} if memory_limit else {}),
    }
    source, output = f"read_parquet('{pattern}')", os.path.join(out_dir, "out.parquet")
    started, steps, tmp_bytes = time.perf_counter(), {}, None
    with duckdb.connect(config=config) as connection:
        if form == "two-step":
            tmp = os.path.join(out_dir, "distinct.parquet")
            connection.execute(
                f"COPY (SELECT DISTINCT * FROM {source}) TO '{tmp}' {DUCKDB_PARQUET}"
            )
            steps["distinct"] = time.perf_counter() - started
            connection.execute(
                f"COPY (SELECT * FROM read_parquet('{tmp}') ORDER BY random()) TO '{output}' {DUCKDB_PARQUET}"
            )
            steps["shuffle"] = time.perf_counter() - started - steps["distinct"]
            tmp_bytes = os.path.getsize(tmp)
            os.remove(tmp)
        else:
            connection.execute(
                f"COPY (SELECT * FROM (SELECT DISTINCT * FROM {source}) ORDER BY random()) "
                f"TO '{output}' {DUCKDB_PARQUET}"
            )
    return {
        "duckdb": duckdb.__version__,
        "form": form,
        "threads": threads,
        "memory_limit": memory_limit or "default",
        "seconds": time.perf_counter() - started,
        "steps": steps,
        "tmp_bytes": tmp_bytes,
    }


if __name__ == "__main__" and sys.argv[1:2] == [
    "--duckdb"
]:  # one DuckDB row, in bench/.peers-venv: no numpy, psutil, ...
    form, pattern, folder, threads, limit = sys.argv[2:7]  # limit '': DuckDB's default
    print(json.dumps(duckdb_dedup(form, pattern, folder, int(threads), limit)))
    sys.exit(0)

import glob  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
from datagen import INDEX_DIGITS, index_digits, split_counts  # noqa: E402
from machine import machine, machine_lines  # noqa: E402
from measure import log_tail, measure, stdout_json, wait_for_idle, warm  # noqa: E402
from workspace import DATA, GB, OUT, PEERS_PY, log, pileshuffle_command  # noqa: E402

RECORD_BYTES = (
    1000  # a record's share of the files, as datagen's Parquet (988 MB per 1,000,000 rows)
)
PAYLOAD_BYTES = 960
GROUP_RECORDS = 131_072  # rows per row group (~128 MB): 1 GB in 8 files is one group per file, as datagen writes
FILLER_WORDS = -(-(PAYLOAD_BYTES - INDEX_DIGITS - 1) // 8)  # uint64 hash words per payload's filler
_GOLDEN, _M1, _M2 = (
    np.uint64(0x9E3779B97F4A7C15),
    np.uint64(0xBF58476D1CE4E5B9),
    np.uint64(0x94D049BB133111EB),
)
SEED = 1  # pileshuffle's --seed in every row
ROWS = ("pileshuffle", "pileshuffle-dedup", "duckdb-2step", "duckdb-1query")
PILESHUFFLE_ARGS = {
    "pileshuffle": (),
    "pileshuffle-dedup": ("--dedup", "exact"),
    "pileshuffle-dedup-key": ("--dedup_key", "index"),
}
DUCKDB_ROWS = {"duckdb-2step": "two-step", "duckdb-1query": "one-query"}
TARGET = 1.15  # pileshuffle-dedup's median wall over pileshuffle's


def mixed(x):
    """splitmix64's finalizer over a uint64 array, in place: every output bit depends on every input bit."""
    for shift, factor in ((30, _M1), (27, _M2)):
        x ^= x >> np.uint64(shift)
        x *= factor
    x ^= x >> np.uint64(31)
    return x


def records_of(ids, seed):
    """The table of the records of these distinct ids, every column a function of (id, seed)."""
    n, key = len(ids), ids.astype(np.uint64)
    salt = np.uint64((seed * 0xD1B54A32D192ED03 + 1) % 2**64)
    h = mixed(key * _GOLDEN + salt)
    words = key[:, None] * np.uint64(FILLER_WORDS) + np.arange(FILLER_WORDS, dtype=np.uint64)
    words *= _GOLDEN
    words ^= salt
    filler = mixed(words).view(np.uint8).reshape(n, FILLER_WORDS * 8)
    payload = np.empty((n, PAYLOAD_BYTES), dtype=np.uint8)
    payload[:, :INDEX_DIGITS] = index_digits(ids)
    payload[:, INDEX_DIGITS] = ord("|")
    tail = payload[:, INDEX_DIGITS + 1 :]
    np.remainder(filler[:, : tail.shape[1]], 26, out=tail)
    tail += 97
    offsets = np.arange(n + 1, dtype=np.int32) * PAYLOAD_BYTES
    return pa.table(
        {
            "index": pa.array(ids.astype(np.int64)),
            "label": pa.array((h % np.uint64(10)).astype(np.int32)),
            "weight": pa.array((h >> np.uint64(11)).astype(np.float64) * 2.0**-53),
            "name": pc.binary_join_element_wise("item-", pc.cast(pa.array(ids), pa.string()), ""),
            "payload": pa.Array.from_buffers(
                pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(payload)]
            ),
        }
    ).replace_schema_metadata({"source": "bench.dedup", "seed": str(seed)})


def layout(records, dup_fraction, hot_fraction, seed):
    """(the distinct id of every input position, distinct count, hot id, hot copies)."""
    rng = np.random.default_rng([seed, 7])
    copies, distinct = round(dup_fraction * records), records - round(dup_fraction * records)
    hot = min(copies, max(1, round(hot_fraction * records))) if copies else 0
    hot_id = int(rng.integers(distinct))
    source = np.concatenate(
        [np.arange(distinct), np.full(hot, hot_id), rng.integers(0, distinct, copies - hot)]
    )
    rng.shuffle(source)
    return source, distinct, hot_id, hot


def placement(source, counts):
    """Where the copies are: a copy is every occurrence of an id after its first (in file order)."""
    file_of = np.repeat(np.arange(len(counts)), counts)
    ids, first, occurrences = np.unique(source, return_index=True, return_counts=True)
    assert len(ids) == ids[-1] + 1, "every id 0..U-1 occurs"
    copy = np.ones(len(source), dtype=bool)
    copy[first] = False
    same = file_of[copy] == file_of[first[source[copy]]]
    return {
        "copies_in_their_originals_file": int(same.sum()),
        "copies_in_other_files": int((~same).sum()),
        "records_with_copies": int((occurrences > 1).sum()),
        "max_occurrences": int(occurrences.max()),
    }


def dataset(size_bytes, dup_fraction, files, seed, hot_fraction):
    """The cached data set (generated if missing): its dataset.json, with ``distinct_records``."""
    records = max(files, round(size_bytes / RECORD_BYTES))
    params = {
        "version": 2,
        "records": records,
        "files": files,
        "record_bytes": RECORD_BYTES,
        "dup_fraction": dup_fraction,
        "hot_fraction": hot_fraction,
        "seed": seed,
    }
    name = f"parquet-dedup-{records}x{RECORD_BYTES}-{files}f-d{dup_fraction:g}-h{hot_fraction:g}-s{seed}"
    directory = os.path.join(DATA, name)
    stamp = os.path.join(directory, "dataset.json")
    if os.path.exists(stamp):
        with open(stamp) as handle:
            if (info := json.load(handle)).get("params") == params:
                return info
    shutil.rmtree(directory, ignore_errors=True)
    os.makedirs(directory)
    if shutil.disk_usage(directory).free < 2 * records * RECORD_BYTES:
        raise SystemExit(
            f"{name}: less than {2 * records * RECORD_BYTES / GB:.1f} GB free under {DATA}"
        )
    log(f"generating {name} ...")
    started = time.perf_counter()
    source, distinct, hot_id, hot = layout(records, dup_fraction, hot_fraction, seed)
    counts, start = split_counts(records, files), 0
    for f, count in enumerate(counts):
        with pq.ParquetWriter(
            os.path.join(directory, f"part-{f:05d}.parquet"), records_of(source[:1], seed).schema
        ) as writer:
            for group in range(start, start + count, GROUP_RECORDS):
                writer.write_table(
                    records_of(source[group : min(group + GROUP_RECORDS, start + count)], seed)
                )
        start += count
    paths = sorted(glob.glob(os.path.join(directory, "*.parquet")))
    info = {
        "name": name,
        "params": params,
        "format": "parquet",
        "records": records,
        "distinct_records": distinct,
        "duplicate_records": records - distinct,
        "hot_record_index": hot_id,
        "hot_record_occurrences": int((source == hot_id).sum()),
        **placement(source, counts),
        "directory": directory,
        "pattern": os.path.join(directory, "*.parquet"),
        "files": paths,
        "bytes": sum(os.path.getsize(p) for p in paths),
    }
    with open(stamp + ".tmp", "w") as handle:
        json.dump(info, handle, indent=1)
    os.rename(stamp + ".tmp", stamp)
    log(
        f"generated {name}: {info['bytes'] / 1e6:,.0f} MB, {distinct:,} distinct of {records:,}, "
        f"in {time.perf_counter() - started:.1f} s"
    )
    return info


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
        os.path.abspath(__file__),
        "--duckdb",
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


def summarize(row, runs, skipped):
    """A row's medians over its good runs (all runs if none was good)."""
    if skipped:
        return {"row": row, "status": skipped, "runs": []}
    good, bad = (
        [r for r in runs if r["check_ok"]] or runs,
        [r["check"] for r in runs if not r["check_ok"]],
    )
    return {
        "row": row,
        "status": bad[0] if bad else "ok",
        "runs": runs,
        "median_wall_seconds": round(statistics.median(r["wall_seconds"] for r in good), 3),
        "peak_rss_bytes": max(r["peak_rss_bytes"] for r in good),
        "median_cores": round(statistics.median(r["cores_used"] for r in good), 2),
        "max_others_busy": max(r["others_busy"] for r in runs),
        "records_out": good[0]["records_out"],
        "peak_disk_bytes": max(r["peak_disk_bytes"] or 0 for r in good),
    }


def add_ratios(rows):
    """x plain and x duckdb-2step from the medians, and the per-round ratio to plain (same round)."""
    by = {r["row"]: r for r in rows}
    for r in rows:
        for key, base in (("x_plain", "pileshuffle"), ("x_duckdb_2step", "duckdb-2step")):
            b = by.get(base)
            ok = r["status"] == "ok" and b and b["status"] == "ok"
            r[key] = round(r["median_wall_seconds"] / b["median_wall_seconds"], 3) if ok else None
        plain = by.get("pileshuffle", {}).get("runs", [])
        if r["runs"] and r["row"] != "pileshuffle" and len(plain) == len(r["runs"]):
            r["round_x_plain"] = [
                round(a["wall_seconds"] / p["wall_seconds"], 3) for a, p in zip(r["runs"], plain)
            ]
    dedup = by.get("pileshuffle-dedup")
    if dedup is not None:
        x = dedup["x_plain"]
        dedup["target"] = (
            (f"<= {TARGET}x plain: " + ("PASS" if x <= TARGET else "FAIL") + f" ({x:.2f}x)")
            if x
            else f"<= {TARGET}x plain: not measured"
        )


def notes(r):
    if not r["runs"]:
        return ""
    walls = ", ".join(f"{x['wall_seconds']:.2f}" for x in r["runs"])
    details = next((x.get("details") or {} for x in r["runs"] if x["check_ok"]), {})
    extra = (
        [f"{details.get('num_piles')} piles; pipeline {details['pipeline_seconds']:.2f} s"]
        if details.get("pipeline_seconds") is not None
        else []
    )
    if details.get("memory_limit"):  # DuckDB's
        extra.append(
            f"DuckDB {details.get('duckdb')}, memory_limit {details['memory_limit']}"
            + "".join(f", {k} {v:.2f} s" for k, v in details.get("steps", {}).items())
        )
    paired = (
        f" (x plain: {', '.join(f'{x:.2f}' for x in r['round_x_plain'])})"
        if r.get("round_x_plain")
        else ""
    )
    return "; ".join(extra + [f"rounds: {walls} s{paired}"])


def table(sets):
    head = [
        "data",
        "row",
        "median wall s",
        "peak RSS GB",
        "cores",
        "records in",
        "records out",
        "check",
        "x plain",
        "x duckdb-2step",
        "others % (max)",
        "target",
        "notes",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for data, rows in sets:
        for r in rows:
            got = {
                k: r.get(k)
                for k in (
                    "median_wall_seconds",
                    "peak_rss_bytes",
                    "median_cores",
                    "x_plain",
                    "x_duckdb_2step",
                )
            }
            cells = [
                "-" if v is None else f"{v / GB if k == 'peak_rss_bytes' else v:.2f}"
                for k, v in got.items()
            ]
            out, others = r.get("records_out"), r.get("max_others_busy")
            lines.append(
                f"| {data['bytes'] / 1e6:,.0f} MB, {data['params']['dup_fraction']:g} copies | {r['row']} | "
                + " | ".join(cells[:3])
                + f" | {data['records']:,} | {'-' if out is None else f'{out:,}'} | "
                f"{r['status']} | {cells[3]} | {cells[4]} | {'-' if others is None else f'{100 * others:.0f}'} | "
                f"{r.get('target', '')} | {notes(r)} |"
            )
    return lines


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
            for row in (
                rows[round_index % len(rows) :] + rows[: round_index % len(rows)]
            ):  # each round starts one row later
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
