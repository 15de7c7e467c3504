"""A ``run`` about to start: its plan, made in one descent with every fact the run needs
(``plan_run``: the runner's defaults applied, this very run's finished output, the job that will
hold the output's lock), and the checks that refuse it before anything is written
(``check_fits``). Like ``make_plan``, it only reads."""

from pileshuffle.engine.output_files import read_manifest
from pileshuffle.engine.runner import is_local_runner, outliving_job
from pileshuffle.engine.transforms.graph import manifest_fields
from pileshuffle.errors import OutputError, PileshuffleError
from pileshuffle.io import storage
from pileshuffle.names import SHARDS_KIND, manifest_path
from pileshuffle.planning.job_model import check_worker_disk
from pileshuffle.planning.parameters import PileshuffleOptions, parse_flag
from pileshuffle.planning.plan import Plan, make_plan
from pileshuffle.planning.runners import check_local_shuffle_fits, runner_defaults
from pileshuffle.planning.space import check_space

__all__ = ["plan_run", "check_fits"]


def plan_run(options, wait=None) -> Plan:
    """The plan of a ``run`` that starts now: ``make_plan`` of ``options`` with their runner's
    defaults applied first (``runner_defaults``: a Dataflow launch may be refused before anything
    is read; ``plan.options``), and ``job``, the job that holds the output's lock once the launch
    returns (``outliving_job``). A finished output at ``--output`` is refused, unless it is this
    very run's: then ``finished`` is its manifest, and there is nothing to do."""
    options = runner_defaults(options)
    try:
        plan = make_plan(options)
    except OutputError:  # such as a finished output there: this very run's is nothing to do
        plan = _finished_plan(options)
        if plan is None:
            raise
    plan.job = outliving_job(options, wait)
    return plan


def _finished_plan(options):
    """The plan over the output at ``--output``, with ``finished`` its manifest, when that is of
    this very run (its seed and the options that decide its bytes as this plan records them, its
    input files by path and size) and ``--overwrite`` is not given; else None."""
    values = options.view_as(PileshuffleOptions)
    if parse_flag(values.overwrite) or not storage.exists(manifest_path(values.output)):
        return None
    try:
        manifest = read_manifest(values.output)
        values.overwrite = True  # plan as the run would, over its own output (planning only reads)
        plan = make_plan(options)
    except PileshuffleError:
        return None
    finally:
        values.overwrite = False
    fields = manifest_fields(plan)
    inputs = {(i.get("path"), i.get("bytes")) for i in manifest.get("inputs", [])}
    if (
        manifest.get("kind") != SHARDS_KIND
        or manifest.get("seed") != fields["seed"]
        or _deciding_bytes(manifest.get("options")) != _deciding_bytes(fields["options"])
        or inputs != {(s.path, s.size) for s in plan.sources}
    ):
        return None
    plan.finished, plan.replace_existing = manifest, False
    return plan


# options a plan sizes from the memory free at its start: they change what a run holds, not the
# bytes it writes (a pile over max_pile_bytes is ordered in sub-piles in the same order)
_MEMORY_SIZED = ("max_pile_bytes", "num_piles_reason")


def _deciding_bytes(options) -> dict:
    """A manifest's ``options`` without those sized from memory (``_MEMORY_SIZED``): equal for
    runs that write the same bytes (``num_piles`` itself stays: auto sizes it from memory too,
    and another number of piles writes other bytes)."""
    return {k: v for k, v in (options or {}).items() if k not in _MEMORY_SIZED}


def check_fits(plan: Plan):
    """Refuse, before anything is written, a run that does not fit: in its local disks
    (``check_space``), its Dataflow workers' disks (``check_worker_disk``), or, shuffled by the
    local runner, in memory (``check_local_shuffle_fits``)."""
    check_space(plan.space)
    check_worker_disk(plan)
    if is_local_runner(plan.options):
        check_local_shuffle_fits(plan)
