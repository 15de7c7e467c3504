"""The template's main: options -> plan -> read sources -> piles -> WritePiles.

Run it as ``python -m pileshuffle.pipeline --input ... --output ...`` (the flex template
entry point) or ``pileshuffle run ...``: the same options. Without ``--runner`` (or with
``--runner=DirectRunner``) it runs on Beam's local FnApiRunner, the engine the
DirectRunner itself falls back to, using every core, and never tries a download.
"""

import dataclasses
import hashlib
import json
import logging
import math
import sys
import time
import uuid

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import DirectOptions, GoogleCloudOptions, PipelineOptions, StandardOptions

from pileshuffle import keys as keymath
from pileshuffle.errors import InputError, OutputError, PileshuffleError, user_message
from pileshuffle.formats import get_format
from pileshuffle.options import PileshuffleOptions, parse_bytes
from pileshuffle.transforms.assign import STATS_TAG, ReadSourceToPiles, Source
from pileshuffle.transforms.shuffle import GroupIntoPiles
from pileshuffle.transforms.write import (
    WritePiles,
    existing_outputs,
    manifest_path,
    remove_tree,
    staging_dir,
)

LOCAL_RUNNERS = (None, "DirectRunner", "FnApiRunner", "SwitchingDirectRunner")
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
    probe = FileSystems.join(directory, f".probe-{uuid.uuid4().hex[:8]}")
    try:
        with FileSystems.create(probe, compression_type="uncompressed") as handle:
            handle.write(b"ok")
        FileSystems.delete([probe])
    except Exception as error:
        raise OutputError(f"cannot write to {what} {directory}: {error}") from error


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
    )


def build(pipeline: beam.Pipeline, plan: Plan, started: float):
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
    return (
        pass1.fragments
        | "GroupIntoPiles" >> GroupIntoPiles(plan.num_piles, plan.max_pile_bytes, plan.work_dir)
        | "WritePiles" >> WritePiles(
            plan.output, plan.format, plan.compression, num_piles=plan.num_piles, overwrite=plan.replace_existing,
            schema=plan.schema, expected=pass1[STATS_TAG], manifest_fields=manifest_fields(plan), started=started,
        )
    )


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
    """For local runs, use every core unless told otherwise."""
    direct = options.view_as(DirectOptions)
    if not any(a.startswith("--direct_num_workers") for a in argv):
        direct.direct_num_workers = 0  # 0 = one worker per core
    if not any(a.startswith("--direct_running_mode") for a in argv):
        direct.direct_running_mode = "multi_processing"
    return options


def make_runner(options: PipelineOptions):
    runner = options.view_as(StandardOptions).runner
    if runner in LOCAL_RUNNERS:
        from apache_beam.runners.portability.fn_api_runner import FnApiRunner

        return FnApiRunner()
    return runner


def is_local(options) -> bool:
    return options.view_as(StandardOptions).runner in LOCAL_RUNNERS


def run(argv=None, wait=True):
    """Plan and run a shuffle; returns the manifest (local or waited runs) or the result."""
    argv = list(sys.argv[1:] if argv is None else argv)
    options = PipelineOptions(argv)
    options.view_as(PileshuffleOptions)  # register and validate our options
    if is_local(options):
        options = local_defaults(options, argv)
    started = time.time()
    plan = make_plan(options)
    log.info("shuffling %d file(s), %s bytes, into %d piles (%s)", len(plan.sources), f"{plan.input_bytes:,}",
             plan.num_piles, plan.num_piles_reason)
    print(f"pileshuffle: {len(plan.sources)} input file(s), {plan.input_bytes:,} bytes -> {plan.num_piles} piles "
          f"({plan.num_piles_reason})", file=sys.stderr)
    pipeline = beam.Pipeline(runner=make_runner(options), options=options)
    build(pipeline, plan, started)
    try:
        result = pipeline.run()
        if not wait:
            return result
        result.wait_until_finish()
    except BaseException:
        remove_tree(plan.work_dir)
        remove_tree(staging_dir(plan.output))
        raise
    manifest = read_manifest(plan.output)
    manifest["wall_seconds"] = time.time() - started
    return manifest


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


def main(argv=None):
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        outcome = run(argv)
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
