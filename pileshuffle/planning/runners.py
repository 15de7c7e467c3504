"""Which Beam runner runs the template, with what defaults, and whether to wait for it.

Local (no ``--runner``, DirectRunner): Beam's FnApiRunner directly, so no Prism download
is tried. Dask: Beam's DaskRunner with partitions per input file. Dataflow: the template
image as SDK container, and no waiting (the flex template launcher must not block).
"""

import os
import time
import uuid

from apache_beam.options.pipeline_options import (
    DirectOptions,
    GoogleCloudOptions,
    PipelineOptions,
    StandardOptions,
    TypeOptions,
)

from pileshuffle.names import manifest_path
from pileshuffle.planning.memory_limit import available_memory

__all__ = [
    "LOCAL_RUNNERS",
    "DASK_RUNNER",
    "DASK_CONNECT_SECONDS",
    "given_options",
    "graph_defaults",
    "local_defaults",
    "runner_name",
    "runner_problem",
    "is_dask",
    "is_dataflow",
    "make_runner",
    "dask_runner",
    "is_local",
    "in_process_threads",
    "dask_defaults",
    "dataflow_defaults",
    "should_wait",
    "outliving_job",
    "close_client",
    "submitted",
    "LOCAL_SHUFFLE_HOLD",
    "check_local_shuffle_fits",
    "DOCUMENTED_WORKER",
]

# --runner values run in-process
LOCAL_RUNNERS = (None, "DirectRunner", "FnApiRunner", "SwitchingDirectRunner")
# a Dataflow launch's worker unless it names one: the docs' and the Makefile's (docs/dataflow.md)
DOCUMENTED_WORKER = "n2-highmem-4"
# what runner_name makes of Dask's short names
DASK_RUNNER = "apache_beam.runners.dask.dask_runner.DaskRunner"
_DASK_MAX_DEFAULT_PARTITIONS = 64
# A scheduler that is up answers in well under a second, even across a region; distributed's own
# default (30 s) left a mistyped or stopped --dask_client_address looking like a hung command.
DASK_CONNECT_SECONDS = 10


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


def graph_defaults(options: PipelineOptions) -> PipelineOptions:
    """For every runner, skip Beam's construction-time type check of the template's graph
    unless asked for: its types are fixed and tested, so the check can find nothing, and
    it cost 0.05 s of every run's start (it builds Beam's option parser dozens of times)."""
    if "pipeline_type_check" not in given_options(options):
        options.view_as(TypeOptions).pipeline_type_check = False
    return options


def given_options(options: PipelineOptions) -> set:
    """The names of the options the user gave: on the command line (Beam keeps its flags), or
    as keyword values other than Beam's defaults."""
    flags = getattr(options, "_flags", None) or []
    named = {flag[2:].split("=", 1)[0] for flag in flags if flag.startswith("--")}
    return named | set(options.get_all_options(drop_default=True, retain_unknown_options=True))


def runner_name(options) -> str:
    """The ``--runner`` value, with Dask's short names resolved to its class path."""
    runner = options.view_as(StandardOptions).runner
    if isinstance(runner, str) and runner.lower() in ("daskrunner", "dask"):
        return DASK_RUNNER
    return runner


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


def is_dask(options) -> bool:
    """Whether ``--runner`` is Beam's DaskRunner."""
    runner = runner_name(options)
    return isinstance(runner, str) and runner.endswith("DaskRunner")


def is_dataflow(options) -> bool:
    """Whether ``--runner`` is Dataflow's runner."""
    runner = runner_name(options)
    return isinstance(runner, str) and runner.endswith("DataflowRunner")


def make_runner(options: PipelineOptions):
    """The runner to build the pipeline with: the FnApiRunner for local runs (no Prism download),
    our DaskRunner for Dask (``dask_runner``), else the ``--runner`` name for Beam to create."""
    runner = runner_name(options)
    if runner in LOCAL_RUNNERS:
        from apache_beam.runners.portability.fn_api_runner import FnApiRunner

        return FnApiRunner()
    if runner == DASK_RUNNER:
        return dask_runner()
    return runner


