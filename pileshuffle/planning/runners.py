"""A run's runner as decided before it starts: its defaults (``runner_defaults``: local runs use
every core, a Dataflow launch gets the template image as SDK container, its documented worker and
a job name, or is refused before anything is read), what the plan sees of it
(``in_process_threads``), whether ``--runner`` names a runner Beam can create, and the check that
a local shuffle fits in memory. Which runner runs a pipeline, and how, is ``engine.runner``'s."""

import os
import time
import uuid

from apache_beam.options.pipeline_options import DirectOptions, GoogleCloudOptions, PipelineOptions

from pileshuffle.engine.runner import (
    LOCAL_RUNNERS,
    given_options,
    is_dataflow,
    is_local_runner,
)
from pileshuffle.io.memory_limit import available_memory

__all__ = [
    "DOCUMENTED_WORKER",
    "LOCAL_SHUFFLE_HOLD",
    "runner_defaults",
    "local_defaults",
    "dataflow_defaults",
    "runner_problem",
    "in_process_threads",
    "check_local_shuffle_fits",
]

# a Dataflow launch's worker unless it names one: the docs' and the Makefile's (docs/dataflow.md)
DOCUMENTED_WORKER = "n2-highmem-4"


def runner_defaults(options: PipelineOptions) -> PipelineOptions:
    """``options`` with their runner's defaults, applied once by every command that runs a
    pipeline, before it reads anything: ``local_defaults`` or ``dataflow_defaults`` (which may
    refuse the launch). Dask's partitions follow the graph: ``engine.runner.new_pipeline``."""
    if is_local_runner(options):
        return local_defaults(options)
    if is_dataflow(options):
        return dataflow_defaults(options)
    return options


def local_defaults(options: PipelineOptions) -> PipelineOptions:
    """For local runs, use every core unless told otherwise: one worker thread per core, in
    Beam's ``in_memory`` mode. Threads beat processes here (measured on 1 GB of TFRecords, 2
    cores: 5.3 s and 0.67 GB peak RSS against 7.1 s and 0.94 GB): the hot loops are I/O, numpy
    and Arrow, which release the GIL, and no worker process has to start and import Beam.
    ``in_memory`` runs the same threads as ``multi_threading`` without the gRPC data plane
    between them and the runner, in which 2 of 5 runs of 1 GB in 4,096 piles grew to 5 GB of
    anonymous memory at the end of pass 1 (24 GB once, uncapped), and 0 of 10 in ``in_memory``;
    at 16 piles the two take the same time (9.0-9.9 s, 4 runs)."""
    direct, given = options.view_as(DirectOptions), given_options(options)
    _quiet_in_memory_warning()
    if "direct_num_workers" not in given:
        direct.direct_num_workers = 0  # 0 = one worker per core
    if "direct_running_mode" not in given:
        direct.direct_running_mode = "in_memory"
    return options


def _quiet_in_memory_warning():
    """Beam's FnApiRunner warns on every run that ``in_memory`` with several workers lacks
    "the desired worker parallelism effect"; its bundles do run on that many threads here (both
    cores busy: 1.35-1.46 cores in the many-piles bench rows), so that one message is dropped."""
    import logging

    runner_log = logging.getLogger("apache_beam.runners.portability.fn_api_runner.fn_runner")
    if not any(isinstance(f, _InMemoryWarningFilter) for f in runner_log.filters):
        runner_log.addFilter(_InMemoryWarningFilter())


class _InMemoryWarningFilter:
    def filter(self, record) -> bool:
        return not str(record.msg).startswith("If direct_num_workers is not equal to 1")


def runner_problem(name) -> str:
    """Why Beam could not create the runner ``--runner`` names (checked before anything
    runs; Beam's own failure is a traceback at the start of the pipeline), or "": a name
    Beam knows (any case, ``Runner`` optional; not imported here), Dask's, or
    ``module.Class`` of a class that imports."""
    import importlib

    from apache_beam.options.pipeline_options import StandardOptions
    from apache_beam.runners.runner import _RUNNER_MAP

    if name is None:
        return ""
    lowered = str(name).lower()
    if (
        lowered in ("dask", "daskrunner")
        or name in LOCAL_RUNNERS
        or lowered in _RUNNER_MAP
        or lowered + "runner" in _RUNNER_MAP
    ):
        return ""
    if "." in str(name):
        module, cls = str(name).rsplit(".", 1)
        try:
            if isinstance(getattr(importlib.import_module(module), cls), type):
                return ""
        except Exception:
            pass
    known = ", ".join(
        sorted(
            n
            for n in {*StandardOptions.KNOWN_RUNNER_NAMES, "DaskRunner"}
            if not n.startswith("Test")
        )
    )
    return (
        f"--runner: {name!r} is not a runner Beam can create; give one of {known} "
        f"(default: the local FnApiRunner), or module.Class of a PipelineRunner"
    )


