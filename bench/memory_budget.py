"""``--memory``: a run's peak memory against its budget, and what keeping pass-1 runs in memory
between the passes saves (``pileshuffle.engine.memory_runs``).

    python bench/memory_budget.py                       # 1 GB of Parquet, 3 rounds
    python bench/memory_budget.py --scale 10 --rounds 1 # 10 GB (80 files)

Each round runs ``pileshuffle run --seed 1`` with each budget in a fresh process, interleaved, on a
warm page cache; the rows are medians of wall time and CPU seconds, the largest peak RSS of the
process tree, the runs ``plan`` says the budget keeps in memory, and whether the peak stayed within
the budget (``auto`` is 60% of the memory available when the run starts).
"""

import argparse
import os
import statistics
import sys

from apache_beam.options.pipeline_options import PipelineOptions
from datagen import dataset
from measure import measure_run
from workspace import DATA, OUT

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from pileshuffle.planning.plan import make_plan  # noqa: E402

BUDGETS = ("1GiB", "2GiB", "auto")


def run(info, budget, scale):
    out = os.path.join(OUT, "memory_budget", budget)
    cmd = [
        sys.executable,
        "-m",
        "pileshuffle",
        "run",
        "--input",
        info["pattern"],
        "--output",
        os.path.join(out, "s"),
        "--seed",
        "1",
        "--quiet",
        "--memory",
        budget,
    ]
    return measure_run(cmd, f"memory_budget-{budget}-x{scale:g}", out, info["files"])


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--scale", type=float, default=1.0, help="GB of Parquet (default 1)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    files = 8 if args.scale <= 1 else int(8 * args.scale)
    info = dataset(DATA, "parquet", int(1_000_000 * args.scale), files, 1000)
    seen = {budget: [] for budget in BUDGETS}
    for _ in range(args.rounds):
        for budget in BUDGETS:
            seen[budget].append(run(info, budget, args.scale))
    print(
        f"| --memory ({args.scale:g} GB Parquet) | budget | runs kept in memory (plan) | wall (median) | CPU s | "
        "peak RSS | within budget |"
    )
    print("|---|---|---|---|---|---|---|")
    for budget, got in seen.items():
        plan = make_plan(
            PipelineOptions(
                [
                    f"--input={info['pattern']}",
                    f"--output={OUT}/memory_budget/plan/s",
                    f"--memory={budget}",
                ]
            )
        )
        kept = min(plan.memory_for_runs, plan.held_bytes)
        peak = max(m.peak_rss for m in got)
        print(
            f"| {budget} | {plan.memory_budget / 1e9:.2f} GB | {kept / 1e9:.2f} of {plan.held_bytes / 1e9:.2f} GB | "
            f"{statistics.median(m.wall for m in got):.1f} s | {statistics.median(m.cpu for m in got):.1f} | "
            f"{peak / 1e9:.2f} GB | {'yes' if peak <= plan.memory_budget else 'NO'} |"
        )


if __name__ == "__main__":
    main()
