"""docs/scaling.md's files-mode cost table, from ``plan``'s own model: runs, parts and Cloud Storage
operations (``Plan.run_shape``, ``commands.plan.gcs_operations``: the counts tests/test_gcs_operations.py
checks against the emulator's requests) for 1, 10 and 100 TB of 1 KB TFRecords in 1 GB files,
``--max_pile_bytes 1GiB``, priced at the list prices docs/scaling.md cites.

    python bench/scaling_costs.py
    python bench/scaling_costs.py --spill_factor 1.07     # bench/spill_cost.py's spilled / held

Workers: ``--rate`` MB/s per vCPU (docs/scaling.md's planning rate), times ``--spill_factor`` for a
run that spills, on n2-highmem-4 (8 GB a vCPU); spill disks: pd-ssd sized for the spill's
throughput (each spilled byte written and read once: ``2 x rate`` per vCPU at 0.48 MB/s per GB).
Nothing here has run on Dataflow: it is arithmetic on measured local rates and counted requests.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from pileshuffle.commands.plan import gcs_operations  # noqa: E402
from pileshuffle.plan import Plan, _choose_num_piles  # noqa: E402
from pileshuffle.runs import run_bytes_for  # noqa: E402
from pileshuffle.sources import Source  # noqa: E402

GiB, TB = 1 << 30, 10 ** 12
RECORD_BYTES, STORED_BYTES = 1000, 1016  # a 1 KB record, and as TFRecord stores it (12 bytes of framing)
HELD_MEAN = 1004  # as Arrow holds it: the bytes and a 4-byte offset
CLASS_A, CLASS_B = 0.005 / 1000, 0.0004 / 1000
VCPU_HOUR, MEMORY_GB_HOUR, SSD_GB_HOUR = 0.056, 0.003557, 0.000298
SSD_MB_S_PER_GB = 0.48


def plan_for(terabytes: int, run_bytes) -> Plan:
    files = terabytes * 1000
    sources = [Source(i, f"gs://b/in/train-{i:06d}.tfrecord", 10 ** 9) for i in range(files)]
    total = files * 10 ** 9 * HELD_MEAN / STORED_BYTES
    piles = _choose_num_piles("auto", HELD_MEAN, total, GiB)[0]
    return Plan(format="tfrecord", sources=sources, output="gs://b/out/train", compression="none", num_piles=piles,
                num_piles_reason="auto", max_pile_bytes=GiB, seed=0, intermediate="files", work_dir="gs://b/tmp/w",
                replace_existing=False, skip_corrupt=False, input_bytes=files * 10 ** 9, mean_record_bytes=HELD_MEAN,
                estimated_bytes=int(total), run_bytes=run_bytes_for(run_bytes, piles, remote=True))


def row(terabytes: int, run_bytes, rate: float, spill_factor: float) -> dict:
    plan = plan_for(terabytes, run_bytes)
    runs, parts = plan.run_shape()
    class_a, class_b = gcs_operations(plan)["total"]
    spills = plan.spilled_per_writer > 0
    vcpu_hours = terabytes * TB / (rate * 1e6) / 3600 * (spill_factor if spills else 1.0)
    workers = vcpu_hours * (VCPU_HOUR + 8 * MEMORY_GB_HOUR)
    disk = vcpu_hours * (2 * rate / SSD_MB_S_PER_GB) * SSD_GB_HOUR if spills else 0.0
    operations = class_a * CLASS_A + class_b * CLASS_B
    return {"TB": terabytes, "piles": plan.num_piles, "run_bytes": plan.run_bytes, "spilled": plan.spilled_per_writer,
            "runs": runs, "parts": parts, "part": plan.held_bytes / parts, "class_a": class_a, "class_b": class_b,
            "operations": operations / terabytes, "workers": workers / terabytes, "disk": disk / terabytes,
            "total": (operations + workers + disk) / terabytes}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=50.0, help="MB/s per vCPU (default 50)")
    parser.add_argument("--spill_factor", type=float, default=1.07, help="a spilling run's time over a held one's")
    args = parser.parse_args(argv)
    print("| --run_bytes | TB | piles | run | spilled per writer | runs | parts | part | class A / B | "
          "operations $/TB | workers $/TB | spill disks $/TB | total $/TB |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for run_bytes in ("auto", 4 * GiB):
        for terabytes in (1, 10, 100):
            r = row(terabytes, run_bytes, args.rate, args.spill_factor)
            print(f"| {run_bytes if run_bytes == 'auto' else '4GiB'} | {terabytes} | {r['piles']:,} | "
                  f"{r['run_bytes'] / GiB:.2f} GiB | {r['spilled'] / GiB:.1f} GiB | {r['runs']:,} | {r['parts']:,} | "
                  f"{r['part'] / 1e3:,.0f} kB | {r['class_a']:,} / {r['class_b']:,} | {r['operations']:.2f} | "
                  f"{r['workers']:.2f} | {r['disk']:.2f} | **{r['total']:.2f}** |")


if __name__ == "__main__":
    main()