def in_process_threads(options) -> int:
    """The worker threads of a local runner that runs both passes in this process (``in_memory``
    or ``multi_threading``; one per core unless ``--direct_num_workers`` is given, as
    ``local_defaults`` sets), else 0."""
    direct = options.view_as(DirectOptions)
    if not is_local_runner(options) or (direct.direct_running_mode or "in_memory") not in (
        "in_memory",
        "multi_threading",
    ):
        return 0
    given = "direct_num_workers" in given_options(options)
    return (direct.direct_num_workers if given else 0) or os.cpu_count() or 1


def dataflow_defaults(options: PipelineOptions) -> PipelineOptions:
    """Workers need pileshuffle installed: the template image is also the SDK container
    (templates/Dockerfile bakes its own name into ``PILESHUFFLE_SDK_CONTAINER_IMAGE``),
    so default ``--sdk_container_image`` to it when the launch did not name one. With no image
    and no package to stage (``--setup_file``, ``--extra_package``) the workers would start
    Beam's stock image, which has no pileshuffle, and fail on their first bundle after minutes
    of start-up: refused (``UsageError``) before anything is read or staged. A launch that names
    no ``--worker_machine_type`` gets ``DOCUMENTED_WORKER``, the worker its plan is sized for."""
    from apache_beam.options.pipeline_options import SetupOptions, WorkerOptions

    from pileshuffle.errors import UsageError

    worker, setup = options.view_as(WorkerOptions), options.view_as(SetupOptions)
    image = os.environ.get("PILESHUFFLE_SDK_CONTAINER_IMAGE")
    if image and not worker.sdk_container_image:
        worker.sdk_container_image = image
    if not (
        worker.sdk_container_image
        or worker.worker_harness_container_image
        or setup.setup_file
        or setup.extra_packages
    ):
        raise UsageError(
            "--runner DataflowRunner: the workers would start Beam's stock image, which has no "
            "pileshuffle; give --sdk_container_image (the template's image: make template-build) "
            "or --setup_file ./setup.py (installed on every worker as it starts)"
        )
    _refuse_local_paths(options)
    if not worker.machine_type:  # the worker a plan sizes piles for (job_model), not n1-standard-1
        worker.machine_type = DOCUMENTED_WORKER
    cloud = options.view_as(GoogleCloudOptions)
    if not cloud.job_name:  # named before the launch: the output's lock names the job that holds it
        cloud.job_name = (
            f"pileshuffle-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{uuid.uuid4().hex[:6]}"
        )
    return options


def _refuse_local_paths(options):
    """A Dataflow job's workers cannot reach the launching machine's files: ``--input`` and
    ``--output`` must name an object store (gs://), else ``UsageError`` naming the path."""
    from pileshuffle.engine.inputs import split_patterns
    from pileshuffle.errors import UsageError
    from pileshuffle.io.storage import is_remote
    from pileshuffle.planning.parameters import PileshuffleOptions

    values = options.view_as(PileshuffleOptions)
    for name, paths in (
        ("--input", split_patterns(values.input)),
        ("--output", [values.output or ""]),
    ):
        local = [path.strip() for path in paths if path.strip() and not is_remote(path.strip())]
        if local:
            raise UsageError(
                f"{name}: {local[0]} is a local path, which a Dataflow job's workers cannot reach; "
                "give a gs:// path"
            )


# the local runner's GroupByKey holds a shuffled byte about 5 times (measured: 5.2-7.9 GB at 1 GB)
LOCAL_SHUFFLE_HOLD = 5


def check_local_shuffle_fits(plan):
    """``--intermediate=shuffle`` on the local runner sends every record through Beam's in-memory
    GroupByKey, which holds it about ``LOCAL_SHUFFLE_HOLD`` times: refuse (UsageError) a run whose
    estimate passes 80% of the memory available, before it takes the machine."""
    if plan.intermediate != "shuffle":
        return
    held, memory = LOCAL_SHUFFLE_HOLD * plan.held_bytes, available_memory()
    available = memory.available
    if available is not None and held > 0.8 * available:
        from pileshuffle.errors import UsageError

        raise UsageError(
            f"--intermediate=shuffle on the local runner keeps every record in the runner's "
            f"memory, about {LOCAL_SHUFFLE_HOLD}x: {held / 1e9:,.1f} GB for this input, more than "
            f"the {available / 1e9:,.1f} GB available here ({memory.source}); use "
            "--intermediate=files (the default: one pile per worker in memory), or a runner with a "
            "shuffle service"
        )
