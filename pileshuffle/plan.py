"""Everything decided before the pipeline starts: the input files (``inputs``: their
format, what is skipped, one name per file, their schema), the number of piles, the temp
and staging locations, the output check (which files a run may replace).
Cheap, and it only reads: it lists files and reads at most a MiB of one of them and
Parquet footers. What ``run`` writes before pass 1 (probes, the output lock, removing what
an unfinished run left) is ``output_lock.taken_output`` (shared with ``materialize``: every
command that writes shards checks and takes its output the same way)."""

import dataclasses
import hashlib
import logging
import math
import re
import uuid

from apache_beam.options.pipeline_options import GoogleCloudOptions, PipelineOptions

from pileshuffle import keys as keymath
from pileshuffle import interrupt, storage
from pileshuffle.errors import InputError, OutputError, UsageError
from pileshuffle.formats import get_format
from pileshuffle.formats.labels import sampled_label_counts
from pileshuffle.inputs import check_schemas, describe_left_out, resolve_format, select_inputs
from pileshuffle.names import manifest_path, staging_dir, store_dir, work_dir_name
from pileshuffle.runs import DEFAULT_RUN_BYTES, MAX_HELD_BYTES, run_bytes_for
from pileshuffle.parameters import (PileshuffleOptions, balance_policy, check_compression, check_values, dedup_of,
                                   parse_bytes)
from pileshuffle.output_files import OutputFiles, check_replaceable, missing_local_folders, remove_empty_folders
from pileshuffle.pile_bound import check_num_piles
from pileshuffle.space import FRAGMENT_OVERHEAD, free_space, space_needed
from pileshuffle.store.layout import is_store

__all__ = ["Plan", "make_plan", "RECORD_OVERHEAD", "mean_record_bytes", "work_dir_for", "check_writable",
           "check_shard_output", "piles_reached"]

_log = logging.getLogger("pileshuffle")

