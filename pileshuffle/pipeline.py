"""The template's main: options -> plan -> read sources -> piles -> WritePiles.

Run it as ``python -m pileshuffle.pipeline --input ... --output ...`` (the flex template
entry point) or ``pileshuffle run ...``: the same options. Without ``--runner`` (or with
``--runner=DirectRunner``) it runs on Beam's local FnApiRunner, the engine the
DirectRunner itself falls back to, using every core, and never tries a download.

``--runner=DataflowRunner`` submits the job and returns without waiting (the flex
template launcher must not block on the job); ``--runner=DaskRunner`` (with
``--dask_client_address=tcp://...``) runs on a Dask cluster and waits for it.
"""

import contextlib
import dataclasses
import hashlib
import json
import logging
import math
import os
import re
import shutil
import sys
import tempfile
import time
import types
import uuid

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import DirectOptions, GoogleCloudOptions, PipelineOptions, StandardOptions

from pileshuffle import keys as keymath
from pileshuffle.errors import InputError, OutputError, PileshuffleError, find_error, unwrapped, user_message
from pileshuffle.formats import get_format
from pileshuffle.options import PileshuffleOptions, parse_bytes
from pileshuffle.tuning import keep_freed_memory
from pileshuffle.fragments import Fragment
from pileshuffle.transforms.assign import STATS_TAG, ReadSourceToPiles, Source, SourceStats
from pileshuffle.transforms.shuffle import GroupIntoPiles
from pileshuffle.transforms.write import (
    WritePiles,
    existing_outputs,
    manifest_path,
    remove_tree,
    staging_dir,
)

LOCAL_RUNNERS = (None, "DirectRunner", "FnApiRunner", "SwitchingDirectRunner")
DASK_RUNNER = "apache_beam.runners.dask.dask_runner.DaskRunner"
DASK_MAX_DEFAULT_PARTITIONS = 64
SAMPLE_BYTES = 1 << 20
GZIP_EXPANSION_GUESS = 4.0

log = logging.getLogger("pileshuffle")


@dataclasses.dataclass
class Plan:
    """Everything decided before the pipeline starts."""

    format: str
    sources: list
    output: str
    compression: str
    num_piles: int
    num_piles_reason: str
    max_pile_bytes: int
    seed: int
    intermediate: str
    work_dir: str
    replace_existing: bool
    skip_corrupt: bool
    schema: object = None
    input_bytes: int = 0
    space: dict = dataclasses.field(default_factory=dict)  # location -> (bytes needed, bytes free or None)


def match_inputs(patterns: str) -> list:
    """Sorted, de-duplicated files matching comma-separated ``patterns``; every pattern
    must match at least one file."""
    paths = {}
    for pattern in [p.strip() for p in patterns.split(",") if p.strip()]:
        try:
            found = FileSystems.match([pattern])[0].metadata_list
        except Exception as error:
            raise InputError(pattern, f"cannot be listed: {error}") from error
        if not found:
            what = "matches no file" if any(c in pattern for c in "*?[") else "does not exist"
            raise InputError(pattern, what)
        for metadata in found:
            paths[metadata.path] = metadata.size_in_bytes
    if not paths:
        raise InputError(patterns, "names no input file")
    return [Source(i, path, paths[path]) for i, path in enumerate(sorted(paths))]


def check_schemas(fmt, sources):
    """The common schema of all sources (Parquet), or None; a mismatch names both files."""
    first_schema, first_path = None, None
    for source in sources:
        schema = fmt.check_source(source.path)
        if schema is None:
            continue
        if first_schema is None:
            first_schema, first_path = schema, source.path
        elif not schema.equals(first_schema, check_metadata=False):
            raise InputError(source.path, f"has a different schema from {first_path}: {describe_difference(first_schema, schema)}")
    return first_schema


def describe_difference(expected, actual) -> str:
    expected_fields = {f.name: str(f.type) for f in expected}
    actual_fields = {f.name: str(f.type) for f in actual}
    parts = [f"missing column {n!r}" for n in expected_fields if n not in actual_fields]
    parts += [f"extra column {n!r}" for n in actual_fields if n not in expected_fields]
    parts += [f"column {n!r} is {actual_fields[n]}, not {t}" for n, t in expected_fields.items()
              if n in actual_fields and actual_fields[n] != t]
    return "; ".join(parts) or f"column order or nullability differs ({actual} vs {expected})"


