"""Everything decided before the pipeline starts: the input files (``inputs``: their
format, what is skipped, one name per file, their schema), the number of piles, the temp
and staging locations, the output check (which files a run may replace).
Cheap, and it only reads: it lists files and reads at most a MiB of one of them and
Parquet footers. What ``run`` writes before pass 1 (probes, the output lock, removing what
an unfinished run left) is here too, apart: ``taken_output`` (shared with ``materialize``:
every command that writes shards checks and takes its output the same way)."""

import contextlib
import dataclasses
import hashlib
import json
import logging
import math
import os
import re
import shutil
import uuid

from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import GoogleCloudOptions, PipelineOptions

from pileshuffle import keys as keymath
from pileshuffle.errors import InputError, OutputError
from pileshuffle.inputs import check_schemas, describe_left_out, describe_skipped, resolve_format, select_inputs
from pileshuffle.options import PileshuffleOptions, check_compression, check_values, parse_bytes
from pileshuffle.store.layout import FileLock, is_store, store_dir
from pileshuffle.transforms.write import (
    OutputFiles,
    check_replaceable,
    discard_unpublished,
    manifest_path,
    output_lock_path,
    remove_tree,
    staging_dir,
)

log = logging.getLogger("pileshuffle")

SAMPLE_BYTES = 1 << 20
RECORD_OVERHEAD = 16  # bytes per record in a pile beside the record itself: its 8-byte key and 8-byte hash
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
    layout: str = "shards"
    schema: object = None
    input_bytes: int = 0
    space: dict = dataclasses.field(default_factory=dict)  # location -> (bytes needed, bytes free or None)
    needs: dict = dataclasses.field(default_factory=dict)  # location -> bytes this run writes there
    left_out: dict = dataclasses.field(default_factory=dict)  # path -> why (pileshuffle's own files)
    skipped: dict = dataclasses.field(default_factory=dict)  # path -> why (matched names that are no input file)
    duplicates: dict = dataclasses.field(default_factory=dict)  # path -> the name kept (one file named twice)
    unpublished: list = dataclasses.field(default_factory=list)  # what an unfinished publication left: replaced
    mean_record_bytes: float = 1.0  # as Arrow holds a record, from a sample
    estimated_bytes: int = 0  # the input uncompressed (a guess for .gz)

    @property
    def estimated_records(self) -> int:
        return max(1, round(self.estimated_bytes / self.mean_record_bytes))

    @property
    def fragment_files(self) -> int:
        """Files mode's pass-1 fragments, at most one per (input file, pile)."""
        return len(self.sources) * self.num_piles if self.intermediate == "files" else 0


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


def choose_num_piles(requested, mean, total, max_pile_bytes):
    """``(piles, why)`` for ``--num_piles`` given the mean record size and the input bytes."""
    if str(requested) != "auto":
        return int(requested), "as requested"
    per_record = mean + RECORD_OVERHEAD  # as a pile holds it: records of `mean` bytes, each with its key and hash
    piles = keymath.auto_num_piles(total / mean * per_record, per_record, max_pile_bytes)
    reason = (f"auto: about {total / 1e6:,.0f} MB of {mean:,.0f}-byte records, piles of at most "
              f"{max_pile_bytes / 2**20:,.0f} MiB with s + 6*sqrt(s) headroom")
    return piles, reason


def work_dir_for(output: str, temp_location) -> str:
    """The run's temp directory: deterministic per output, so a re-run after a crash
    finds and replaces what a killed run left."""
    if temp_location:
        refuse_wildcards("--temp_location", temp_location)
    digest = hashlib.sha1(output.encode()).hexdigest()[:12]
    root = temp_location or FileSystems.split(output)[0]
    return FileSystems.join(root, f".pileshuffle-work-{digest}")


