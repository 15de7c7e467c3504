"""docs/scaling.md's tables, generated from ``plan``'s own model: what ``pileshuffle plan --input
SAMPLE --input_bytes N --runner DataflowRunner --json`` says (``plan.make_plan`` with ``input_bytes``,
``commands.plan.plan_json``: ``job_model``, ``job_costs``) for a sample of 1 KB TFRecords made here
(seeded), planned as 1, 10 and 100 TB in files of 1 GB with default options, in both intermediate
modes; the cheapest 100 TB configuration of a few machine types beside CloudSort's; and the price
table the dollars come from. No job runs: it is arithmetic on counted requests and a planning rate.

    python bench/scaling_costs.py            # print the tables
    python bench/scaling_costs.py --write    # rewrite them between their markers in docs/scaling.md
    python bench/scaling_costs.py --check    # exit 1 if docs/scaling.md's tables differ (tests/test_scaling_doc.py)
"""

import argparse
import os
import re
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from apache_beam.options.pipeline_options import PipelineOptions  # noqa: E402

from pileshuffle.commands import sample  # noqa: E402
from pileshuffle.commands.plan import plan_json  # noqa: E402
from pileshuffle.commands.plan_modes import hours_text, size_text  # noqa: E402
from pileshuffle.planning.job_costs import (
    PRICES,
    RAMP_DOUBLING,
    SPILL_FACTOR,
    START_READS,
    STARTUP_HOURS,
)  # noqa: E402
from pileshuffle.planning.job_model import (
    DEFAULT_DISK_GB,
    DISK_RESERVE_GB,
    MEASURED_CPU_PER_GB,  # noqa: E402
    SIZING_RATE,
    TARGET_HOURS,
    WORKER_OVERHEAD,
    rate_per_vcpu,
)
from pileshuffle.planning.plan import make_plan  # noqa: E402
from pileshuffle.planning.runners import DOCUMENTED_WORKER  # noqa: E402

DOC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs", "scaling.md")
GiB, TB = 1 << 30, 10**12
SIZES = (1, 10, 100)  # TB
CLOUDSORT = 0.97  # $ per TB: Exoshuffle-CloudSort on Ray, 100 TB for $97 (2022)
# one price per vCPU
MACHINES = (
    "n2-standard-4",
    "n2-standard-8",
    "n2-highmem-4",
    "n2-highmem-8",
    "n2-highmem-16",
)
RUNS = ("auto", "32GiB")
BEGIN = re.compile(r"^<!-- generated: (?P<name>[\w-]+) \(bench/scaling_costs\.py\) -->$")


def planned(records: str, terabytes: int, *args) -> dict:
    """``plan --json`` of ``records`` as ``terabytes`` TB on Dataflow with ``args``."""
    argv = [
        f"--input={records}",
        f"--output={os.path.dirname(records)}/out/train",
        "--runner=DataflowRunner",
        "--temp_location=gs://bucket/tmp",
        *args,
    ]
    options = PipelineOptions(argv)
    return plan_json(make_plan(options, terabytes * TB), options)


def _money(value: float) -> str:
    return f"${value:,.2f}"


def _row(label: str, cells) -> str:
    return f"| {label} | " + " | ".join(cells) + " |"


