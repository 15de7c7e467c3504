"""A plan's run in both intermediate modes side by side, and what each costs on Dataflow: pass 1's
runs and parts (records per part), its units of work and the last wave's tail, pass 2's requests
per pile and how long a bucket's read ramp takes to serve them, the disk a worker needs for its
spill, and dollars per TB from a small price table and the rate measured locally at the mode's
records per part (``job_model.rate_per_vcpu``). Nothing here has run on Dataflow: it is ``plan``'s
model, priced.

Prices: us-central1 list prices as stored on 2026-11-25 (docs/scaling.md gives each source);
check them before a large run."""

import dataclasses
import math

from pileshuffle.engine.runs import SEGMENT_OVERHEAD
from pileshuffle.planning.gcs_requests import gcs_operations
from pileshuffle.planning.job_model import (
    DEFAULT_DISK_GB,
    choose_run_bytes,
    disk_to_ask,
    expected_workers,
    rate_per_vcpu,
    runs_on_object_store,
)
from pileshuffle.planning.parameters import PileshuffleOptions

__all__ = [
    "PRICES",
    "MODES",
    "STARTUP_HOURS",
    "SPILL_FACTOR",
    "START_READS",
    "RAMP_DOUBLING",
    "mode_plan",
    "mode_figures",
    "ramp_seconds",
]

GiB, TB = 1 << 30, 10**12
PRICES = {  # Beam 2.77's dataflow_cost_consts.py ("found at cloud.google.com/dataflow/pricing")
    "vcpu_hour": 0.056,  # a batch worker's vCPU
    "memory_gib_hour": 0.003557,  # a batch worker's memory, per GB (GiB) hour
    "disk_gb_month": 0.0394,  # Persistent Disk (pd-standard): $0.000054 per GB-hour, prorated
    "shuffle_gb": 0.011,  # Dataflow Shuffle, per GB processed, counted once
    # Cloud Storage (cloud.google.com/storage/pricing-examples), one region, Standard class
    "class_a": 0.005 / 1000,  # an upload, copy or list
    "class_b": 0.0004 / 1000,  # a read of an object or its metadata
    "storage_gb_month": 0.020,  # soft delete off on the temp bucket: runs billed while they live
}
HOURS_PER_MONTH = 730
STARTUP_HOURS = 4 / 60  # a worker's start before it takes work
SPILL_FACTOR = 1.07  # a spilled and merged run takes this much a held run's time (spill_cost.py)
# a bucket serves about 5,000 object reads a second at first and doubles that every 20 minutes
# (Cloud Storage's request rate guidelines)
START_READS, RAMP_DOUBLING = 5000, 20 * 60
MODES = ("files", "shuffle")


def mode_plan(plan, options, mode: str):
    """``plan`` as it would run in ``mode``: its run size chosen for that mode (``--run_bytes``
    as given, else ``job_model.choose_run_bytes``)."""
    if mode == plan.intermediate:
        return plan
    value = options.view_as(PileshuffleOptions).run_bytes
    on_store = runs_on_object_store(mode, plan.layout, plan.work_dir, plan.workers)
    run_bytes = choose_run_bytes(
        value, plan.num_piles, mode, on_store, plan.workers, plan.held_bytes, plan.input_bytes
    )
    return dataclasses.replace(plan, intermediate=mode, run_bytes=run_bytes, memory_for_runs=0)


def ramp_seconds(reads: float) -> float:
    """Seconds a bucket takes to serve ``reads`` GETs from ``START_READS`` a second, doubling
    every ``RAMP_DOUBLING`` seconds: the t where START_READS D / ln 2 (2^(t/D) - 1) = reads."""
    return RAMP_DOUBLING * math.log2(1 + reads * math.log(2) / (START_READS * RAMP_DOUBLING))


def mode_figures(plan, options, mode: str) -> dict:
    """What ``plan`` makes and needs in ``mode``: run size, runs, parts and records per part,
    units of pass-1 work per thread of the expected cluster and the tail share (one unit's time
    over the job's: what a unit started last, or straggling, adds), pass 2's GETs per pile and
    their ramp, spill per worker and the disk to ask for, Cloud Storage operations, bytes through
    the Shuffle service, and on Dataflow the dollars."""
    variant = mode_plan(plan, options, mode)
    runs, parts = variant.run_shape()
    class_a, class_b = gcs_operations(variant)["total"]
    workers = plan.workers
    slots = workers.threads * expected_workers(workers, plan.input_bytes)
    units = len(variant.source_groups)
    gets = parts if mode == "files" else 0
    dataflow = workers.where == "dataflow"
    shuffled = variant.held_bytes + parts * SEGMENT_OVERHEAD  # the records, keys, hashes, framing
    figures = {
        "run_bytes": variant.run_bytes,
        "runs": runs,
        "parts": parts,
        "records_per_part": variant.written_records / max(1, parts),
        "units": units,
        "units_per_thread": units / slots,
        "tail_share": min(1.0, slots / max(1, units)),
        "pass2_requests_per_pile": gets / plan.num_piles,
        "request_ramp_seconds": ramp_seconds(gets),
        "spilled_per_writer": variant.spilled_per_writer,
        "disk_per_worker": workers.threads * variant.spilled_per_writer,
        "disk_size_gb": disk_to_ask(variant) if dataflow else None,
        "gcs_operations": {"class_a": class_a, "class_b": class_b},
        "shuffled_bytes": shuffled if mode == "shuffle" else 0,
    }
    figures["dollars"] = _dollars(variant, figures) if dataflow else None
    total = sum(figures["dollars"].values()) if dataflow else None
    figures["dollars_per_tb"] = total / (plan.input_bytes / TB) if dataflow else None
    return figures


def _dollars(plan, figures: dict) -> dict:
    """The run's dollars on Dataflow: workers (vCPUs and memory for the input at
    ``rate_per_vcpu`` of its mode and records per part, ``SPILL_FACTOR`` slower when runs spill,
    and each worker's start), their disks (``disk_size_gb`` each), Cloud Storage operations, the
    Shuffle service's bytes, and files mode's runs stored for the job's time."""
    workers, kind = plan.workers, plan.workers.machine
    slower = SPILL_FACTOR if plan.spilled_per_writer else 1.0
    rate = rate_per_vcpu(plan.intermediate, figures["records_per_part"])
    vcpu_hours = plan.input_bytes / rate / 3600 * slower
    count = expected_workers(workers, plan.input_bytes)
    hours = vcpu_hours / (count * kind.vcpus) + STARTUP_HOURS
    months = count * hours / HOURS_PER_MONTH  # worker-months
    given = workers.disk_gb if workers.disk_given else DEFAULT_DISK_GB
    disk_gb = max(figures["disk_size_gb"], given)
    per_hour = kind.vcpus * PRICES["vcpu_hour"] + kind.memory / GiB * PRICES["memory_gib_hour"]
    operations = figures["gcs_operations"]
    stored = plan.held_bytes / 1e9 * hours / HOURS_PER_MONTH if plan.intermediate == "files" else 0
    return {
        "workers": count * hours * per_hour,
        "disks": months * disk_gb * PRICES["disk_gb_month"],
        "gcs_operations": (
            operations["class_a"] * PRICES["class_a"] + operations["class_b"] * PRICES["class_b"]
        ),
        "shuffle": figures["shuffled_bytes"] / 1e9 * PRICES["shuffle_gb"],
        "storage": stored * PRICES["storage_gb_month"],
    }
