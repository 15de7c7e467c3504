"""pileshuffle benchmark: one run, one table (see bench/README.md).

    .venv/bin/python bench/run.py                 # scale 1: ~1 GB per format, all rows
    .venv/bin/python bench/run.py --scale 10      # 10 GB TFRecord: cat, floor, pileshuffle (+ the 1 GB pileshuffle row)
    .venv/bin/python bench/run.py --quick         # 1/50 of the sizes: a smoke run
    .venv/bin/python bench/run.py --only floor-tfrecord,pileshuffle-tfrecord
    .venv/bin/python bench/run.py --list          # row names

Every row runs as its own process tree; wall time is measured around it, peak RSS is
the largest sum of RSS over the process and all its descendants, sampled every 50 ms.
Data sets are cached under bench/.data/, outputs, logs and results go to bench/.out/.
"""

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from machine import machine, machine_lines  # noqa: E402
from shuffle_report import print_report, report_markdown, table_rows, write_results  # noqa: E402
from shuffle_rows import PEER_KINDS, QUICK_DIVISOR, SEED, prepare_datasets, row_plan, selected  # noqa: E402
from shuffle_runs import add_floor_ratios, fastest_runs, run_rounds  # noqa: E402
from shuffle_targets import evaluate_targets  # noqa: E402
from workspace import OUT, PEERS_PY  # noqa: E402


def argument_parser():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--scale",
        type=int,
        default=1,
        help="1 (all formats, ~1 GB each) or N>1 (N GB TFRecord rows only)",
    )
    parser.add_argument(
        "--quick", action="store_true", help=f"1/{QUICK_DIVISOR} of the data sizes (smoke run)"
    )
    parser.add_argument(
        "--only",
        default="",
        help="comma-separated row names, prefixes (pileshuffle, floor) or globs",
    )
    parser.add_argument("--list", action="store_true", help="list the rows and exit")
    parser.add_argument(
        "--keep", action="store_true", help="keep each row's output under bench/.out/NAME"
    )
    parser.add_argument(
        "--timeout", type=float, default=3600, help="seconds before a row is killed"
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=None,
        help="rounds: every row runs once per round, rounds one after another, and each row reports its "
        "fastest run and its median (default 3 at scale 1, else 1)",
    )
    parser.add_argument(
        "--idle_wait",
        type=float,
        default=120,
        help="before each row, wait up to this many seconds for other processes to go quiet (0: don't)",
    )
    return parser


def main(argv=None):
    parser = argument_parser()
    args = parser.parse_args(argv)
    if args.scale < 1:
        parser.error("--scale must be >= 1")
    if args.repeat is None:
        args.repeat = 3 if args.scale == 1 else 1
    only = [p.strip() for p in args.only.split(",") if p.strip()]
    plan = [p for p in row_plan(args.scale) if selected(p[0], only)]
    if args.list:
        print("\n".join(p[0] for p in row_plan(args.scale)))
        return 0
    if not plan:
        parser.error(f"--only {args.only} selects no row (see --list)")
    if any(p[1] in PEER_KINDS for p in plan) and not os.path.exists(PEERS_PY):
        parser.error(
            f"the peers' rows run under {PEERS_PY}: `make peers` creates it (or leave them out with --only)"
        )

    os.makedirs(OUT, exist_ok=True)
    m = machine()
    title = f"pileshuffle bench: scale {args.scale}{' (quick: 1/%d size)' % QUICK_DIVISOR if args.quick else ''}, seed {SEED}"
    print(title)
    print("\n".join(machine_lines(m)), flush=True)

    datasets, piles = prepare_datasets(plan, args.scale, args.quick)
    attempts = run_rounds(
        plan, datasets, piles, args.repeat, args.timeout, args.keep, args.idle_wait
    )
    rows = fastest_runs(plan, attempts)
    add_floor_ratios(rows, args.repeat)
    evaluate_targets(rows, args.scale)
    m["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]

    header, body = table_rows(rows)
    print_report(header, body, m, args.quick)
    given = list(sys.argv[1:] if argv is None else argv)
    command = "python bench/run.py " + " ".join(given) if given else "make bench"
    label = f"scale{args.scale}{'-quick' if args.quick else ''}{'-only' if only else ''}"
    results = {
        "title": title,
        "command": command,
        "scale": args.scale,
        "quick": args.quick,
        "seed": SEED,
        "machine": m,
        "datasets": list(datasets.values()),
        "rows": rows,
    }
    write_results(report_markdown(title, m, command, header, body), results, label)
    failed = [r["name"] for r in rows if r["returncode"] != 0 or r["check_ok"] is False]
    if failed:
        print(f"rows that failed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