def check_writable(directory: str, what: str):
    """Write and delete a probe file in ``directory``; leaves no directory it created
    (and removes only empty ones: another run may be filling the same folder)."""
    probe = FileSystems.join(directory, f".probe-{uuid.uuid4().hex[:8]}")
    missing = missing_local_folders(directory)
    try:
        with FileSystems.create(probe, compression_type="uncompressed") as handle:
            handle.write(b"ok")
        FileSystems.delete([probe])
    except Exception as error:
        raise OutputError(f"cannot write to {what} {directory}: {error}") from error
    finally:
        for folder in missing:  # deepest first
            try:
                os.rmdir(folder)
            except OSError:
                break


def missing_local_folders(directory: str) -> list:
    """The folders of a local ``directory`` that do not exist yet, deepest first."""
    missing = []
    if "://" in directory:
        return missing
    folder = os.path.abspath(directory)
    while not os.path.exists(folder) and os.path.dirname(folder) != folder:
        missing.append(folder)
        folder = os.path.dirname(folder)
    return missing


FRAGMENT_OVERHEAD = 1.1  # Arrow IPC framing, the 8-byte key and 8-byte hash per record
PARQUET_EXPANSION_GUESS = 2.0  # Arrow in memory vs compressed Parquet pages


def fragment_bytes(fmt, sources) -> int:
    """About what pass 1 writes as Arrow fragments or store files: the input uncompressed, in Arrow."""
    expanded = estimated_bytes(sources) * (PARQUET_EXPANSION_GUESS if fmt.name == "parquet" else 1)
    return int(expanded * FRAGMENT_OVERHEAD)


def space_needed(fmt, sources, intermediate, work_dir, staging) -> dict:
    """Bytes a run writes at each location before it finishes: pass-1 fragments (files
    mode) and the staged shards (about the input)."""
    needs = {staging: sum(s.size for s in sources)}
    if intermediate == "files":
        needs[work_dir] = needs.get(work_dir, 0) + fragment_bytes(fmt, sources)
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
    """Everything decided before the pipeline starts. It only reads: it lists and samples
    the input and looks at the output's files; ``taken_output`` does the writing, under
    the output's lock."""
    opts = options.view_as(PileshuffleOptions)
    check_values(opts)
    if not opts.input:
        raise InputError("--input", "is required")
    if opts.layout == "store":  # a store run checks its own (store.commands.run_store)
        output = output_prefix(opts.output)
        outputs = OutputFiles(output)
    else:
        output, outputs = check_shard_output(opts.output, bool(opts.overwrite))
    inputs = select_inputs(opts.input, output)
    if inputs.left_out:
        log.warning("left out %d file(s) that --input matches but pileshuffle wrote: %s", len(inputs.left_out),
                    describe_left_out(inputs.left_out))
    sources = inputs.sources
    fmt = resolve_format(opts.format, sources)
    check_compression(fmt.name, opts.compression)
    if all(s.size == 0 for s in sources):
        raise InputError(sources[0].path if len(sources) == 1 else opts.input, "is empty: no records to shuffle")
    schema = check_schemas(fmt, sources)
    max_pile_bytes = parse_bytes(opts.max_pile_bytes)
    mean, total = mean_record_bytes(fmt, sources), estimated_bytes(sources)
    num_piles, reason = choose_num_piles(opts.num_piles, mean, total, max_pile_bytes)
    if num_piles > max(1, total / mean):
        log.warning("%d piles for about %s records: most shards will be empty (fewer piles, or --num_piles=auto)",
                    num_piles, f"{round(total / mean):,}")
    work_dir = work_dir_for(output, options.view_as(GoogleCloudOptions).temp_location)
    needs = space_needed(fmt, sources, opts.intermediate, work_dir, staging_dir(output))
    if opts.layout == "store":
        needs = {store_dir(output): fragment_bytes(fmt, sources)}
    space = check_free_space(needs)
    plan = Plan(
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
        replace_existing=bool(opts.overwrite),
        skip_corrupt=bool(opts.skip_corrupt),
        layout=opts.layout,
        schema=schema,
        input_bytes=sum(s.size for s in sources),
        space=space,
        needs=needs,
        left_out=inputs.left_out,
        skipped=inputs.skipped,
        duplicates=inputs.duplicates,
        unpublished=outputs.unpublished,
        mean_record_bytes=mean,
        estimated_bytes=total,
    )
    if plan.layout != "store" and plan.fragment_files > fragment_limit(work_dir):
        log.warning("%s", fragment_warning(plan))
    return plan