def mean_record_bytes(fmt, sources) -> float:
    """Mean stored bytes per record, from the first MiB of the first non-empty source."""
    for source in sources:
        if source.size == 0:
            continue
        for table in fmt.read_chunks(source.path, SAMPLE_BYTES, skip_corrupt=True, report=_NullReport()):
            if table.num_rows:
                return max(1.0, table.nbytes / table.num_rows)
            break
    return 1.0


class _NullReport:
    def skip(self, *args):
        pass


def estimated_bytes(sources) -> int:
    from pileshuffle.formats.base import compression_of

    return int(sum(s.size * (GZIP_EXPANSION_GUESS if compression_of(s.path) != "uncompressed" else 1) for s in sources))


def choose_num_piles(requested, fmt, sources, max_pile_bytes):
    if str(requested) != "auto":
        return int(requested), "as requested"
    mean = mean_record_bytes(fmt, sources)
    total = estimated_bytes(sources)
    piles = keymath.auto_num_piles(total, mean + 12, max_pile_bytes)
    reason = (f"auto: about {total / 1e6:,.0f} MB of {mean:,.0f}-byte records, piles of at most "
              f"{max_pile_bytes / 2**20:,.0f} MiB with s + 6*sqrt(s) headroom")
    return piles, reason


def work_dir_for(output: str, temp_location) -> str:
    """The run's temp directory: deterministic per output, so a re-run after a crash
    finds and replaces what a killed run left."""
    digest = hashlib.sha1(output.encode()).hexdigest()[:12]
    root = temp_location or FileSystems.split(output)[0]
    return FileSystems.join(root, f".pileshuffle-work-{digest}")


def check_writable(directory: str, what: str):
    """Write and delete a probe file in ``directory``; leaves no directory it created."""
    probe = FileSystems.join(directory, f".probe-{uuid.uuid4().hex[:8]}")
    existed = FileSystems.exists(directory)
    try:
        with FileSystems.create(probe, compression_type="uncompressed") as handle:
            handle.write(b"ok")
        FileSystems.delete([probe])
    except Exception as error:
        raise OutputError(f"cannot write to {what} {directory}: {error}") from error
    if not existed:
        remove_tree(directory)


FRAGMENT_OVERHEAD = 1.1  # Arrow IPC framing, the 8-byte key and 8-byte hash per record
PARQUET_EXPANSION_GUESS = 2.0  # Arrow in memory vs compressed Parquet pages


def space_needed(fmt, sources, intermediate, work_dir, staging) -> dict:
    """Bytes a run writes at each location before it finishes: pass-1 fragments (files
    mode; the input uncompressed, in Arrow) and the staged shards (about the input)."""
    expanded = estimated_bytes(sources) * (PARQUET_EXPANSION_GUESS if fmt.name == "parquet" else 1)
    needs = {staging: sum(s.size for s in sources)}
    if intermediate == "files":
        needs[work_dir] = needs.get(work_dir, 0) + int(expanded * FRAGMENT_OVERHEAD)
    return needs


def check_free_space(needs: dict) -> dict:
    """Warn when a local location has less free space than the run will write there
    (locations on one filesystem add up). Returns ``{location: (needed, free)}``;
    ``free`` is None where it cannot be known (remote filesystems)."""
    devices, space = {}, {}
    for location, need in needs.items():
        if "://" in location:
            space[location] = (need, None)
            continue
        existing = os.path.abspath(location)
        while not os.path.exists(existing) and os.path.dirname(existing) != existing:
            existing = os.path.dirname(existing)
        try:
            free, device = shutil.disk_usage(existing).free, os.stat(existing).st_dev
        except OSError:
            space[location] = (need, None)
            continue
        entry = devices.setdefault(device, [0, free, []])
        entry[0] += need
        entry[2].append(location)
    for need, free, locations in devices.values():
        for location in locations:
            space[location] = (need, free)
        if free < need:
            log.warning("%s %s %s bytes free but this run will write about %s bytes there (pass-1 fragments and "
                        "staged shards); it will fail if the disk fills up", " and ".join(locations),
                        "have" if len(locations) > 1 else "has", f"{free:,}", f"{need:,}")
    return space


def space_note(plan: Plan) -> str:
    groups = {}  # locations on one filesystem share (needed, free)
    for location, need_free in plan.space.items():
        groups.setdefault(need_free, []).append(location)
    parts = []
    for (need, free), locations in groups.items():
        known = "" if free is None else f" ({free:,} were free when it started)"
        parts.append(f"about {need:,} bytes at {' and '.join(locations)}{known}")
    return "this run needs " + " and ".join(parts) if parts else "the disk is full"