def mode_table(plans: dict, mode: str) -> list:
    """One mode at 1, 10 and 100 TB with default options: the plan's figures, then its dollars per TB."""
    head = [
        _row(f"`--intermediate={mode}`", [f"{t} TB" for t in SIZES]),
        "|---|" + "---|" * len(SIZES),
    ]
    modes = {t: plans[t]["modes"][mode] for t in SIZES}
    per_tb = {t: {k: v / t for k, v in modes[t]["dollars"].items()} for t in SIZES}
    rows = [
        ("piles = shards (`auto`)", lambda t: f"{plans[t]['num_piles']:,}"),
        ("`--max_pile_bytes auto`", lambda t: f"{plans[t]['max_pile_bytes'] / 2**20:,.0f} MiB"),
        (
            "`--run_bytes auto`; spilled per writer",
            lambda t: (
                f"{size_text(modes[t]['run_bytes'])}; "
                f"{size_text(modes[t]['spilled_per_writer']) if modes[t]['spilled_per_writer'] else 'none'}"
            ),
        ),
        ("runs / parts", lambda t: f"{modes[t]['runs']:,} / {modes[t]['parts']:,}"),
        ("records per part", lambda t: f"{modes[t]['records_per_part']:,.0f}"),
        (
            "rate per vCPU at these parts",
            lambda t: f"{rate_per_vcpu(mode, modes[t]['records_per_part']) / 1e6:,.0f} MB/s",
        ),
        (
            "units of pass 1 per thread (tail share)",
            lambda t: f"{modes[t]['units_per_thread']:,.1f} ({modes[t]['tail_share']:.0%})",
        ),
        ("workers, about an hour", lambda t: f"{plans[t]['workers']['expected_workers']:,}"),
        (
            "pass-2 GETs per pile; the bucket's ramp to serve them",
            lambda t: (
                f"{modes[t]['pass2_requests_per_pile']:,.0f}; {hours_text(modes[t]['request_ramp_seconds'])}"
                if modes[t]["pass2_requests_per_pile"]
                else "none"
            ),
        ),
        (
            "spill per worker; `--disk_size_gb` to give",
            lambda t: f"{size_text(modes[t]['disk_per_worker'])}; {modes[t]['disk_size_gb']}",
        ),
        (
            "Cloud Storage class A / B",
            lambda t: (
                f"{modes[t]['gcs_operations']['class_a']:,} / "
                f"{modes[t]['gcs_operations']['class_b']:,}"
            ),
        ),
        (
            "through the Shuffle service",
            lambda t: (
                size_text(modes[t]["shuffled_bytes"]) if modes[t]["shuffled_bytes"] else "none"
            ),
        ),
    ]
    rows += [
        (f"{name.replace('_', ' ')}, per TB", lambda t, name=name: _money(per_tb[t][name]))
        for name in ("workers", "disks", "gcs_operations", "shuffle", "storage")
    ]
    rows.append(("**total per TB**", lambda t: f"**{_money(modes[t]['dollars_per_tb'])}**"))
    return head + [_row(label, [cell(t) for t in SIZES]) for label, cell in rows]


def cheapest_table(records: str) -> list:
    """Files mode at 100 TB on a few machine types and run sizes, cheapest first, beside CloudSort."""
    found = []
    for machine in MACHINES:
        for run in RUNS:
            plan = planned(records, 100, f"--worker_machine_type={machine}", f"--run_bytes={run}")
            files = plan["modes"]["files"]
            found.append((files["dollars_per_tb"], machine, run, plan, files))
    found.sort(key=lambda one: one[0])
    lines = [
        _row(
            "100 TB, `--intermediate=files`",
            [
                "piles",
                "parts (records each)",
                "`--disk_size_gb`",
                "GETs per TB",
                "total per TB",
                "× CloudSort",
            ],
        ),
        "|---|" + "---|" * 6,
    ]
    for dollars, machine, run, plan, files in found[:4]:
        lines.append(
            _row(
                f"`{machine}`, `--run_bytes {run}`",
                [
                    f"{plan['num_piles']:,}",
                    f"{files['parts']:,} ({files['records_per_part']:,.0f})",
                    f"{files['disk_size_gb']}",
                    _money(files["dollars"]["gcs_operations"] / 100),
                    f"**{_money(dollars)}**",
                    f"{dollars / CLOUDSORT:.1f}×",
                ],
            )
        )
    lines.append(
        _row(
            "CloudSort 2022 (Exoshuffle on Ray, 40 `i4i.4xlarge`)",
            ["—", "—", "—", "—", f"**{_money(CLOUDSORT)}**", "1.0×"],
        )
    )
    return lines