def check_shard_output(text: str, overwrite: bool) -> tuple:
    """``--output`` of a command that writes shards (``run``, ``materialize``), before it reads
    or writes anything: a prefix of file names without wildcards, hiding no store, and its files
    replaceable (``check_replaceable``). Returns ``(prefix, OutputFiles)``."""
    output = output_prefix(text)
    refuse_hiding_a_store(output)
    return output, check_replaceable(output, overwrite)


def output_prefix(text: str) -> str:
    """``--output`` as a prefix of file names; one that ends in a slash names a folder."""
    if not text:
        raise OutputError("--output: is required (a prefix of file names, e.g. --output=out/train)")
    if text.endswith(("/", "\\")):
        raise OutputError(f"--output {text}: ends with '/', but the output is a prefix of file names, not a folder: "
                          f"give e.g. --output {text}train (shards {text}train-00000-of-..., {text}train-manifest.json)")
    refuse_wildcards("--output", text)
    return text


def refuse_wildcards(option: str, location: str):
    """A location a run writes and deletes under must hold no ``* ? [ ]``: Beam's
    ``FileSystems.delete`` takes every path as a pattern (it has no escape), so deleting
    ``t[1]-00000-...`` would delete ``t1-00000-...`` instead."""
    found = sorted(set(re.findall(r"[*?\[\]]", location)))
    if found:
        raise OutputError(f"{option} {location}: holds {' '.join(found)}, which Beam's file systems take as wildcards "
                          "when they list and delete files (there is no escape): choose a location without * ? [ ]")


def refuse_hiding_a_store(output: str):
    """Shards at a store's prefix would hide it: readers and ``verify`` take
    ``{P}-manifest.json`` first (as ``run --layout store`` refuses the reverse)."""
    if is_store(output):
        raise OutputError(f"a pile store exists at {store_dir(output)}/: shards at --output {output} would hide it from "
                          f"the loader and verify (they read {manifest_path(output)} first); write the shards elsewhere, "
                          f"e.g. `pileshuffle materialize --store {output} --output OTHER`")


class OutputLock(FileLock):
    """``{output}.pileshuffle-lock``: held by a ``run`` from before it touches the output's
    files until it has published or cleaned up, so two runs never share a work folder."""

    def __init__(self, output: str, command: str):
        super().__init__(output_lock_path(output), command, f"output {output}")

    def refusal(self, holder: dict) -> str:
        return (f"output {self.what[len('output '):]} is locked by a run started at {holder.get('since')} (pid "
                f"{holder.get('pid')} on {holder.get('host')}: `{holder.get('command')}`); wait for it to finish, or "
                f"delete {self.path} if that process is gone")


@contextlib.contextmanager
def taken_output(output: str, overwrite: bool, work_dir: str, command: str):
    """Hold the shard output ``output`` (from ``check_shard_output``) for a command that writes
    it, with ``work_dir`` its temp folder. First probe that both locations can be written
    (leaving nothing behind), then take ``OutputLock`` (released on success, failure and
    Ctrl-C) and, under it, check the output again (another command may have published
    meanwhile) and remove what an unfinished run left: the files its journal lists, its
    staging and work folders."""
    check_writable(staging_dir(output), "the output location")
    check_writable(work_dir, "the temp location")
    with OutputLock(output, command).held():
        check_shard_output(output, overwrite)
        removed = discard_unpublished(output)
        if removed:
            log.warning("removed %d file(s) under %s that an unfinished run was publishing (its journal lists them)",
                        len(removed), output)
        remove_tree(work_dir)
        yield


# -- what a person decides from: `pileshuffle plan` ------------------------------------------------