def make_plan(options: PipelineOptions) -> Plan:
    opts = options.view_as(PileshuffleOptions)
    if not opts.input:
        raise InputError("--input", "is required")
    if not opts.output:
        raise OutputError("--output is required")
    fmt = get_format(opts.format)
    output = opts.output.rstrip("/") if "://" not in opts.output else opts.output
    existing = existing_outputs(output)
    finished = manifest_path(output) in existing
    if existing and finished and not opts.overwrite:
        raise OutputError(f"output already exists: {existing[0]} (pass --overwrite to replace it)")
    if existing and not finished:
        log.warning("replacing %d shard(s) under %s left by an unfinished run (no manifest)", len(existing), output)
    sources = match_inputs(opts.input)
    if all(s.size == 0 for s in sources):
        raise InputError(sources[0].path if len(sources) == 1 else opts.input, "is empty: no records to shuffle")
    schema = check_schemas(fmt, sources)
    max_pile_bytes = parse_bytes(opts.max_pile_bytes)
    num_piles, reason = choose_num_piles(opts.num_piles, fmt, sources, max_pile_bytes)
    temp_location = options.view_as(GoogleCloudOptions).temp_location
    work_dir = work_dir_for(output, temp_location)
    for leftover in (work_dir, staging_dir(output)):
        remove_tree(leftover)
    check_writable(staging_dir(output), "the output location")
    check_writable(work_dir, "the temp location")
    space = check_free_space(space_needed(fmt, sources, opts.intermediate, work_dir, staging_dir(output)))
    return Plan(
        format=fmt.name,
        sources=sources,
        output=output,
        compression=fmt.output_compression(opts.compression, [s.path for s in sources]),
        num_piles=num_piles,
        num_piles_reason=reason,
        max_pile_bytes=max_pile_bytes,
        seed=int(opts.seed),
        intermediate=opts.intermediate,
        work_dir=work_dir,
        replace_existing=bool(opts.overwrite) or not finished,
        skip_corrupt=bool(opts.skip_corrupt),
        schema=schema,
        input_bytes=sum(s.size for s in sources),
        space=space,
    )


def build(pipeline: beam.Pipeline, plan: Plan, started: float, release_fragments: bool = False):
    """The template's graph: one leaf (Finalize), so runners that run only the last
    leaf (Dask) still run all of it."""
    fragments_dir = FileSystems.join(plan.work_dir, "fragments") if plan.intermediate == "files" else None
    sources = (
        pipeline
        | "ListSources" >> beam.Create(plan.sources)
        | "SpreadSources" >> beam.Reshuffle()
    )
    pass1 = sources | "ReadSourceToPiles" >> beam.ParDo(
        ReadSourceToPiles(plan.format, plan.seed, plan.num_piles, fragments_dir, skip_corrupt=plan.skip_corrupt)
    ).with_outputs(STATS_TAG, main="fragments")
    # Beam's DaskRunner hands every output of a multi-output ParDo to each consumer (it
    # does not separate tags), so each branch keeps only its own type; elsewhere a no-op.
    fragments = pass1.fragments | "OnlyFragments" >> beam.Filter(is_fragment_element)
    stats = pass1[STATS_TAG] | "OnlyStats" >> beam.Filter(is_source_stats)
    return (
        fragments
        | "GroupIntoPiles" >> GroupIntoPiles(plan.num_piles, plan.max_pile_bytes, plan.work_dir)
        | "WritePiles" >> WritePiles(
            plan.output, plan.format, plan.compression, num_piles=plan.num_piles, overwrite=plan.replace_existing,
            schema=plan.schema, expected=stats, manifest_fields=manifest_fields(plan), started=started,
            release_fragments=release_fragments,
        )
    )


def is_fragment_element(element) -> bool:
    return isinstance(element, tuple) and len(element) == 2 and isinstance(element[1], Fragment)


def is_source_stats(element) -> bool:
    return isinstance(element, SourceStats)


def manifest_fields(plan: Plan) -> dict:
    return {
        "output": plan.output,
        "seed": plan.seed,
        "options": {
            "format": plan.format,
            "compression": plan.compression,
            "num_piles": plan.num_piles,
            "num_piles_reason": plan.num_piles_reason,
            "max_pile_bytes": plan.max_pile_bytes,
            "intermediate": plan.intermediate,
            "skip_corrupt": plan.skip_corrupt,
        },
    }


