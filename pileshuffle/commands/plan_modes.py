"""``pileshuffle plan``'s two intermediate modes side by side (``job_costs.mode_figures``): as
text for a Dataflow plan or one of an input not there yet (``--input_bytes``); always in JSON."""

from pileshuffle.planning.job_costs import MODES, mode_figures
from pileshuffle.planning.job_model import SIZING_RATE, TARGET_HOURS, expected_workers

__all__ = ["modes_lines", "modes_json", "size_text", "hours_text"]


def modes_json(plan, options) -> dict:
    """``{"workers": ..., "modes": {mode: figures}}`` of a shard plan (None for a store's)."""
    if plan.layout != "shards" or plan.workers is None:
        return {"workers": None, "modes": None}
    workers, kind = plan.workers, plan.workers.machine
    return {
        "workers": {
            "where": workers.where,
            "machine": kind and kind.name,
            "vcpus": kind and kind.vcpus,
            "memory": (kind.memory or None) if kind else None,
            "threads_per_worker": workers.threads,
            "memory_per_thread": workers.memory_per_thread,
            "disk_size_gb": workers.disk_gb or None,
            "expected_workers": expected_workers(workers, plan.input_bytes),
        },
        "modes": {mode: mode_figures(plan, options, mode) for mode in MODES},
    }


def modes_lines(plan, options) -> list:
    """``(label, text)`` lines of both modes in two columns, after the workers they are sized
    for; none for a local plan of the input as it is."""
    shown = plan.scaled or (plan.workers is not None and plan.workers.where == "dataflow")
    if plan.layout != "shards" or not shown:
        return []
    both = [mode_figures(plan, options, mode) for mode in MODES]
    heads = [f"{mode}{' (this run)' if mode == plan.intermediate else ''}" for mode in MODES]
    rows = [("modes", heads)] + [(f"  {label}", [show(f) for f in both]) for label, show in _ROWS]
    width = max(len(texts[0]) for _, texts in rows) + 3
    return [("workers", _workers_text(plan))] + [
        (label, texts[0].ljust(width) + texts[1]) for label, texts in rows
    ]


def _workers_text(plan) -> str:
    workers = plan.workers
    count = expected_workers(workers, plan.input_bytes)
    return f"{workers.describe()}; expected {count:,} worker(s) ({_why_workers(workers)})"


def _why_workers(workers) -> str:
    """Where the expected worker count comes from: this machine, the launch, or Dataflow's
    sizing of the input to about ``TARGET_HOURS``."""
    if workers.where != "dataflow":
        return "this machine"
    if workers.workers:
        return "as asked"
    return f"about {TARGET_HOURS:g} hour at {SIZING_RATE / 1e6:,.0f} MB/s per vCPU"


def size_text(n: float) -> str:
    """Bytes for a person, in decimal units: ``1.1 TB``, ``240.0 kB``."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{n:,.0f} bytes"


def hours_text(seconds: float) -> str:
    """A duration for a person: ``1.9 h``, or minutes under an hour."""
    return f"{seconds / 3600:,.1f} h" if seconds >= 3600 else f"{seconds / 60:,.0f} min"


def _run(f: dict) -> str:
    spilled = f", {size_text(f['spilled_per_writer'])} spilled" if f["spilled_per_writer"] else ""
    return f"{f['runs']:,} runs of {size_text(f['run_bytes'])}{spilled}"


def _units(f: dict) -> str:
    return f"{f['units']:,}: {f['units_per_thread']:,.1f} a thread, tail {f['tail_share']:.0%}"


def _parts(f: dict) -> str:
    return f"{f['parts']:,} of {f['records_per_part']:,.0f} records"


def _gets(f: dict) -> str:
    if not f["pass2_requests_per_pile"]:
        return "none (through the GroupByKey)"
    return (
        f"{f['pass2_requests_per_pile']:,.0f} a pile; ramp {hours_text(f['request_ramp_seconds'])}"
    )


def _disk(f: dict) -> str:
    asked = f"; --disk_size_gb {f['disk_size_gb']}" if f["disk_size_gb"] else ""
    return f"{size_text(f['disk_per_worker'])} spilled a worker{asked}"


def _dollars(f: dict) -> str:
    if f["dollars_per_tb"] is None:
        return "(priced on Dataflow only)"
    total = sum(f["dollars"].values())
    shares = ", ".join(
        f"{name.replace('_', ' ')} {value / total:.0%}"
        for name, value in f["dollars"].items()
        if value >= 0.05 * total
    )
    return f"${f['dollars_per_tb']:,.2f} per TB ({shares})"


_ROWS = (
    ("pass 1", _run),
    ("units", _units),
    ("parts", _parts),
    ("pass-2 GETs", _gets),
    ("disk", _disk),
    ("cost", _dollars),
)
