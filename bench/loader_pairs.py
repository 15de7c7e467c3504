"""Two loader bench rows run in turn, A B A B ..., each in a fresh process, and the ratio of
their times taken pair by pair: for rows whose times swing run to run more than the gap
between them (the Parquet mixture against one output: page faults, see docs/performance.md).

    python bench/loader_pairs.py parquet-k1 parquet-k1-mix2 --pairs 16
    python bench/loader_pairs.py parquet-k1 parquet-k1-mix2 --pairs 16 --b-first
    python bench/loader_pairs.py parquet-k1 parquet-k1-mix2 --pairs 8 --touch-mb 0

Each run is ``loader.py``'s own measure (``loader_measure.measure_row``: its page cache warmed,
its RSS sampled). Prints every pair, then the median ratio of B's records/s to A's and its
range: below 1, B is slower (per record: a mixture row may deliver more records than A).
"""

import argparse
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from loader_data import plan_data  # noqa: E402
from loader_measure import add_touch_option, measure_row  # noqa: E402
from loader_rows import row_plan  # noqa: E402


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("a", help="a row name of loader.py --list (the yardstick)")
    parser.add_argument("b", help="another row name")
    parser.add_argument("--pairs", type=int, default=10)
    parser.add_argument("--b-first", action="store_true", help="run B before A in each pair")
    parser.add_argument("--scale", type=int, default=1)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--timeout", type=float, default=900)
    add_touch_option(parser)
    args = parser.parse_args(argv)
    plan = {row[0]: row for row in row_plan()}
    for name in (args.a, args.b):
        if name not in plan:
            parser.error(f"no row {name!r}: see python bench/loader.py --list")
    _, reads = plan_data([plan[args.a], plan[args.b]], args.scale, args.quick)
    rows = [(plan[name], reads[name]) for name in (args.a, args.b)]
    ratios = []
    for _ in range(args.pairs):
        times, speeds = {}, {}
        for (name, kind, mix, _), data in rows[::-1] if args.b_first else rows:
            result = measure_row(name, kind, mix, data, args.timeout, args.touch_mb)
            if not result.get("ok"):
                sys.exit(f"{name} failed: {result.get('error')}")
            times[name], speeds[name] = result["seconds"], result["records_per_s"]
        ratios.append(speeds[args.b] / speeds[args.a])
        print(
            f"{args.a} {times[args.a]:.2f} s  {args.b} {times[args.b]:.2f} s  ratio {ratios[-1]:.2f}",
            flush=True,
        )
    print(
        f"records/s of {args.b} / {args.a} over {len(ratios)} pairs: median {statistics.median(ratios):.2f}, "
        f"range {min(ratios):.2f}-{max(ratios):.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
