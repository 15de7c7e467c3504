"""What spilling a run to local disk and merging it costs (``pileshuffle.engine.runs``), against the same
run held in memory: the same groups, runs and parts, only where the run waits differs.

    python bench/spill_cost.py                 # 1 GB of Parquet, 4,096 piles, 3 rounds
    python bench/spill_cost.py --rounds 5 --piles 1024

Files mode on an object store spills runs beyond 1 GiB (``--run_bytes auto`` there gives each pile
256 KiB). Locally 1 GB makes units of 62 MB, so the spilled row holds 16 MiB (``MAX_HELD_BYTES``)
and spills each unit about 4 times before its merge: every record is written and read once more
on local disk, the cost a 100 TB job's writers pay. Both rows run in fresh processes, interleaved;
medians of wall time and CPU, the largest peak RSS of the process tree, and spilled / held.
"""

import argparse
import os
import statistics
import sys

from datagen import dataset
from measure import measure_run
from workspace import DATA, OUT

HOLDS = {"held": None, "spilled": 16 << 20}
RUN = (
    "import sys; from pileshuffle.engine import runs; hold = sys.argv.pop(1); "
    "runs.MAX_HELD_BYTES = int(hold) if hold != 'None' else runs.MAX_HELD_BYTES; "
    "from pileshuffle.cli import entry; entry()"
)


def run(info, name, hold, piles):
    out = os.path.join(OUT, "spill_cost", name)
    cmd = [
        sys.executable,
        "-c",
        RUN,
        str(hold),
        "run",
        "--input",
        info["pattern"],
        "--output",
        os.path.join(out, "s"),
        "--num_piles",
        str(piles),
        "--run_bytes",
        "1GiB",
        "--seed",
        "1",
        "--quiet",
    ]
    return measure_run(cmd, f"spill_cost-{name}", out, info["files"])


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--scale", type=float, default=1.0, help="GB of Parquet (default 1)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--piles", type=int, default=4096)
    args = parser.parse_args(argv)
    info = dataset(DATA, "parquet", int(1_000_000 * args.scale), 8, 1000)
    seen = {name: [] for name in HOLDS}
    for _ in range(args.rounds):
        for name, hold in HOLDS.items():
            seen[name].append(run(info, name, hold, args.piles))
    wall = {name: statistics.median(m.wall for m in got) for name, got in seen.items()}
    print(
        f"| {args.piles:,} piles, 1 GB Parquet x {args.scale:g} | wall (median) | CPU s | peak RSS | / held |"
    )
    print("|---|---|---|---|---|")
    for name, got in seen.items():
        cpu = statistics.median(m.cpu for m in got)
        peak = max(m.peak_rss for m in got) / 1e9
        print(
            f"| {name} | {wall[name]:.1f} s | {cpu:.1f} | {peak:.2f} GB | {wall[name] / wall['held']:.2f}x |"
        )


if __name__ == "__main__":
    main()