OBJECT_STORE_FRAGMENTS = 100_000  # object stores list, create and delete ~100,000 small objects well
LOCAL_FRAGMENTS = 1_000_000
PILE_MEMORY_FACTOR = 3  # a pile is held 2-3 times while it is ordered and written (docs/dataflow.md)
LOCAL_BASE_BYTES = 300_000_000  # Python, Beam and Arrow in the local runner's one process (measured: 0.53 GB peak at 1 GB)
SDK_PROCESS_BYTES = 1_000_000_000  # per SDK process on a Dataflow worker (docs/dataflow.md)


def fragment_limit(location: str) -> int:
    return OBJECT_STORE_FRAGMENTS if "://" in location else LOCAL_FRAGMENTS


def fragment_warning(plan: Plan) -> str:
    return (f"--intermediate=files writes up to {plan.fragment_files:,} fragment files ({len(plan.sources):,} input "
            f"files x {plan.num_piles:,} piles) under {plan.work_dir}, more than the {fragment_limit(plan.work_dir):,} "
            "that file system handles well: use --intermediate=shuffle (the runner's shuffle; Dataflow's Shuffle service)")


@dataclasses.dataclass(frozen=True)
class PileSizes:
    """Pile sizes of a plan: records per pile are Binomial(records, 1/M)."""

    records: int
    num_piles: int
    record_bytes: float  # per record in a pile, payload and overhead
    max_pile_bytes: int

    @property
    def expected(self) -> float:
        return self.records / self.num_piles

    @property
    def headroom(self) -> float:
        """s + 6 sqrt(s): what auto sizing plans for."""
        return self.expected + 6 * math.sqrt(self.expected)

    @property
    def split_probability(self) -> float:
        """Probability that some pile holds more than ``max_pile_bytes`` (and is split again),
        by the normal approximation of each pile's binomial size."""
        limit = self.max_pile_bytes / self.record_bytes
        if self.num_piles == 1:
            return float(self.records > limit)
        variance = self.expected * (1 - 1 / self.num_piles)
        one = 0.5 * math.erfc((limit - self.expected) / math.sqrt(2 * variance))
        return 1.0 if one >= 1 else -math.expm1(self.num_piles * math.log1p(-one))


def pile_sizes(plan: Plan) -> PileSizes:
    return PileSizes(plan.estimated_records, plan.num_piles, plan.mean_record_bytes + RECORD_OVERHEAD, plan.max_pile_bytes)


def runner_description(options) -> tuple:
    """``(runner, piles in flight per worker or None)``."""
    from apache_beam.options.pipeline_options import DirectOptions, GoogleCloudOptions

    from pileshuffle.runners import is_dask, is_dataflow, is_local, runner_name

    if is_local(options):
        direct = options.view_as(DirectOptions)
        threads = direct.direct_num_workers or os.cpu_count() or 1
        mode = direct.direct_running_mode or "multi_threading"
        return f"local: Beam's FnApiRunner on this machine, {threads} worker(s) ({mode})", threads
    if is_dataflow(options):
        region = options.view_as(GoogleCloudOptions).region or "(no --region)"
        return f"Dataflow in {region}: submits the job and returns", None
    if is_dask(options):
        from apache_beam.runners.dask.dask_runner import DaskOptions

        address = options.view_as(DaskOptions).address
        return f"Dask at {address}" if address else "Dask on a local cluster it starts", None
    return str(runner_name(options)), None


def _size(n: float) -> str:
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{n:,.0f} bytes"


def _mib(n: int) -> str:
    return f"{n / 2**20:,.0f} MiB" if n >= 2**20 else f"{n:,} bytes"


def _chance(p: float) -> str:
    if p < 1e-9:
        return "less than 1 in a billion"
    if p < 1e-3:
        return f"about 1 in {1 / p:,.0f}"
    return f"{p:.1%}"


