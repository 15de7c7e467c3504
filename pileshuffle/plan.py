"""Everything decided before the pipeline starts: the input files, their schema, the
number of piles, the temp and staging locations (writable, with room), the output check.
Cheap: it lists files and reads at most a MiB of one of them and Parquet footers."""

import dataclasses
import hashlib
import logging
import os
import shutil
import uuid

from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import GoogleCloudOptions, PipelineOptions

from pileshuffle import keys as keymath
from pileshuffle.errors import InputError, OutputError
from pileshuffle.formats import get_format
from pileshuffle.options import PileshuffleOptions, parse_bytes
from pileshuffle.transforms.assign import Source
from pileshuffle.transforms.write import existing_outputs, manifest_path, remove_tree, staging_dir

log = logging.getLogger("pileshuffle")

SAMPLE_BYTES = 1 << 20
GZIP_EXPANSION_GUESS = 4.0


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
    """Mean stored bytes per record, from the first MiB of the first source that has a record
    there (Parquet: from its footer)."""
    for source in sources:
        mean = fmt.mean_record_bytes(source.path, SAMPLE_BYTES) if source.size else None
        if mean:
            return max(1.0, mean)
    return 1.0


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