def dask_runner():
    """Beam's DaskRunner (needs dask and distributed), with a scheduler that does not answer
    reported in one line naming its address (UsageError) instead of distributed's three
    chained tracebacks."""
    from apache_beam.runners.dask.dask_runner import DaskOptions, DaskRunner

    from pileshuffle.errors import UsageError

    class ConnectingDaskRunner(DaskRunner):
        def run_pipeline(self, pipeline, options):
            try:
                return super().run_pipeline(pipeline, options)
            except OSError as error:  # distributed: "Timed out trying to connect to ... after N s"
                if "connect" not in str(error):
                    raise
                dask = options.view_as(DaskOptions)
                where = (
                    f"--dask_client_address {dask.address}"
                    if dask.address
                    else f"--dask_scheduler_file {dask.scheduler_file}"
                )
                waited = (
                    f"within {dask.timeout} s"
                    if isinstance(dask.timeout, (int, float))
                    else "in time"
                )
                raise UsageError(
                    f"{where}: no Dask scheduler answered {waited} (is it running and reachable "
                    "from here? --dask_connection_timeout sets the wait)"
                ) from None

    return ConnectingDaskRunner()


def is_local(options) -> bool:
    """Whether the run is local (no ``--runner``, or a direct runner's name)."""
    return runner_name(options) in LOCAL_RUNNERS


def in_process_threads(options) -> int:
    """The worker threads of a local runner that runs both passes in this process (``in_memory``
    or ``multi_threading``; one per core unless ``--direct_num_workers`` is given, as
    ``local_defaults`` sets), else 0."""
    direct = options.view_as(DirectOptions)
    if not is_local(options) or (direct.direct_running_mode or "in_memory") not in (
        "in_memory",
        "multi_threading",
    ):
        return 0
    given = "direct_num_workers" in given_options(options)
    return (direct.direct_num_workers if given else 0) or os.cpu_count() or 1


def dask_defaults(options: PipelineOptions, units: int) -> PipelineOptions:
    """Dask's Create puts up to 128 elements in one partition and Beam's Reshuffle is a
    no-op there, so without ``--dask_npartitions`` every source (and, after the
    GroupByKey, every pile) would be handled by one task: default to one partition per
    unit of pass 1's work (``units``: a run's groups of input files), at most 64. A scheduler
    to connect to gets ``DASK_CONNECT_SECONDS`` unless ``--dask_connection_timeout`` says
    otherwise."""
    from apache_beam.runners.dask.dask_runner import DaskOptions

    dask = options.view_as(DaskOptions)
    if not dask.npartitions and not dask.partition_size:
        dask.npartitions = max(1, min(units, _DASK_MAX_DEFAULT_PARTITIONS))
    if (
        dask.address or dask.scheduler_file
    ) and dask.timeout is None:  # not a LocalCluster, which starts processes
        dask.timeout = DASK_CONNECT_SECONDS
    return options


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


def outliving_job(options, wait=None):
    """The name of the job this launch submits and leaves running (Dataflow, not waited for),
    which holds the output's lock after the launcher returns; None when this process runs or
    waits for the job, or builds a template (no job runs)."""
    if (
        not is_dataflow(options)
        or should_wait(options, wait)
        or options.view_as(GoogleCloudOptions).template_location
    ):
        return None
    return options.view_as(GoogleCloudOptions).job_name


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


def should_wait(options, wait) -> bool:
    """Local and Dask runs wait for the result (a Dask job lives only while its client
    does). Dataflow runs do not: the flex template launcher runs this program only to
    submit the job and must not block on it (and in a template launch there is no job
    to wait for yet); Beam's ``--no_wait_until_finish`` also turns waiting off."""
    if wait is not None:
        return bool(wait)
    if is_dataflow(options):
        return False
    return (
        is_local(options)
        or is_dask(options)
        or not options.view_as(StandardOptions).no_wait_until_finish
    )


def close_client(result, cancel=False):
    """Close the Dask client a DaskRunner result holds (the cluster keeps running); after a
    failure, first cancel the run's tasks that have not started (tasks already running on
    workers finish, so a failed Dask run may leave fragments that the next run removes)."""
    client = getattr(result, "client", None)
    if client is None or not hasattr(client, "close"):
        return
    try:
        if cancel:
            client.cancel(result.futures)
        client.close()
    except Exception:  # best effort
        pass


def submitted(result, options_output: str) -> str:
    """What to tell the user about a job that was submitted and not waited for."""
    job_id = None
    try:
        if getattr(result, "has_job", False):
            job_id = result.job_id()
    except Exception:
        job_id = None
    where = f"job {job_id} submitted" if job_id else "job submitted"
    return f"{where}; {manifest_path(options_output)} appears when it has finished"


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