def plan_text(plan: Plan, options) -> str:
    """The plan as a person reads it: what was found, what will be made, what it needs."""
    sizes = pile_sizes(plan)
    runner, in_flight = runner_description(options)
    pile_bytes = sizes.headroom * sizes.record_bytes
    guessed = " (guessing 4x for .gz input)" if plan.estimated_bytes != plan.input_bytes else ""
    lines = [
        ("input", f"{len(plan.sources):,} {plan.format} file(s), {plan.input_bytes:,} bytes ({_size(plan.input_bytes)})"),
        ("records", f"about {plan.estimated_records:,} of {plan.mean_record_bytes:,.0f} bytes on average{guessed}"),
    ]
    if plan.left_out:
        lines.append(("left out", f"{len(plan.left_out):,} matched file(s) that pileshuffle wrote: "
                                  f"{describe_left_out(plan.left_out)}"))
    if plan.skipped:
        lines.append(("skipped", f"{len(plan.skipped):,} matched name(s) that are not input files: "
                                 f"{describe_skipped(plan.skipped)}"))
    if plan.duplicates:
        lines.append(("duplicates", f"{len(plan.duplicates):,} name(s) of files already matched (each file is read once)"))
    if plan.unpublished:
        lines.append(("replaces", f"{len(plan.unpublished):,} file(s) an unfinished run was publishing (its journal "
                                  f"in {staging_dir(plan.output)} lists them)"))
    if plan.layout == "store":
        return "\n".join(f"{label:<14}{text}" for label, text in lines + store_lines(plan, options))
    lines += [
        ("piles", f"{plan.num_piles:,} = output shards ({plan.num_piles_reason})"),
        ("pile size", f"s = {sizes.expected:,.0f} records expected; plan for s + 6*sqrt(s) = {sizes.headroom:,.0f} "
                      f"records, about {_size(pile_bytes)} (--max_pile_bytes {_mib(plan.max_pile_bytes)})"),
        ("split again", f"chance that some pile exceeds {_mib(plan.max_pile_bytes)} and is split again (same order): "
                        f"{_chance(sizes.split_probability)}"),
    ]
    per_pile = PILE_MEMORY_FACTOR * min(pile_bytes, plan.max_pile_bytes)
    if in_flight:
        lines.append(("memory", f"about {_size(per_pile)} per pile being written x {in_flight} at a time + "
                                f"{_size(LOCAL_BASE_BYTES)} = {_size(per_pile * in_flight + LOCAL_BASE_BYTES)} peak"))
    else:
        lines.append(("memory", f"about {_size(per_pile)} per pile in flight on a worker, plus "
                                f"{_size(SDK_PROCESS_BYTES)} per SDK process (docs/dataflow.md: worker memory)"))
    staging = staging_dir(plan.output)
    if plan.work_dir in plan.needs:
        lines.append(("temp space", f"about {_size(plan.needs[plan.work_dir])} at {plan.work_dir} (pass-1 "
                                    f"fragments, removed at the end){_free(plan, plan.work_dir)}"))
    if staging in plan.needs:
        lines.append(("output space", f"about {_size(plan.needs[staging])} (shards, staged in {staging}, then "
                                      f"renamed){_free(plan, staging)}"))
    if plan.intermediate == "files":
        lines.append(("fragments", f"up to {plan.fragment_files:,} files ({len(plan.sources):,} input files x "
                                   f"{plan.num_piles:,} piles) under {plan.work_dir}"))
    else:
        shuffled = plan.estimated_records * (plan.mean_record_bytes + RECORD_OVERHEAD)
        lines.append(("shuffle", f"about {_size(shuffled)} through the runner's GroupByKey (--intermediate=shuffle: "
                                 "the records with their keys and hashes)"))
    lines += [
        ("output", f"{plan.output}-00000-of-{plan.num_piles:05d}... + {manifest_path(plan.output)}, compression "
                   f"{plan.compression}, seed {plan.seed}"),
        ("runner", runner),
    ]
    if plan.fragment_files > fragment_limit(plan.work_dir):
        lines.append(("warning", fragment_warning(plan)))
    return "\n".join(f"{label:<14}{text}" for label, text in lines)