_SAMPLE_BYTES = 1 << 20  # what a plan reads of an input file to size its records (its first MiB)
_LABEL_SAMPLE_FILES = 8  # --balance: files whose first labels estimate the output's size (a request each on gs://)
RECORD_OVERHEAD = 16  # bytes per record in a pile beside the record itself: its 8-byte key and 8-byte hash
PILE_MEMORY_FACTOR = 3  # a pile is held 2-3 times while it is ordered and written (docs/dataflow.md)
LOCAL_BASE_BYTES = 725_000_000  # beside the passes (1 GB run: 0.96-1.0 GB, passes 0.4) + 122 MiB of numba
AUTO_MEMORY_SHARE = 0.6  # --memory auto: this share of the memory available (the rest: the page cache, other work)
_UNIT_SPARE = 0.95  # a unit of pass-1 work fills this much of a run (the records' held size is an estimate)
_GZIP_EXPANSION_GUESS = 4.0  # a compressed input's expansion when no sample can tell (not gzip)


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
    label: str = None  # --label: the class field (with --balance)
    balance: object = None  # --balance: a balance.Policy (a first pass counts the classes)
    keep_unlabeled: bool = False  # --keep_unlabeled: a record without the label is the class "null"
    dedup: object = None  # --dedup / --dedup_key: a dedup.Dedup (keys from content, duplicates dropped in pass 2)
    estimated_bytes: int = 0  # the input uncompressed (a guess for .gz)
    growth: float = 1.0  # --balance: records written per record read, from a sample of labels
    run_bytes: int = DEFAULT_RUN_BYTES  # --run_bytes: pass 1's run size per writer (pileshuffle.runs)
    memory_budget: int = 0  # --memory: what a local run may use (0: not a local in-process run)
    memory_for_runs: int = 0  # of it, pass-1 runs kept in memory between the passes (pileshuffle.memory_runs)
    memory: object = None  # --memory auto: the memory_limit.Memory it is a share of (None: given, or no budget)

    @property
    def held_per_writer(self) -> int:
        """What a pass-1 writer holds in memory: its run, up to ``MAX_HELD_BYTES`` (more is spilled)."""
        return min(self.run_bytes, MAX_HELD_BYTES)

    @property
    def spilled_per_writer(self) -> int:
        """What a pass-1 writer spills to local disk at most (``runs._Spills``): its largest
        run, 0 if every run fits in memory."""
        largest = min(self.run_bytes, max(self.group_held_bytes(), default=0))
        return int(largest) if largest > MAX_HELD_BYTES else 0

    def group_held_bytes(self) -> list:
        """Each group of sources' records as pass 1 holds them: with their keys and hashes."""
        per_byte = self.written_records / max(1, self.input_bytes)  # records per byte on disk
        held_per_record = self.mean_record_bytes + RECORD_OVERHEAD
        return [per_byte * sum(s.span_bytes for s in group) * held_per_record for group in self.source_groups]

    @property
    def source_groups(self) -> list:
        """Pass 1's units of work: the sources (a large file in spans, but under --balance, whose
        copies follow each file's order) in groups (``assign``)."""
        from pileshuffle.transforms.assign import source_groups, split_sources

        fmt = get_format(self.format) if self.balance is None else None
        spans = split_sources(self.sources, self.unit_bytes, fmt, self.skip_corrupt) if fmt else self.sources
        return source_groups(spans, self.unit_bytes)

    @property
    def unit_bytes(self) -> int:
        """Pass 1's unit of work, in input bytes: what fills one run of ``run_bytes`` as pass 1
        holds it (records with their keys and hashes; compressed input grows), 5% to spare. A
        unit of ``run_bytes`` on disk held a little more than a run: a second, tiny run each,
        whose parts doubled the reads of pass 2."""
        held_per_byte = self.held_bytes / max(1, self.input_bytes)
        return max(1, int(_UNIT_SPARE * self.run_bytes / max(held_per_byte, 1e-9)))

    @property
    def estimated_records(self) -> int:
        return max(1, round(self.estimated_bytes / self.mean_record_bytes))

    @property
    def held_bytes(self) -> float:
        """The written records as the piles hold them: each with its 8-byte key and 8-byte hash."""
        return self.written_records * (self.mean_record_bytes + RECORD_OVERHEAD)

    @property
    def written_records(self) -> int:
        """The records the piles will hold: the input's with ``--balance``'s copies (an estimate)."""
        return max(1, round(self.estimated_records * self.growth))

    def run_shape(self) -> tuple:
        """``(runs, parts)`` expected of pass 1 (``pileshuffle.runs``): each group of sources
        flushes its records, with their keys and hashes, in runs of ``run_bytes``; a run of n
        records reaches M(1 - (1 - 1/M)^n) piles, one part (a segment, an element) each, or of
        small piles one part per group of G it reaches (``pile_groups``). Files mode writes one
        object per run; both modes send one element per part."""
        from pileshuffle.transforms.pile_groups import template_group

        held_per_record, keys = self.mean_record_bytes + RECORD_OVERHEAD, -(-self.num_piles // template_group(self))
        runs = parts = 0.0
        for held in self.group_held_bytes():
            records = held / held_per_record
            count = max(1, math.ceil(held / self.run_bytes)) if records else 0
            runs += count
            parts += count * piles_reached(keys, records / count) if count else 0
        return round(runs), round(parts)


def _runs_on_object_store(opts, work_dir: str) -> bool:
    """Whether pass 1 writes runs to an object store, where pass 2 pays a request per part
    (``runs.auto_run_bytes``): files mode, shards, a remote temp location."""
    return opts.intermediate == "files" and opts.layout == "shards" and storage.is_remote(work_dir)


def piles_reached(num_piles: int, records: float) -> float:
    """Expected non-empty piles of ``records`` records: M(1 - (1 - 1/M)^n)."""
    if records <= 0 or num_piles == 1:
        return float(records > 0)
    return -num_piles * math.expm1(records * math.log1p(-1 / num_piles))


def mean_record_bytes(fmt, sources) -> float:
    """Mean bytes per record as Arrow holds it, from the first MiB of the first source that has
    a record there (Parquet: its first rows decoded)."""
    for source in sources:
        mean = fmt.mean_record_bytes(source.path, _SAMPLE_BYTES) if source.size else None
        if mean:
            return max(1.0, mean)
    return 1.0


def _estimated_bytes(fmt, sources, mean: float) -> int:
    """The input's records as Arrow holds them: Parquet's rows (its footers) of ``mean`` bytes
    each (``mean_record_bytes``: a decoded sample), a plain file's size, a compressed file's size
    times the expansion of a sample of the first one (``_expansion``)."""
    if fmt.name == "parquet":
        return int(sum(fmt.row_count(s.path) for s in sources if s.size) * mean)
    compressed = [s for s in sources if storage.compression_of(s.path) != storage.UNCOMPRESSED]
    ratio = _expansion(compressed[0].path) if compressed else 1.0
    return int(sum(s.size * (ratio if s in compressed else 1) for s in sources))


def _expansion(path: str) -> float:
    """Bytes out per byte in of a compressed file's first MiB (gzip; else ``_GZIP_EXPANSION_GUESS``)."""
    import zlib

    if storage.compression_of(path) != storage.GZIP:
        return _GZIP_EXPANSION_GUESS
    with storage.open_read(path, storage.UNCOMPRESSED) as handle:
        head = handle.read(_SAMPLE_BYTES)
    inflate = zlib.decompressobj(wbits=47)  # a gzip (or zlib) header
    try:
        out = len(inflate.decompress(head, 64 * _SAMPLE_BYTES))
    except zlib.error:  # pass 1 names what is wrong with the file
        return _GZIP_EXPANSION_GUESS
    used = len(head) - len(inflate.unconsumed_tail)
    return max(1.0, out / used) if used else _GZIP_EXPANSION_GUESS


def _choose_num_piles(requested, mean, total, max_pile_bytes, growth=1.0):
    """``(piles, why)`` for ``--num_piles`` given the mean record size, the input bytes and the
    records ``--balance`` writes per record read (``growth``)."""
    if str(requested) != "auto":
        return int(requested), "as requested"
    per_record = mean + RECORD_OVERHEAD  # as a pile holds it: records of `mean` bytes, each with its key and hash
    piles = keymath.auto_num_piles(total * growth / mean * per_record, per_record, max_pile_bytes)
    written = "" if growth == 1.0 else f" written {growth:.2f} times over by --balance (a sample of the labels),"
    reason = (f"auto: about {total / 1e6:,.0f} MB of {mean:,.0f}-byte records,{written} piles of at most "
              f"{max_pile_bytes / 2**20:,.0f} MiB with s + 6*sqrt(s) headroom")
    return piles, reason


def _balance_growth(fmt, sources, label: str, policy) -> float:
    """Records ``--balance`` writes per record read, estimated from the first MiB of labels of
    up to ``_LABEL_SAMPLE_FILES`` files spread over the input, so that auto piles and the space
    check fit the output (a 2x output in piles sized for the input splits every pile in pass 2)."""
    if policy is None:
        return 1.0
    picked = sources[::max(1, len(sources) // _LABEL_SAMPLE_FILES)][:_LABEL_SAMPLE_FILES]
    return policy.growth(sampled_label_counts(fmt, [s.path for s in picked if s.size], label, _SAMPLE_BYTES))


def work_dir_for(output: str, temp_location) -> str:
    """The run's temp directory: deterministic per output, so a re-run after a crash
    finds and replaces what a killed run left."""
    if temp_location:
        _refuse_wildcards("--temp_location", temp_location)
    digest = hashlib.sha1(output.encode()).hexdigest()[:12]
    root = temp_location or storage.split(output)[0]
    return storage.join(root, work_dir_name(digest))


def check_writable(directory: str, what: str):
    """Write and delete a probe file in ``directory``, one step Ctrl-C does not cut; leaves no
    directory it created (and removes only empty ones: another run may be filling the same folder)."""
    probe = storage.join(directory, f".probe-{uuid.uuid4().hex[:8]}")
    missing = missing_local_folders(directory)
    try:
        with interrupt.not_cut():  # a Ctrl-C between the write and the delete left the probe behind
            with storage.open_write(probe, "uncompressed") as handle:
                handle.write(b"ok")
            storage.delete([probe])
    except Exception as error:
        raise OutputError(f"cannot write to {what} {directory}: {error}") from error
    finally:
        remove_empty_folders(missing)


def _check_balance_fits(format_name: str, policy):
    """Refuse copies of tar samples: a copy keeps its sample's WebDataset key (no header is
    rewritten), and a shard cannot hold a key twice (it would read back as one sample)."""
    if format_name == "tar" and policy is not None and not policy.undersample:
        raise UsageError("--balance on tar samples copies samples, and a copy keeps its sample's WebDataset key, "
                         "which one shard cannot hold twice: give --undersample (cuts, no copies), or balance the "
                         "samples before writing them as tar")


def make_plan(options: PipelineOptions) -> Plan:
    """Everything decided before the pipeline starts. It only reads: it lists and samples
    the input and looks at the output's files; ``output_lock.taken_output`` does the writing, under
    the output's lock."""
    opts = options.view_as(PileshuffleOptions)
    check_values(opts)
    if not opts.input:
        raise InputError("--input", "is required")
    if opts.layout == "store":  # a store run checks its own (commands.store.run_store)
        output = _output_prefix(opts.output)
        outputs = OutputFiles(output)
    else:
        output, outputs = check_shard_output(opts.output, bool(opts.overwrite))
    inputs = select_inputs(opts.input, output)
    if inputs.left_out:
        _log.warning("left out %d file(s) that --input matches but pileshuffle wrote: %s", len(inputs.left_out),
                     describe_left_out(inputs.left_out))
    sources = inputs.sources
    fmt = resolve_format(opts.format, sources)
    check_compression(fmt.name, opts.compression)
    policy = balance_policy(opts)
    _check_balance_fits(fmt.name, policy)
    if all(s.size == 0 for s in sources):
        raise InputError(sources[0].path if len(sources) == 1 else opts.input, "is empty: no records to shuffle")
    schema = check_schemas(fmt, sources)
    dedup = dedup_of(opts)
    if dedup is not None and dedup.field and schema is not None and dedup.field not in schema.names:
        raise UsageError(f"--dedup_key: the input has no column {dedup.field!r} (columns: {', '.join(schema.names)})")
    max_pile_bytes = parse_bytes(opts.max_pile_bytes)
    mean = mean_record_bytes(fmt, sources)
    total = _estimated_bytes(fmt, sources, mean)
    growth = _balance_growth(fmt, sources, opts.label_field, policy)
    num_piles, reason = _choose_num_piles(opts.num_piles, mean, total, max_pile_bytes, growth)
    check_num_piles(num_piles, lambda: _choose_num_piles("auto", mean, total, max_pile_bytes, growth)[0])
    if num_piles > max(1, total / mean):
        _log.warning("%d piles for about %s records: most shards will be empty (fewer piles, or --num_piles=auto)",
                     num_piles, f"{round(total / mean):,}")
    work_dir = work_dir_for(output, options.view_as(GoogleCloudOptions).temp_location)
    needs = space_needed(sources, total, opts.intermediate, work_dir, staging_dir(output))
    if opts.layout == "store":
        needs = {store_dir(output): int(total * FRAGMENT_OVERHEAD)}
    needs = {location: int(need * growth) for location, need in needs.items()}  # --balance writes copies
    space = free_space(needs)
    plan = Plan(
        format=fmt.name,
        sources=sources,
        output=output,
        compression=fmt.output_compression(opts.compression, [s.path for s in sources]),
        num_piles=num_piles,
        num_piles_reason=reason,
        max_pile_bytes=max_pile_bytes,
        run_bytes=run_bytes_for(opts.run_bytes if str(opts.run_bytes) == "auto" else parse_bytes(opts.run_bytes),
                                num_piles, _runs_on_object_store(opts, work_dir)),
        seed=int(opts.seed),
        intermediate=opts.intermediate,
        work_dir=work_dir,
        replace_existing=bool(opts.overwrite),
        skip_corrupt=bool(opts.skip_corrupt),
        label=opts.label_field or None,
        balance=policy,
        keep_unlabeled=bool(opts.keep_unlabeled),
        dedup=dedup,
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
        growth=growth,
    )
    plan.memory_budget, plan.memory_for_runs, plan.memory = _memory_for_runs(plan, opts.memory, options)
    if plan.memory_for_runs and work_dir in needs:  # runs kept in memory never reach the temp folder
        plan.needs[work_dir] = max(0, needs[work_dir] - plan.memory_for_runs)
        plan.space = free_space(plan.needs)
    return plan


def _memory_for_runs(plan: Plan, memory, options) -> tuple:
    """``(--memory's budget, what of it keeps pass-1 runs in memory, the memory_limit.Memory
    an auto budget is AUTO_MEMORY_SHARE of, else None)``: the budget less what the passes hold at once
    (``runners.in_process_threads`` x the larger of a writer's held chunks and a pile being ordered,
    ``PILE_MEMORY_FACTOR`` times its bytes), ``LOCAL_BASE_BYTES``. (0, 0, None) but for local files mode."""
    from pileshuffle.memory_limit import available_memory
    from pileshuffle.runners import in_process_threads

    threads = in_process_threads(options)
    if not threads or plan.intermediate != "files" or plan.layout != "shards":
        return 0, 0, None
    found = available_memory() if str(memory) == "auto" else None
    budget = int(AUTO_MEMORY_SHARE * (found.available or 0)) if found else parse_bytes(memory)
    pile = PILE_MEMORY_FACTOR * min(plan.max_pile_bytes, 1.05 * plan.held_bytes / plan.num_piles)
    working = threads * max(plan.held_per_writer, pile) + LOCAL_BASE_BYTES
    return budget, max(0, int(budget - working)), found


def check_shard_output(text: str, overwrite: bool) -> tuple:
    """``--output`` of a command that writes shards (``run``, ``materialize``), before it reads
    or writes anything: a prefix of file names without wildcards, hiding no store, and its files
    replaceable (``check_replaceable``). Returns ``(prefix, OutputFiles)``."""
    output = _output_prefix(text)
    _refuse_hiding_a_store(output)
    return output, check_replaceable(output, overwrite)


def _output_prefix(text: str) -> str:
    """``--output`` as a prefix of file names; one that ends in a slash names a folder."""
    if not text:
        raise OutputError("--output: is required (a prefix of file names, e.g. --output=out/train)")
    if text.endswith(("/", "\\")):
        raise OutputError(f"--output {text}: ends with '/', but the output is a prefix of file names, not a folder: "
                          f"give e.g. --output {text}train (shards {text}train-00000-of-..., {text}train-manifest.json)")
    _refuse_wildcards("--output", text)
    return text


def _refuse_wildcards(option: str, location: str):
    """A location a run writes and deletes under must hold no ``* ? [ ]``: Beam's
    ``FileSystems.delete`` takes every path as a pattern (it has no escape), so deleting
    ``t[1]-00000-...`` would delete ``t1-00000-...`` instead."""
    found = sorted(set(re.findall(r"[*?\[\]]", location)))
    if found:
        raise OutputError(f"{option} {location}: holds {' '.join(found)}, which Beam's file systems take as wildcards "
                          "when they list and delete files (there is no escape): choose a location without * ? [ ]")


def _refuse_hiding_a_store(output: str):
    """Shards at a store's prefix would hide it: readers and ``verify`` take
    ``{P}-manifest.json`` first (as ``run --layout store`` refuses the reverse)."""
    if is_store(output):
        raise OutputError(f"a pile store exists at {store_dir(output)}/: shards at --output {output} would hide it from "
                          f"the loader and verify (they read {manifest_path(output)} first); write the shards elsewhere, "
                          f"e.g. `pileshuffle materialize --store {output} --output OTHER`")