def local_defaults(options: PipelineOptions, argv) -> PipelineOptions:
    """For local runs, use every core unless told otherwise: one worker thread per core.
    Threads beat processes here (measured on 1 GB of TFRecords, 2 cores: 5.3 s and 0.67 GB
    peak RSS against 7.1 s and 0.94 GB): the hot loops are I/O, numpy and Arrow, which
    release the GIL, and no worker process has to start and import Beam."""
    direct = options.view_as(DirectOptions)
    if not any(a.startswith("--direct_num_workers") for a in argv):
        direct.direct_num_workers = 0  # 0 = one worker per core
    if not any(a.startswith("--direct_running_mode") for a in argv):
        direct.direct_running_mode = "multi_threading"
    return options


def runner_name(options) -> str:
    """The ``--runner`` value, with Dask's short names resolved to its class path."""
    runner = options.view_as(StandardOptions).runner
    if isinstance(runner, str) and runner.lower() in ("daskrunner", "dask"):
        return DASK_RUNNER
    return runner


def is_dask(options) -> bool:
    runner = runner_name(options)
    return isinstance(runner, str) and runner.endswith("DaskRunner")


def is_dataflow(options) -> bool:
    runner = runner_name(options)
    return isinstance(runner, str) and runner.endswith("DataflowRunner")


def make_runner(options: PipelineOptions):
    runner = runner_name(options)
    if runner in LOCAL_RUNNERS:
        from apache_beam.runners.portability.fn_api_runner import FnApiRunner

        return FnApiRunner()
    if runner == DASK_RUNNER:
        from apache_beam.runners.dask.dask_runner import DaskRunner  # needs dask and distributed

        return DaskRunner()
    return runner


def is_local(options) -> bool:
    return runner_name(options) in LOCAL_RUNNERS


def dask_defaults(options: PipelineOptions, plan: Plan) -> PipelineOptions:
    """Dask's Create puts up to 128 elements in one partition and Beam's Reshuffle is a
    no-op there, so without ``--dask_npartitions`` every source (and, after the
    GroupByKey, every pile) would be handled by one task: default to one partition per
    input file (at most 64)."""
    from apache_beam.runners.dask.dask_runner import DaskOptions

    dask = options.view_as(DaskOptions)
    if not dask.npartitions and not dask.partition_size:
        dask.npartitions = max(1, min(len(plan.sources), DASK_MAX_DEFAULT_PARTITIONS))
    return options


def dataflow_defaults(options: PipelineOptions) -> PipelineOptions:
    """Workers need pileshuffle installed: the template image is also the SDK container
    (templates/Dockerfile bakes its own name into ``PILESHUFFLE_SDK_CONTAINER_IMAGE``),
    so default ``--sdk_container_image`` to it when the launch did not name one."""
    from apache_beam.options.pipeline_options import WorkerOptions

    worker = options.view_as(WorkerOptions)
    image = os.environ.get("PILESHUFFLE_SDK_CONTAINER_IMAGE")
    if image and not worker.sdk_container_image:
        worker.sdk_container_image = image
    return options


def should_wait(options, wait) -> bool:
    """Local and Dask runs wait for the result (a Dask job lives only while its client
    does). Dataflow runs do not: the flex template launcher runs this program only to
    submit the job and must not block on it (and in a template launch there is no job
    to wait for yet); Beam's ``--no_wait_until_finish`` also turns waiting off."""
    if wait is not None:
        return bool(wait)
    if is_dataflow(options):
        return False
    return is_local(options) or is_dask(options) or not options.view_as(StandardOptions).no_wait_until_finish


