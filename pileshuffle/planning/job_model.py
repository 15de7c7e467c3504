"""The workers a plan sizes a run for, and what follows from them: a Dataflow machine type (its
vCPUs, memory, SDK processes and threads, disk) or this machine (its threads and ``--memory``
budget); the pile one thread holds (``--max_pile_bytes auto``); the run a pass-1 writer gathers
(``--run_bytes auto``: parts large enough, units of work small enough for the cluster); the cluster
a job is expected to run on; and the one-line refusal of a Dataflow launch whose workers' disks
cannot hold their spill. Arithmetic on Beam's options and this machine's memory: no request."""

import dataclasses
import math
import re

from apache_beam.options.pipeline_options import DebugOptions, WorkerOptions

from pileshuffle.engine.runner import is_dataflow, runner_name
from pileshuffle.engine.runs import run_bytes_for
from pileshuffle.errors import UsageError
from pileshuffle.io import storage
from pileshuffle.io.memory_limit import available_memory
from pileshuffle.planning.parameters import parse_bytes
from pileshuffle.planning.runners import DOCUMENTED_WORKER, in_process_threads

__all__ = [
    "PILE_MEMORY_FACTOR",
    "LOCAL_BASE_BYTES",
    "AUTO_MEMORY_SHARE",
    "SDK_PROCESS_BYTES",
    "DOCUMENTED_WORKER",
    "DEFAULT_DISK_GB",
    "DISK_RESERVE_GB",
    "MEASURED_CPU_PER_GB",
    "WORKER_OVERHEAD",
    "SIZING_RATE",
    "rate_per_vcpu",
    "TARGET_HOURS",
    "Machine",
    "machine",
    "Workers",
    "workers_of",
    "local_budget",
    "auto_max_pile_bytes",
    "workers_pile_bound",
    "choose_run_bytes",
    "expected_workers",
    "runs_on_object_store",
    "check_worker_disk",
    "disk_to_ask",
]

GiB = 1 << 30
# a pile is held 2-3 times while it is ordered and written (docs/dataflow.md)
PILE_MEMORY_FACTOR = 3
# a local run beside its passes (1 GB run: 0.96-1.0 GB, passes 0.4) + 122 MiB of numba
LOCAL_BASE_BYTES = 725_000_000
# --memory auto: this share of the memory available (the rest: the page cache, other work)
AUTO_MEMORY_SHARE = 0.6
# per SDK process on a Dataflow worker: Python, Beam, Arrow (docs/dataflow.md)
SDK_PROCESS_BYTES = 1_000_000_000
# a Dataflow worker's OS and own processes: "typically no larger than 1 GB" (Dataflow's OOM guide)
WORKER_BASE_BYTES = GiB
DEFAULT_DISK_GB = 25  # Dataflow's boot disk of a batch worker (Runner v2, its Shuffle service)
# of a worker's disk: the OS, the SDK container image, logs (an estimate, not measured)
DISK_RESERVE_GB = 10
MIN_AUTO_PILE, MAX_AUTO_PILE = 64 << 20, GiB  # --max_pile_bytes auto: within these (shards ~1 GB)
PILES_PER_THREAD = 8  # auto: at least this many piles per pass-2 thread, so that each has piles
UNITS_PER_SLOT = 4  # --run_bytes auto: at least this many pass-1 units per thread of the cluster
# CPU seconds (user + system) per GB of input of a whole local run, both passes, by intermediate
# mode and records per part (the regime: a 10-100 TB job runs at 10-240): bench/regime_rates.py,
# 2026-12-06, medians of 3 interleaved rounds, 508 MB of 1 KB TFRecords in 260 or 130 piles,
# --memory 1GiB, 2 shared cores (docs/scaling.md "Rates at the job's regime")
MEASURED_CPU_PER_GB = {
    "files": ((10, 37.8), (60, 12.0), (240, 9.0)),
    "shuffle": ((10, 43.8), (60, 18.3), (240, 17.6)),
}
# A Dataflow worker's CPU per local CPU: it also reads the input from and writes runs and shards to
# Cloud Storage (TLS and HTTP in Python), moves shuffle-mode elements through the SDK harness's
# gRPC data plane, and runs the harness itself. Not measured (nothing here ran on Dataflow): the
# factor the former single planning rate carried (half the local rate).
WORKER_OVERHEAD = 2.0
TARGET_HOURS = 1.0  # a cluster not given runs the job in about this long (docs/scaling.md)
_UNIT_SPARE = 0.95  # a unit of pass-1 work fills this much of a run (the held size is an estimate)