def store_lines(plan: Plan, options) -> list:
    """What ``run --layout store`` writes: pass 1 only, into a new pile store."""
    from pileshuffle.store.write import STORE_WRITERS

    sizes = pile_sizes(plan)
    store = store_dir(plan.output)
    writers = min(STORE_WRITERS, len(plan.sources))
    return [
        ("piles", f"{plan.num_piles:,} piles in the store ({plan.num_piles_reason}); the loader or `pileshuffle "
                  "materialize` orders them later"),
        ("pile size", f"s = {sizes.expected:,.0f} records expected; plan for s + 6*sqrt(s) = {sizes.headroom:,.0f} "
                      f"records (--max_pile_bytes {_mib(plan.max_pile_bytes)}: larger piles are loaded in sub-piles)"),
        ("output", f"pile store {store}/: generation 0 (manifest version 1), up to {writers * plan.num_piles:,} files "
                   f"of Arrow IPC ({writers} writer(s) x {plan.num_piles:,} piles) holding each record with its key and "
                   f"hash, seed {plan.seed}"),
        ("output space", f"about {_size(plan.needs.get(store, 0))} at {store}/{_free(plan, store)}"),
        ("runner", runner_description(options)[0]),
    ]


def _free(plan: Plan, location: str) -> str:
    """Free space at ``location`` (shared with the plan's other locations on that disk)."""
    need, free = plan.space.get(location, (0, None))
    if free is None:
        return ""
    shared = " on that disk for both" if need != plan.needs[location] else ""
    return f"; {_size(free)} free{shared}"



def plan_json(plan: Plan, options) -> dict:
    """The machine form: the original keys, then the numbers ``plan_text`` shows."""
    sizes = pile_sizes(plan)
    return {
        "files": len(plan.sources),
        "input_bytes": plan.input_bytes,
        "num_piles": plan.num_piles,
        "reason": plan.num_piles_reason,
        "output": plan.output,
        "compression": plan.compression,
        "intermediate": plan.intermediate,
        "work_dir": plan.work_dir,
        "estimated_records": plan.estimated_records,
        "mean_record_bytes": plan.mean_record_bytes,
        "max_pile_bytes": plan.max_pile_bytes,
        "expected_pile_records": sizes.expected,
        "headroom_pile_records": sizes.headroom,
        "split_probability": sizes.split_probability,
        "fragment_files": plan.fragment_files,
        "space": {location: {"needed": plan.needs.get(location, need), "free": free}
                  for location, (need, free) in plan.space.items()},
        "left_out": plan.left_out,
        "skipped": plan.skipped,
        "duplicates": plan.duplicates,
        "replaces": plan.unpublished,
        "layout": plan.layout,
        "runner": runner_description(options)[0],
    }


def main(argv=None):
    """``pileshuffle plan``: what a run with these options would do, without running it."""
    import sys

    from pileshuffle.errors import PileshuffleError
    from pileshuffle.options import PARAMETERS, Parameter, check_argv, help_text, parse_flag, wants_help
    from pileshuffle.runners import is_local, local_defaults

    json_flag = Parameter("json", "JSON", "Print the plan as JSON (the machine form) instead of text.", "false",
                          flag=True)
    parameters = PARAMETERS + (json_flag,)
    argv = list(sys.argv[1:] if argv is None else argv)
    if wants_help(argv):
        print(help_text("pileshuffle plan", "Show what `pileshuffle run` would do with these options: files, bytes, "
                        "records, piles, pile sizes, memory, space, runner. Reads a sample; writes nothing.", parameters))
        return 0
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        values = check_argv(argv, parameters)
        options = PipelineOptions([a for a in argv if a.split("=", 1)[0] != "--json"])
        if is_local(options):
            options = local_defaults(options, argv)
        plan = make_plan(options)
    except PileshuffleError as error:
        print(f"pileshuffle: error: {error}", file=sys.stderr)
        return 2
    if parse_flag(values.json):
        print(json.dumps(plan_json(plan, options), indent=1))
    else:
        print(plan_text(plan, options))
    return 0
