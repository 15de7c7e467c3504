"""Running the shuffle bench's rows: one measured and checked run of a row, rounds of every
planned row, and each row's fastest and median run with its ratios to the floor."""

import json
import os
import shutil
import statistics

import checks
from measure import log_tail, measure, stdout_json, wait_for_idle, warm
from shuffle_rows import PEERS, command_for, extra_args
from workspace import GB, OUT, log


def run_row(name, kind, fmt, data, piles, timeout, keep, idle_wait, extra=()):
    """One run of a row in a fresh bench/.out/NAME: warm its input, wait for quiet, measure it,
    check its output; returns the row's result dict. ``extra``: the row's own options."""
    out_dir = os.path.join(OUT, name)
    shutil.rmtree(out_dir, ignore_errors=True)
    os.makedirs(out_dir)
    cmd, outputs = command_for(kind, fmt, data, out_dir, piles, extra)
    warm(data["files"])
    waited, _ = wait_for_idle(idle_wait) if idle_wait > 0 else (0.0, None)
    if waited >= 2:
        log(
            f"[{name}] waited {waited:.0f} s for other processes to go quiet"
            + (" (they did not: running anyway)" if waited >= idle_wait else "")
        )
    shown = cmd if len(cmd) < 14 else cmd[:5] + [f"... ({len(data['files'])} input files)"]
    log(f"[{name}] {' '.join(shown)}")
    m = measure(cmd, name, timeout, disk_dir=out_dir)
    row = {
        "name": name,
        "kind": kind,
        "format": fmt,
        "dataset": data["name"],
        "input_bytes": data["bytes"],
        "records": data["records"],
        "num_piles": piles if kind in ("floor", "pileshuffle") else None,
        "returncode": m.returncode,
        "wall_seconds": round(m.wall, 3),
        "mb_per_s": round(data["bytes"] / 1e6 / m.wall, 1),
        "records_per_s": round(data["records"] / m.wall),
        "peak_rss_bytes": m.peak_rss,
        "peak_processes": m.peak_procs,
        "cpu_seconds": round(m.cpu, 2),
        "user_cpu_seconds": round(m.user, 2),
        "system_cpu_seconds": round(m.system, 2),
        "cores_used": round(m.cpu / m.wall, 2),
        "other_processes_busy": round(m.others, 3),
        "idle_wait_seconds": round(waited, 1),
        "peak_disk_bytes": m.peak_disk,  # everything under bench/.out/NAME: output, work files, spills, caches
        "end_disk_bytes": m.end_disk,
        "output_bytes": None,
        "block_chi2": None,
        "block_chi2_dof": None,
        "check_ok": None,
        "check": "",
        "ascending_pairs": None,
        "notes": "",
    }
    if m.returncode != 0:
        row["check_ok"], row["check"] = False, f"FAIL: exit {m.returncode}"
        log(f"[{name}] failed (exit {m.returncode}); stderr tail:\n{log_tail(name)}")
    elif kind == "cat":
        row["check"] = "n/a"
    else:
        check_row_output(row, outputs, out_dir, piles)
    if not keep:
        shutil.rmtree(out_dir, ignore_errors=True)
    log(
        f"[{name}] {m.wall:.2f} s, {row['mb_per_s']:,.0f} MB/s, peak RSS {m.peak_rss / GB:.2f} GB, {row['check']}"
    )
    return row