# Compute Engine's predefined machine types: GiB of memory per vCPU by family and kind, and the
# vCPU counts of each family
_GIB_PER_VCPU = {"n1-standard": 3.75, "n1-highmem": 6.5, "n1-highcpu": 0.9, "c2-standard": 4.0}
_GIB_PER_VCPU.update(
    {
        f"{family}-{kind}": per
        for family in ("n2", "n2d", "e2")
        for kind, per in (("standard", 4.0), ("highmem", 8.0), ("highcpu", 1.0))
    }
)
_VCPUS = {
    "n1": (1, 2, 4, 8, 16, 32, 64, 96),
    "n2": (2, 4, 8, 16, 32, 48, 64, 80, 96, 128),
    "n2d": (2, 4, 8, 16, 32, 48, 64, 80, 96, 128, 224),
    "e2": (2, 4, 8, 16, 32),
    "c2": (4, 8, 16, 30, 60),
}
_CUSTOM = re.compile(r"^(?:[a-z0-9]+-)?custom-(\d+)-(\d+)(?:-ext)?$")  # [family-]custom-VCPUS-MIB


@dataclasses.dataclass(frozen=True)
class Machine:
    """A Compute Engine machine type: its vCPUs and memory (bytes)."""

    name: str
    vcpus: int
    memory: int


def machine(name: str) -> Machine:
    """Machine type ``name``: a predefined n1, n2, n2d, e2 or c2 standard, highmem or highcpu type,
    or a custom one (``[family-]custom-VCPUS-MIB``); another ``FAMILY-KIND-VCPUS`` has memory 0
    (not known); ``UsageError`` for a name of no vCPUs."""
    custom = _CUSTOM.match(name)
    if custom:
        return Machine(name, int(custom.group(1)), int(custom.group(2)) << 20)
    family, _, size = name.rpartition("-")
    if not size.isdigit() or int(size) < 1:
        raise UsageError(
            f"--worker_machine_type {name}: not a machine type (FAMILY-KIND-VCPUS, "
            "such as n2-highmem-4)"
        )
    known = family in _GIB_PER_VCPU and int(size) in _VCPUS[family.split("-")[0]]
    return Machine(name, int(size), int(_GIB_PER_VCPU[family] * int(size) * GiB) if known else 0)


