"""CPU seconds per GB at the job's regime: 10, 60 and 240 records per part (issue 55).

    .venv/bin/python bench/regime_rates.py                # 3 rounds, both modes, ~0.5 GB
    .venv/bin/python bench/regime_rates.py --rounds 2 --modes files

A 10-100 TB job of 1 KB records runs at 10-240 records per part (a part: one run's piece of one
pile, about run_bytes / num_piles / (record + 16 bytes) records). Each row sets that regime with
explicit options on the bench's 500,000 TFRecords of 1,000 bytes (bench/datagen.py, 8 files,
508 MB): ``--num_piles`` and ``--run_bytes`` from ``REGIMES`` (piles of 2-4 MB, over the 1 MiB
below which pass 2 groups piles and a part spans a group; a pass-1 unit here reads at most
~32 MB, so 240 records per part needs fewer piles); ``plan --json`` gives the records per part
it expects (printed beside each row). ``--memory 1GiB``, so runs that do not fit go through the
temp folder as on a worker; each run under ``capped 6G``.

A row is one ``pileshuffle run`` measured by ``os.wait4`` (user + system CPU of it and its
waited-for children, as GNU time, and user CPU alone: on a VM whose page faults cost erratic
system time it is the steadier figure) and wall time; pass 1's share is the CPU of the process tree
read from /proc when its "pass 1: 100%" progress line arrives (pass 2: the rest, which includes
exit). Rows interleave, round by round; the table gives medians. Per GB means per 1e9 input bytes.
At 10 records per part the runs here are 2.9 MB (a job's are ~1 GiB): the row also pays per-run
costs a job spreads over 300x more bytes, so it reads high. Nothing here is remote: a Dataflow
worker's reads, writes and SDK harness come on top (``job_model.WORKER_OVERHEAD``).
"""

import argparse
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import datagen  # noqa: E402
from workspace import DATA, GB, OUT, log, pileshuffle_command  # noqa: E402

RECORDS, FILES, RECORD_BYTES = 500_000, 8, 1000
# records per part: (piles, run bytes), chosen with plan --json (runs split where files end)
REGIMES = {10: (260, 2_905_760), 60: (260, 17_434_560), 240: (130, 40_000_000)}
WORK = os.path.join(OUT, "regime_rates")
TICK = os.sysconf("SC_CLK_TCK")


def tree_cpu(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and its live descendants, from /proc."""
    total, todo = 0.0, [pid]
    while todo:
        current = todo.pop()
        try:
            with open(f"/proc/{current}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / TICK
            for task in os.listdir(f"/proc/{current}/task"):
                with open(f"/proc/{current}/task/{task}/children") as kids:
                    todo += [int(kid) for kid in kids.read().split()]
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total


def options(pattern: str, rpp: int, mode: str) -> list:
    piles, run_bytes = REGIMES[rpp]
    return [
        "--input",
        pattern,
        "--num_piles",
        str(piles),
        "--run_bytes",
        str(run_bytes),
        "--memory",
        "1GiB",
        "--intermediate",
        mode,
        "--seed",
        "1",
    ]


def planned(pattern: str, rpp: int, mode: str) -> dict:
    """``plan --json``'s records per part and parts for the row's options."""
    out = os.path.join(WORK, "plan", "o")
    text = subprocess.run(
        pileshuffle_command() + ["plan", "--json", "--output", out] + options(pattern, rpp, mode),
        check=True,
        capture_output=True,
    ).stdout
    figures = json.loads(text)["modes"][mode]
    return {"records_per_part": figures["records_per_part"], "parts": figures["parts"]}


def measure(pattern: str, rpp: int, mode: str) -> dict:
    """One run: CPU seconds (whole, pass 1), wall seconds."""
    out = os.path.join(WORK, f"{mode}-{rpp}")
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    command = ["capped", "6G"] + pileshuffle_command() + ["run", "--output", os.path.join(out, "o")]
    start = time.perf_counter()
    child = subprocess.Popen(
        command + options(pattern, rpp, mode),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    pass1, lines = None, []
    for line in child.stderr:  # progress lines end in \r or \n: a line arrives when either ends
        lines.append(line)
        if pass1 is None and "pass 1: 100%" in line:
            pass1 = tree_cpu(child.pid)
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - start
    if status:
        raise SystemExit(f"{' '.join(command)} failed:\n{''.join(lines[-20:])}")
    shutil.rmtree(out, ignore_errors=True)
    return {
        "cpu": usage.ru_utime + usage.ru_stime,
        "user": usage.ru_utime,
        "pass1": pass1,
        "wall": wall,
    }


def table(rows: dict, plans: dict, size: float) -> str:
    head = (
        "| mode | records per part (plan) | piles | parts | CPU-s/GB | pass 1 | pass 2 |"
        " user CPU-s/GB | wall s/GB | MB/s per CPU-s |\n|---|---|---|---|---|---|---|---|---|---|\n"
    )
    body = ""
    for (mode, rpp), runs in rows.items():
        cpu = statistics.median(r["cpu"] for r in runs) / size
        first = [r["pass1"] for r in runs if r["pass1"] is not None]
        one = statistics.median(first) / size if first else float("nan")
        wall = statistics.median(r["wall"] for r in runs) / size
        user = statistics.median(r["user"] for r in runs) / size
        plan = plans[mode, rpp]
        body += (
            f"| {mode} | {rpp} ({plan['records_per_part']:,.1f}) | {REGIMES[rpp][0]} | "
            f"{plan['parts']:,} | "
            f"{cpu:.1f} | {one:.1f} | {cpu - one:.1f} | {user:.1f} | {wall:.1f} | {1000 / cpu:.0f} |\n"
        )
    return head + body


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--modes", default="files,shuffle")
    args = parser.parse_args()
    info = datagen.dataset(DATA, "tfrecord", RECORDS, FILES, RECORD_BYTES, log=log)
    size = info["bytes"] / GB
    modes = args.modes.split(",")
    plans = {(m, rpp): planned(info["pattern"], rpp, m) for m in modes for rpp in REGIMES}
    rows = {key: [] for key in plans}
    for round_ in range(args.rounds):
        for rpp in REGIMES:
            for mode in modes:
                rows[mode, rpp].append(measure(info["pattern"], rpp, mode))
                log(f"round {round_ + 1}: {mode} {rpp}: {rows[mode, rpp][-1]}")
    print(
        f"{info['bytes'] / 1e6:,.0f} MB of 1 KB TFRecords, --memory 1GiB, "
        f"{args.rounds} rounds, medians ({datetime.date.today()}):\n"
    )
    print(table(rows, plans, size))


if __name__ == "__main__":
    main()