def check_row_output(row, outputs, out_dir, piles):
    """Fill ``row``'s check (record count, in-order share) and notes from a finished run's output."""
    name, kind, fmt = row["name"], row["kind"], row["format"]
    files = checks.output_files(outputs)
    manifest = os.path.join(out_dir, "train-manifest.json") if kind == "pileshuffle" else None
    try:
        ok, text, ascending = checks.check_output(fmt, files, row["records"], manifest)
    except Exception as error:  # a malformed output is a failed check, not a crash of the bench
        ok, text, ascending = False, f"FAIL: {error}", None
    row["check_ok"], row["check"], row["ascending_pairs"] = ok, text, ascending
    row["output_files"] = len(files)
    row["output_bytes"] = sum(os.path.getsize(f) for f in files)
    add_order_check(row, files)
    if kind == "pileshuffle" and manifest and os.path.exists(manifest):
        with open(manifest) as handle:
            man = json.load(handle)
        row["pipeline_seconds"] = man.get("seconds")
        row["notes"] = (
            f"{man['num_piles']} piles ({'auto' if 'auto' in man['options']['num_piles_reason'] else 'fixed'}); "
            f"pipeline {man.get('seconds') or float('nan'):.2f} s"
        )
    elif kind == "floor":
        info = stdout_json(name)
        row["notes"] = (
            f"{piles} piles; pass 1 {info.get('pass1_seconds', float('nan')):.2f} s, pass 2 {info.get('pass2_seconds', float('nan')):.2f} s"
        )
    elif kind == "beam-common":
        info = stdout_json(name)
        row["notes"] = f"{len(files)} shard(s); pipeline {info.get('seconds', float('nan')):.2f} s"
    elif kind == "shuf":
        row["notes"] = "GNU shuf, whole input in RAM"
    elif kind in ("duckdb", "duckdb-ram"):
        info = stdout_json(name)
        row["notes"] = f"DuckDB ORDER BY random(), memory_limit {info.get('memory_limit')}" + (
            f" after {info['attempts'] - 1} out-of-memory attempt(s)"
            if info.get("attempts", 1) > 1
            else ""
        )
    elif kind in PEERS:
        info = stdout_json(name)
        row["notes"] = (
            f"{kind} {info.get('version')}; start {info.get('start_seconds', float('nan')):.2f} s, "
            f"shuffle {info.get('seconds', float('nan')):.2f} s; {len(files)} file(s)"
        )


def add_order_check(row, files):
    """The row's block chi-square (bench/checks.block_chi2) over every output record, untimed."""
    try:
        indices = checks.order_indices(row["format"], files)
        got = checks.block_chi2(indices) if indices is not None else None
    except Exception as error:  # a malformed output already failed the count check
        log(f"[{row['name']}] order check failed: {error}")
        got = None
    if got:
        row["block_chi2"], row["block_chi2_dof"] = round(got[0], 1), got[1]


def run_rounds(plan, datasets, piles, repeat, timeout, keep, idle_wait):
    """{row name: [one result per round]}.

    Rounds, not one row's runs back to back: a slow spell of the VM (see bench/README.md)
    then hits every row of a round alike instead of all the runs of one row."""
    attempts = {name: [] for name, *_ in plan}
    for round_index in range(repeat):
        if repeat > 1:
            log(f"round {round_index + 1} of {repeat}")
        for name, kind, key, fmt in plan:
            attempts[name].append(
                run_row(
                    name,
                    kind,
                    fmt,
                    datasets[key],
                    piles.get(key),
                    timeout,
                    keep,
                    idle_wait,
                    extra_args(name, piles),
                )
            )
    return attempts


def fastest_runs(plan, attempts):
    """Each row's fastest good run (any run if none was good), with every run's wall time and
    the median over the good ones, in plan order."""
    rows = []
    for name, *_ in plan:
        runs = attempts[name]
        ok = [a for a in runs if a["returncode"] == 0 and a["check_ok"] is not False] or runs
        best = dict(min(ok, key=lambda a: a["wall_seconds"]))
        best["attempts_wall_seconds"] = [a["wall_seconds"] for a in runs]
        best["median_wall_seconds"] = round(statistics.median(a["wall_seconds"] for a in ok), 3)
        for kind in ("user", "system"):  # CPU seconds per GB of input, median over the good runs
            per_gb = [a[f"{kind}_cpu_seconds"] / (a["input_bytes"] / 1e9) for a in ok]
            best[f"median_{kind}_cpu_per_gb"] = round(statistics.median(per_gb), 2)
        rows.append(best)
    return rows


def add_floor_ratios(rows, repeat):
    """Each row's wall (fastest and median) over that of the floor of its data set; with several
    rounds, every round's wall time goes into the notes."""
    floors = {
        (r["format"], r["dataset"]): r
        for r in rows
        if r["kind"] == "floor" and r["returncode"] == 0
    }
    for r in rows:
        floor = floors.get((r["format"], r["dataset"]))
        r["ratio"] = (
            round(r["wall_seconds"] / floor["wall_seconds"], 3)
            if floor and r["returncode"] == 0
            else None
        )
        r["median_ratio"] = (
            round(r["median_wall_seconds"] / floor["median_wall_seconds"], 3)
            if floor and r["returncode"] == 0
            else None
        )
        if repeat > 1:
            r["notes"] = (
                r["notes"] + "; " if r["notes"] else ""
            ) + f"{repeat} rounds: {', '.join(f'{w:.2f}' for w in r['attempts_wall_seconds'])} s"