@dataclasses.dataclass(frozen=True)
class Workers:
    """Where a run's passes run: ``threads`` pass-2 threads per worker (each holds one pile being
    written, or one pass-1 writer's run), each with ``memory_per_thread`` bytes (0: not known);
    on Dataflow the worker's ``machine``, its disk in GB and the workers asked for (0: none)."""

    where: str  # "dataflow", "local" or "other" (a runner whose workers a plan cannot see)
    threads: int
    memory_per_thread: int
    memory_note: str  # where memory_per_thread comes from
    machine: Machine = None
    processes: int = 1  # SDK processes per worker
    disk_gb: int = 0
    disk_given: bool = False
    workers: int = 0

    @property
    def spill_room(self) -> int:
        """Bytes one thread may spill to a Dataflow worker's disk beside ``DISK_RESERVE_GB``
        (0 elsewhere)."""
        if self.where != "dataflow":
            return 0
        return max(0, (self.disk_gb - DISK_RESERVE_GB) * GiB // self.threads)

    def describe(self) -> str:
        if self.where != "dataflow":
            return self.memory_note
        kind = self.machine
        return (
            f"{kind.name} ({kind.vcpus} vCPUs, {kind.memory / GiB:,.2f} GiB of memory): "
            f"{self.threads} thread(s) in {self.processes} SDK process(es), "
            f"{self.memory_note}; "
            f"{self.disk_gb} GB disk{'' if self.disk_given else ' (the default)'}"
        )


def local_budget(memory) -> tuple:
    """``(bytes, memory_limit.Memory or None)`` of ``--memory``: given, or ``AUTO_MEMORY_SHARE`` of
    what this process may take (a container's cgroup limit where there is one) and that figure."""
    if str(memory) != "auto":
        return parse_bytes(memory), None
    found = available_memory()
    return int(AUTO_MEMORY_SHARE * (found.available or 0)), found


def workers_of(options, budget: int = 0) -> Workers:
    """The workers of a run with ``options``: Dataflow's (``--worker_machine_type``, else
    ``DOCUMENTED_WORKER``), this machine's threads sharing ``budget`` (``--memory``) less
    ``LOCAL_BASE_BYTES``, or another runner's (not known)."""
    if is_dataflow(options):
        return _dataflow_workers(options)
    threads = in_process_threads(options)
    if threads:
        per = max(0, (budget - LOCAL_BASE_BYTES) // threads)
        note = (
            f"{threads} thread(s) sharing --memory {budget / 1e9:,.1f} GB less "
            f"{LOCAL_BASE_BYTES / 1e9:,.2f} GB: {per / 1e9:,.2f} GB each"
        )
        return Workers("local", threads, per, note)
    return Workers("other", 1, 0, f"the workers of {runner_name(options)}, which plan cannot see")


def _dataflow_workers(options) -> Workers:
    """A Dataflow worker: one SDK process per vCPU (Beam's use_multiple_sdk_containers; one with
    no_use_multiple_sdk_containers), each running ``number_of_worker_harness_threads`` bundles at
    once, counted per process (the larger reading; a batch job's default is a thread per vCPU: the
    Dataflow API's numThreadsPerWorker "according to the number of cores ... for batch"). Each
    thread holds the worker's memory less ``WORKER_BASE_BYTES`` and ``SDK_PROCESS_BYTES`` a
    process."""
    worker, debug = options.view_as(WorkerOptions), options.view_as(DebugOptions)
    kind = machine(worker.machine_type or DOCUMENTED_WORKER)
    single = "no_use_multiple_sdk_containers" in (debug.experiments or ())
    processes = 1 if single else kind.vcpus
    per_process = debug.number_of_worker_harness_threads or (kind.vcpus if single else 1)
    threads = processes * per_process
    per = max(0, (kind.memory - WORKER_BASE_BYTES - processes * SDK_PROCESS_BYTES) // threads)
    note = (
        f"{per / 1e9:,.2f} GB each (less 1 GiB for the worker and 1 GB an SDK process)"
        if kind.memory
        else "memory not known"
    )
    disk = worker.disk_size_gb or DEFAULT_DISK_GB
    asked = worker.max_num_workers or worker.num_workers or 0
    given = bool(worker.disk_size_gb)
    return Workers("dataflow", threads, per, note, kind, processes, disk, given, asked)


def auto_max_pile_bytes(workers: Workers, held_bytes: float, spread: bool = True) -> tuple:
    """``(bytes, why)`` of ``--max_pile_bytes auto``: a ``PILE_MEMORY_FACTOR``-th of what one
    thread holds (down to a power of two), no more than a share of ``PILES_PER_THREAD`` piles per
    thread (with ``spread``: the piles are chosen from it), within ``MIN_AUTO_PILE`` and
    ``MAX_AUTO_PILE``. A runner whose workers plan cannot see gets ``MIN_AUTO_PILE`` (64 MiB, the
    default before auto)."""
    if workers.where == "dataflow" and not workers.machine.memory:
        raise UsageError(
            "--max_pile_bytes auto: pileshuffle knows the memory of n1, n2, n2d, "
            "e2 and c2 standard, highmem and highcpu and custom-VCPUS-MIB machine "
            f"types, not --worker_machine_type {workers.machine.name}: give "
            "--max_pile_bytes (a third of what one worker thread holds)"
        )
    if not workers.memory_per_thread and workers.where != "local":
        why = f"auto: 64 MiB, as {workers.memory_note}: give --max_pile_bytes for them"
        return MIN_AUTO_PILE, why
    by_memory = _power_of_two(workers.memory_per_thread / PILE_MEMORY_FACTOR)
    threads = workers.threads * max(1, workers.workers)
    by_spread = held_bytes / (PILES_PER_THREAD * threads) if spread else by_memory
    pile = int(min(MAX_AUTO_PILE, max(MIN_AUTO_PILE, min(by_memory, by_spread))))
    if pile in (MIN_AUTO_PILE, MAX_AUTO_PILE):
        return pile, f"auto: at {'least' if pile == MIN_AUTO_PILE else 'most'} {pile >> 20:,} MiB"
    if by_spread < by_memory:
        return pile, f"auto: {PILES_PER_THREAD} piles or more for each of {threads} threads"
    held = f"{workers.memory_per_thread / 1e9:,.2f} GB"
    return pile, f"auto: a third of the {held} one thread holds, down to a power of two"


def workers_pile_bound(options):
    """``--max_pile_bytes auto`` for the workers ``options`` name (locally this machine's
    ``--memory auto``, a container's limit included; on Dataflow the machine type's), from memory
    alone (no spread over piles); None where plan cannot see their memory (another runner, a
    machine type it does not know)."""
    budget = local_budget("auto")[0] if in_process_threads(options) else 0
    workers = workers_of(options, budget)
    if workers.where == "other" or (workers.where == "dataflow" and not workers.machine.memory):
        return None
    return auto_max_pile_bytes(workers, 0, spread=False)[0]


def _power_of_two(size: float) -> int:
    """The largest power of two no larger than ``size`` (at least 1): piles sized from memory that
    moves a little between two runs (``--memory auto``) keep their size, count and bytes."""
    return 1 << max(0, int(size).bit_length() - 1)


def rate_per_vcpu(mode: str, records_per_part: float) -> float:
    """Input bytes a Dataflow vCPU shuffles a second in ``mode`` at ``records_per_part``: 1 GB
    over ``MEASURED_CPU_PER_GB`` interpolated on log(records per part) (the nearest measured
    regime outside 10-240) times ``WORKER_OVERHEAD``."""
    points = MEASURED_CPU_PER_GB[mode]
    at = math.log(min(max(records_per_part, points[0][0]), points[-1][0]))
    for (low, low_cpu), (high, high_cpu) in zip(points, points[1:]):
        if at <= math.log(high):
            share = (at - math.log(low)) / (math.log(high) - math.log(low))
            cpu = low_cpu + share * (high_cpu - low_cpu)
            return 1e9 / (cpu * WORKER_OVERHEAD)
    raise AssertionError("unreachable: records per part clamped to the measured range")


# the cluster is sized before a mode's parts are known: at files mode's rate at 240 records per
# part (--run_bytes auto's regime on gs://), the fastest measured
SIZING_RATE = rate_per_vcpu("files", 240)


def expected_workers(workers: Workers, input_bytes: float) -> int:
    """The workers a job runs on: ``--max_num_workers`` (or ``--num_workers``), else on Dataflow
    the ones that read the input in about ``TARGET_HOURS`` at ``SIZING_RATE``; one elsewhere."""
    if workers.where != "dataflow":
        return 1
    if workers.workers:
        return workers.workers
    vcpu_hours = input_bytes / SIZING_RATE / 3600
    return max(1, math.ceil(vcpu_hours / TARGET_HOURS / workers.machine.vcpus))


def choose_run_bytes(
    value,
    num_piles: int,
    intermediate: str,
    on_object_store: bool,
    workers: Workers,
    held_bytes: float,
    input_bytes: float,
) -> int:
    """``--run_bytes`` (``runs.run_bytes_for``); ``auto`` also gives shuffle mode on Dataflow runs
    that spill up to a thread's share of the worker's disk (larger parts, fewer elements),
    and on Dataflow no more than makes ``UNITS_PER_SLOT`` units of pass-1 work per thread of the
    expected cluster (a unit fills one run, and Dataflow cannot split a unit that straggles)."""
    if str(value) != "auto":
        return run_bytes_for(parse_bytes(value), num_piles)
    room = workers.spill_room if intermediate == "shuffle" else 0
    run = run_bytes_for("auto", num_piles, on_object_store, room)
    if workers.where != "dataflow":  # locally a unit is at most a sixteenth of the input anyway
        return run
    slots = workers.threads * expected_workers(workers, input_bytes)
    most = held_bytes / (UNITS_PER_SLOT * slots * _UNIT_SPARE)
    return int(max(min(run, most), run_bytes_for("auto", 1)))


def runs_on_object_store(intermediate: str, layout: str, work_dir: str, workers: Workers) -> bool:
    """Whether pass 1 writes runs to an object store, where pass 2 pays a request per part
    (``runs.auto_run_bytes``): files mode, shards, a remote temp location (a Dataflow job's is)."""
    remote = storage.is_remote(work_dir) or workers.where == "dataflow"
    return intermediate == "files" and layout == "shards" and remote


def check_worker_disk(plan):
    """Refuse (``UsageError``, one line) a Dataflow run whose workers spill more pass-1 runs than
    their disks hold beside ``DISK_RESERVE_GB``: threads per worker x
    ``Plan.spilled_per_writer``."""
    workers = plan.workers
    if workers is None or workers.where != "dataflow":
        return
    need = workers.threads * plan.spilled_per_writer
    if need <= (workers.disk_gb - DISK_RESERVE_GB) * GiB:
        return
    disk = (
        f"--disk_size_gb {workers.disk_gb}"
        if workers.disk_given
        else f"default {workers.disk_gb} GB disk"
    )
    raise UsageError(
        f"--disk_size_gb: each {workers.machine.name} worker spills up to "
        f"{need / GiB:,.1f} GiB of pass-1 runs ({workers.threads} thread(s) x "
        f"{plan.spilled_per_writer / GiB:,.1f} GiB, --run_bytes "
        f"{plan.run_bytes / GiB:,.1f} GiB), more than its {disk} holds beside "
        f"{DISK_RESERVE_GB} GB for the system: give --disk_size_gb "
        f"{disk_to_ask(plan)} (or a smaller --run_bytes); nothing was staged"
    )


def disk_to_ask(plan) -> int:
    """GB of worker disk a Dataflow run needs: its spill per worker and ``DISK_RESERVE_GB``, at
    least the default."""
    need = plan.workers.threads * plan.spilled_per_writer
    return max(DEFAULT_DISK_GB, math.ceil(need / GiB) + DISK_RESERVE_GB)