def run(argv=None, wait=None, hold_worker_stderr=False):
    """Plan and run a shuffle. Returns the manifest dict when the run was waited for
    (``wait=None``: every runner except Dataflow), else Beam's ``PipelineResult``.
    ``hold_worker_stderr`` (the command line): see ``_worker_stderr``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    options = PipelineOptions(argv)
    options.view_as(PileshuffleOptions)  # register and validate our options
    if is_local(options):
        options = local_defaults(options, argv)
    started = time.time()
    keep_freed_memory()
    plan = make_plan(options)
    if is_dask(options):
        options = dask_defaults(options, plan)
    if is_dataflow(options):
        options = dataflow_defaults(options)
    log.info("shuffling %d file(s), %s bytes, into %d piles (%s)", len(plan.sources), f"{plan.input_bytes:,}",
             plan.num_piles, plan.num_piles_reason)
    print(f"pileshuffle: {len(plan.sources)} input file(s), {plan.input_bytes:,} bytes -> {plan.num_piles} piles "
          f"({plan.num_piles_reason})", file=sys.stderr)
    pipeline = beam.Pipeline(runner=make_runner(options), options=options)
    build(pipeline, plan, started, release_fragments=is_local(options))
    held = types.SimpleNamespace(ours=False)
    holding = _worker_stderr(held) if hold_worker_stderr and is_local(options) else contextlib.nullcontext()
    with holding:
        try:
            result = pipeline.run()
            if not should_wait(options, wait):
                return result
            try:
                result.wait_until_finish()
            except BaseException:
                close_client(result, cancel=True)
                raise
            close_client(result)
        except BaseException as error:
            held.ours = user_message(error) is not None
            remove_tree(plan.work_dir)
            remove_tree(staging_dir(plan.output))
            message = user_message(error)
            if message and "No space left" in message:
                raise OutputError(f"{message}; {space_note(plan)}") from error
            ours = unwrapped(error)
            if ours is not None and ours is not error:
                raise ours from error  # in-process runners wrap our error or rename it
            raise
    manifest = read_manifest(plan.output)
    manifest["wall_seconds"] = time.time() - started
    return manifest


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


def read_manifest(output: str) -> dict:
    with FileSystems.open(manifest_path(output), compression_type="uncompressed") as handle:
        return json.loads(handle.read())


def summary(manifest: dict) -> str:
    totals = manifest["totals"]
    seconds = manifest.get("wall_seconds") or manifest.get("seconds") or float("nan")
    piles = manifest["pile_records"]
    lines = [
        f"records   {totals['records']:,} (fingerprints of input and output match)",
        f"bytes     {totals['payload_bytes']:,} payload, {totals['shard_bytes']:,} in {manifest['num_piles']} shard(s)",
        f"piles     {manifest['num_piles']} ({manifest['options']['num_piles_reason']}); records per pile "
        f"min {piles['min']:,} / mean {piles['mean']:,.0f} / max {piles['max']:,}; split again: {manifest['piles_split']}",
        f"time      {seconds:.2f} s, {totals['payload_bytes'] / 1e6 / seconds:,.1f} MB/s",
    ]
    if manifest["skipped"]["records"]:
        lines.append(f"skipped   {manifest['skipped']['records']} corrupt record(s), {manifest['skipped']['bytes']:,} bytes")
    lines.append(f"manifest  {manifest_path(manifest['output'])}")
    return "\n".join(lines)


class _HideReportedErrors(logging.Filter):
    """Drop the runner's log records (with tracebacks) of a failure that is one of our own
    errors: ``main`` reports those in one line."""

    def filter(self, record):
        if record.levelno < logging.ERROR or not record.name.startswith("apache_beam"):
            return True
        if record.exc_info and record.exc_info[1] is not None and find_error(record.exc_info[1]) is not None:
            return False
        try:
            text = record.getMessage()
        except Exception:
            return True
        return "pileshuffle.errors." not in text and user_message(Exception(text)) is None


@contextlib.contextmanager
def _worker_stderr(state):
    """Hold what is written to file descriptor 2 while a local pipeline runs: the local
    runner's worker processes print their own tracebacks there. It is passed on
    afterwards, except when the run failed with one of our errors (``state.ours``): then
    only our own lines are, and ``main`` reports the error in one line."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):
        yield state
        return
    with tempfile.TemporaryFile() as capture:
        os.dup2(capture.fileno(), 2)
        try:
            yield state
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            capture.seek(0)
            text = capture.read().decode(errors="replace")
            if state.ours:
                text = "".join(line for line in text.splitlines(keepends=True) if _OWN_LINE.match(line))
            sys.stderr.write(text)
            sys.stderr.flush()


_OWN_LINE = re.compile(r"^(?:pileshuffle|[A-Z]+ pileshuffle[\w.]*): ")  # our prints and our loggers' records


def main(argv=None):
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    for handler in logging.getLogger().handlers:
        handler.addFilter(_HideReportedErrors())
    try:
        outcome = run(argv, hold_worker_stderr=True)
    except PileshuffleError as error:
        print(f"pileshuffle: error: {error}", file=sys.stderr)
        return 2
    except Exception as error:
        message = user_message(error)
        if message is None:
            raise
        print(f"pileshuffle: error: {message}", file=sys.stderr)
        return 2
    if isinstance(outcome, dict):
        print(summary(outcome))
    else:
        output = PipelineOptions(list(sys.argv[1:] if argv is None else argv)).view_as(PileshuffleOptions).output
        print(f"pileshuffle: {submitted(outcome, output)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