def prices_table() -> list:
    """The constants the dollars come from (``job_costs.PRICES``, ``job_model``)."""
    rows = [
        ("batch worker vCPU", f"${PRICES['vcpu_hour']} per vCPU-hour"),
        ("batch worker memory", f"${PRICES['memory_gib_hour']} per GB-hour"),
        (
            "worker disk (pd-standard)",
            f"${PRICES['disk_gb_month']} per GB-month, prorated by the hour",
        ),
        ("Dataflow Shuffle", f"${PRICES['shuffle_gb']} per GB processed (counted once)"),
        (
            "Cloud Storage class A / class B",
            f"${PRICES['class_a'] * 1000:g} / ${PRICES['class_b'] * 1000:g} per 1,000 operations",
        ),
        (
            "Cloud Storage Standard",
            f"${PRICES['storage_gb_month']} per GB-month (soft delete off on the temp bucket)",
        ),
        (
            "rate per vCPU",
            f"the local rate at the mode's records per part (below) ÷ {WORKER_OVERHEAD:g} "
            f"(× {SPILL_FACTOR} time when runs spill), {STARTUP_HOURS * 60:,.0f} minutes of start "
            f"per worker",
        ),
        (
            "cluster",
            f"`{DOCUMENTED_WORKER}` workers for about {TARGET_HOURS:g} hour at "
            f"{SIZING_RATE / 1e6:,.0f} MB/s per vCPU, one thread per vCPU; "
            f"{DEFAULT_DISK_GB} GB disks unless more is needed, {DISK_RESERVE_GB} GB of each for the system",
        ),
        (
            "bucket read ramp",
            f"{START_READS:,} reads/s at first, doubling every {RAMP_DOUBLING // 60} minutes",
        ),
    ]
    return [_row("item", ["value"]), "|---|---|"] + [_row(name, [value]) for name, value in rows]


def rates_table() -> list:
    """``job_model.MEASURED_CPU_PER_GB`` (bench/regime_rates.py) and the rate per vCPU it gives."""
    lines = [
        _row(
            "records per part",
            [f"{mode}: local CPU-s per GB; MB/s per Dataflow vCPU" for mode in MEASURED_CPU_PER_GB],
        ),
        "|---|---|---|",
    ]
    for n, (rpp, _) in enumerate(MEASURED_CPU_PER_GB["files"]):
        lines.append(
            _row(
                f"{rpp:,}",
                [
                    f"{points[n][1]:g}; {rate_per_vcpu(mode, rpp) / 1e6:,.0f}"
                    for mode, points in MEASURED_CPU_PER_GB.items()
                ],
            )
        )
    return lines


def tables() -> dict:
    """Every generated table of docs/scaling.md by name, as markdown lines."""
    with tempfile.TemporaryDirectory() as folder:
        sample.write_tfrecord(
            os.path.join(folder, "sample"), records=600, files=2, record_bytes=1000, seed=1
        )
        records = os.path.join(folder, "sample", "*.tfrecord")
        plans = {t: planned(records, t) for t in SIZES}
        found = {
            "files": mode_table(plans, "files"),
            "shuffle": mode_table(plans, "shuffle"),
            "cheapest": cheapest_table(records),
            "prices": prices_table(),
            "rates": rates_table(),
        }
    return {name: "\n".join(lines) for name, lines in found.items()}


def rewritten(text: str, generated: dict) -> str:
    """``text`` with each block after a ``BEGIN`` marker, up to its closing marker, replaced."""
    out, lines, skipping = [], text.splitlines(), None
    for line in lines:
        if skipping:
            if line == f"<!-- end: {skipping} -->":
                out += [generated[skipping], line]
                skipping = None
            continue
        out.append(line)
        found = BEGIN.match(line)
        if found:
            skipping = found.group("name")
    if skipping:
        raise SystemExit(f"docs/scaling.md: no <!-- end: {skipping} --> after its table")
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--write", action="store_true", help="rewrite the tables in docs/scaling.md"
    )
    parser.add_argument(
        "--check", action="store_true", help="exit 1 if docs/scaling.md's tables differ"
    )
    args = parser.parse_args(argv)
    generated = tables()
    with open(DOC) as handle:
        text = handle.read()
    new = rewritten(text, generated)
    if args.write:
        with open(DOC, "w") as handle:
            handle.write(new)
    elif args.check:
        if new != text:
            print(
                "docs/scaling.md's generated tables differ from what bench/scaling_costs.py prints: "
                "run `python bench/scaling_costs.py --write`",
                file=sys.stderr,
            )
            return 1
    else:
        for name, table in generated.items():
            print(f"{name}:\n{table}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
