"""Everything decided before the pipeline starts (``make_plan`` -> ``Plan``): the input files
(``inputs``: their format, what is skipped, one name per file, their schema), the number of
piles and their sizes, pass 1's runs, memory, and the space the temp and staging locations need;
the output check (where it goes, which files a run may replace) is ``locations``'.
Cheap, and it only reads: it lists files and reads at most a MiB of one of them and
Parquet footers. What ``run`` writes before pass 1 (probes, the output lock, removing what
an unfinished run left) is ``locations.taken_output`` (shared with ``materialize``: every
command that writes shards checks and takes its output the same way)."""

import dataclasses
import logging
import math

from apache_beam.options.pipeline_options import GoogleCloudOptions, PipelineOptions

from pileshuffle.engine.inputs import (
    check_schemas,
    describe_left_out,
    resolve_format,
    select_inputs,
)
from pileshuffle.engine.output_files import OutputFiles
from pileshuffle.engine.runs import DEFAULT_RUN_BYTES, MAX_HELD_BYTES
from pileshuffle.errors import InputError, UsageError
from pileshuffle.formats import get_format
from pileshuffle.planning.input_size import (
    RECORD_OVERHEAD,
    balance_growth,
    choose_num_piles,
    estimated_bytes,
    mean_record_bytes,
    piles_reached,
    scaled_sources,
)
from pileshuffle.planning.job_model import (
    AUTO_MEMORY_SHARE,
    LOCAL_BASE_BYTES,
    PILE_MEMORY_FACTOR,
    auto_max_pile_bytes,
    choose_run_bytes,
    local_budget,
    runs_on_object_store,
    workers_of,
)
from pileshuffle.planning.locations import check_shard_output, output_prefix, work_dir_for
from pileshuffle.planning.parameters import (
    PileshuffleOptions,
    balance_policy,
    check_balance_fits,
    check_compression,
    check_values,
    dedup_of,
    parse_bytes,
)
from pileshuffle.planning.pile_bound import check_num_piles
from pileshuffle.planning.runners import in_process_threads
from pileshuffle.planning.space import free_space, space_needed, space_note

__all__ = [
    "Plan",
    "make_plan",
    "RECORD_OVERHEAD",
    "PILE_MEMORY_FACTOR",
    "LOCAL_BASE_BYTES",
    "AUTO_MEMORY_SHARE",
    "mean_record_bytes",
    "piles_reached",
]

_log = logging.getLogger("pileshuffle")

# a unit of pass-1 work fills this much of a run (the records' held size is an estimate)
_UNIT_SPARE = 0.95


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
    # location -> (bytes needed, bytes free or None)
    space: dict = dataclasses.field(default_factory=dict)
    needs: dict = dataclasses.field(default_factory=dict)  # location -> bytes this run writes there
    # path -> why (pileshuffle's own files)
    left_out: dict = dataclasses.field(default_factory=dict)
    # path -> why (matched names that are no input file)
    skipped: dict = dataclasses.field(default_factory=dict)
    # path -> the name kept (one file named twice)
    duplicates: dict = dataclasses.field(default_factory=dict)
    # what an unfinished publication left: replaced
    unpublished: list = dataclasses.field(default_factory=list)
    mean_record_bytes: float = 1.0  # as Arrow holds a record, from a sample
    label: str = None  # --label: the class field (with --balance)
    balance: object = None  # --balance: a balance.Policy (a first pass counts the classes)
    keep_unlabeled: bool = False  # --keep_unlabeled: a record without the label is the class "null"
    # --dedup / --dedup_key: a dedup.Dedup (keys from content, duplicates dropped in pass 2)
    dedup: object = None
    estimated_bytes: int = 0  # the input uncompressed (a guess for .gz)
    growth: float = 1.0  # --balance: records written per record read, from a sample of labels
    # --run_bytes: pass 1's run size per writer (pileshuffle.engine.runs)
    run_bytes: int = DEFAULT_RUN_BYTES
    memory_budget: int = 0  # --memory: what a local run may use (0: not a local in-process run)
    # of it, pass-1 runs kept in memory between the passes (pileshuffle.engine.memory_runs)
    memory_for_runs: int = 0
    # --memory auto: the memory_limit.Memory it is a share of (None: given, or no budget)
    memory: object = None
    workers: object = None  # the job_model.Workers the piles and runs are sized for
    max_pile_reason: str = ""  # --max_pile_bytes auto: how it was sized ("" when given)
    scaled: bool = False  # plan --input_bytes: the sources stand for an input not there (unread)
    options: object = None  # the Beam options it was made with (a run's: ``runner_defaults``'s)
    # run: this very run's manifest, found at --output (nothing to do; ``launch.plan_run``)
    finished: dict = None
    job: str = None  # run: the job that holds the output's lock after the launch returns

    @property
    def space_note(self) -> str:
        """What the run needs where (``space.space_note``): said when it runs out of space."""
        return space_note(self.space)

    @property
    def held_per_writer(self) -> int:
        """What a pass-1 writer holds in memory: its run, up to ``MAX_HELD_BYTES`` (more is
        spilled)."""
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
        return [
            per_byte * sum(s.span_bytes for s in group) * held_per_record
            for group in self.source_groups
        ]

    @property
    def source_groups(self) -> list:
        """Pass 1's units of work: the sources (a large file in spans, but under --balance, whose
        copies follow each file's order) in groups (``assign``)."""
        from pileshuffle.engine.transforms.assign import source_groups, split_sources

        key = (self.unit_bytes, len(self.sources), self.sources[-1] if self.sources else None)
        cached = self.__dict__.get("_source_groups")  # 100 TB's sources take seconds: cut once
        if cached is None or cached[0] != key:
            fmt = get_format(self.format) if self.balance is None else None
            spans = (
                split_sources(self.sources, self.unit_bytes, fmt, self.skip_corrupt)
                if fmt
                else self.sources
            )
            cached = self.__dict__["_source_groups"] = (key, source_groups(spans, self.unit_bytes))
        return cached[1]

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
        """The records the piles will hold: the input's with ``--balance``'s copies (an
        estimate)."""
        return max(1, round(self.estimated_records * self.growth))

    def run_shape(self) -> tuple:
        """``(runs, parts)`` expected of pass 1 (``pileshuffle.engine.runs``): each group of sources
        flushes its records, with their keys and hashes, in runs of ``run_bytes``; a run of n
        records reaches M(1 - (1 - 1/M)^n) piles, one part (a segment, an element) each, or of
        small piles one part per group of G it reaches (``pile_groups``). Files mode writes one
        object per run; both modes send one element per part."""
        from pileshuffle.engine.pile_groups import template_group

        held_per_record, keys = (
            self.mean_record_bytes + RECORD_OVERHEAD,
            -(-self.num_piles // template_group(self)),
        )
        runs = parts = 0.0
        for held in self.group_held_bytes():
            records = held / held_per_record
            count = max(1, math.ceil(held / self.run_bytes)) if records else 0
            runs += count
            parts += count * piles_reached(keys, records / count) if count else 0
        return round(runs), round(parts)


def make_plan(options: PipelineOptions, input_bytes: int = None) -> Plan:
    """Everything decided before the pipeline starts. It only reads: it lists and samples
    the input and looks at the output's files; ``locations.taken_output`` does the writing,
    under the output's lock. ``input_bytes``: plan as if the input totalled that many bytes of
    records like its own (``input_size.scaled_sources``; ``plan --input_bytes``)."""
    opts = options.view_as(PileshuffleOptions)
    check_values(opts)
    if not opts.input:
        raise InputError("--input", "is required")
    output, outputs = _checked_output(opts)
    inputs, fmt, policy, schema, dedup = _checked_inputs(opts, output)
    sources, mean, total, growth = _sampled_sizes(opts, fmt, inputs.sources, policy, input_bytes)
    budget, found = local_budget(opts.memory) if in_process_threads(options) else (0, None)
    workers = workers_of(options, budget)
    held = total * growth / mean * (mean + RECORD_OVERHEAD)  # Plan.held_bytes
    max_pile_bytes, sized = _max_pile_bytes(opts, workers, held)
    num_piles, reason = _num_piles(opts, mean, total, max_pile_bytes, growth)
    work_dir = work_dir_for(output, options.view_as(GoogleCloudOptions).temp_location)
    needs = space_needed(sources, total, growth, opts.layout, opts.intermediate, work_dir, output)
    size = sum(s.size for s in sources)
    runs_remote = runs_on_object_store(opts.intermediate, opts.layout, work_dir, workers)
    plan = Plan(
        format=fmt.name,
        sources=sources,
        output=output,
        needs=needs,
        space=_free_space(needs, input_bytes),
        compression=fmt.output_compression(opts.compression, [s.path for s in sources]),
        num_piles=num_piles,
        num_piles_reason=reason,
        max_pile_bytes=max_pile_bytes,
        run_bytes=choose_run_bytes(
            opts.run_bytes, num_piles, opts.intermediate, runs_remote, workers, held, size
        ),
        work_dir=work_dir,
        balance=policy,
        dedup=dedup,
        schema=schema,
        input_bytes=size,
        mean_record_bytes=mean,
        estimated_bytes=total,
        growth=growth,
        workers=workers,
        max_pile_reason=sized,
        scaled=bool(input_bytes),
        options=options,
        **_given_fields(opts, inputs, outputs),
    )
    _keep_runs_in_memory(plan, budget, found, options, input_bytes)
    return plan


def _checked_output(opts) -> tuple:
    """``(output prefix, its output_files.OutputFiles)``: a shard output checked
    (``locations.check_shard_output``); a store run checks its own (``commands.run_store``)."""
    if opts.layout == "store":
        output = output_prefix(opts.output)
        return output, OutputFiles(output)
    return check_shard_output(opts.output, bool(opts.overwrite))


def _checked_inputs(opts, output: str) -> tuple:
    """``(inputs, format, balance policy, schema, dedup)``: the files ``--input`` names (less
    what pileshuffle wrote at ``output``), their format and schema, each checked against the
    options that depend on them; a UsageError or InputError before anything is sampled."""
    inputs = select_inputs(opts.input, output)
    if inputs.left_out:
        _log.warning(
            "left out %d file(s) that --input matches but pileshuffle wrote: %s",
            len(inputs.left_out),
            describe_left_out(inputs.left_out),
        )
    sources = inputs.sources
    fmt = resolve_format(opts.format, sources)
    check_compression(fmt.name, opts.compression)
    policy = balance_policy(opts)
    check_balance_fits(fmt.name, policy)
    if all(s.size == 0 for s in sources):
        raise InputError(
            sources[0].path if len(sources) == 1 else opts.input, "is empty: no records to shuffle"
        )
    schema = check_schemas(fmt, sources)
    dedup = dedup_of(opts)
    if dedup is not None and dedup.field and schema is not None and dedup.field not in schema.names:
        raise UsageError(
            f"--dedup_key: the input has no column {dedup.field!r} "
            f"(columns: {', '.join(schema.names)})"
        )
    return inputs, fmt, policy, schema, dedup


def _sampled_sizes(opts, fmt, sources: list, policy, input_bytes) -> tuple:
    """``(sources, mean record bytes, estimated bytes, growth)`` from samples of the input; with
    ``input_bytes``, the sources and bytes of that much input like it."""
    mean = mean_record_bytes(fmt, sources)
    total = estimated_bytes(fmt, sources, mean)
    growth = balance_growth(fmt, sources, opts.label_field, policy)
    if input_bytes:
        total = int(total * input_bytes / sum(s.size for s in sources))
        sources = scaled_sources(sources, input_bytes)
    return sources, mean, total, growth


def _num_piles(opts, mean: float, total: int, max_pile_bytes: int, growth: float) -> tuple:
    """``(piles, why)`` of ``--num_piles``, checked against ``pile_bound``; a warning when there
    are more piles than records (most shards would be empty)."""
    num_piles, reason = choose_num_piles(opts.num_piles, mean, total, max_pile_bytes, growth)
    check_num_piles(
        num_piles, lambda: choose_num_piles("auto", mean, total, max_pile_bytes, growth)[0]
    )
    if num_piles > max(1, total / mean):
        _log.warning(
            "%d piles for about %s records: most shards will be empty "
            "(fewer piles, or --num_piles=auto)",
            num_piles,
            f"{round(total / mean):,}",
        )
    return num_piles, reason


def _given_fields(opts, inputs, outputs) -> dict:
    """``Plan``'s fields taken as they are: the options, what ``--input`` matched but is not
    read, and what an unfinished publication left at the output."""
    return {
        "seed": int(opts.seed),
        "intermediate": opts.intermediate,
        "replace_existing": bool(opts.overwrite),
        "skip_corrupt": bool(opts.skip_corrupt),
        "label": opts.label_field or None,
        "keep_unlabeled": bool(opts.keep_unlabeled),
        "layout": opts.layout,
        "left_out": inputs.left_out,
        "skipped": inputs.skipped,
        "duplicates": inputs.duplicates,
        "unpublished": outputs.unpublished,
    }


def _max_pile_bytes(opts, workers, held: float) -> tuple:
    """``(bytes, why)`` of ``--max_pile_bytes``: as given, or ``auto`` from what one of the
    ``workers``' threads holds (``job_model.auto_max_pile_bytes``; with ``--num_piles auto`` also
    piles enough for every thread)."""
    if str(opts.max_pile_bytes).strip() != "auto":
        return parse_bytes(opts.max_pile_bytes), ""
    return auto_max_pile_bytes(workers, held, spread=str(opts.num_piles) == "auto")


def _free_space(needs: dict, input_bytes) -> dict:
    """``space.free_space`` of ``needs``; not looked up for an input not there (``input_bytes``)."""
    if input_bytes:
        return {location: (need, None) for location, need in needs.items()}
    return free_space(needs)


def _memory_for_runs(plan: Plan, budget: int, found, options) -> tuple:
    """``(--memory's budget, what of it keeps pass-1 runs in memory, the memory_limit.Memory
    an auto budget is AUTO_MEMORY_SHARE of, else None)``: the budget less what the passes hold at
    once (``runners.in_process_threads`` x the larger of a writer's held chunks and a pile being
    ordered, ``PILE_MEMORY_FACTOR`` times its bytes), ``LOCAL_BASE_BYTES``. (0, 0, None) but for
    local files mode."""
    threads = in_process_threads(options)
    if not threads or plan.intermediate != "files" or plan.layout != "shards":
        return 0, 0, None
    pile = PILE_MEMORY_FACTOR * min(plan.max_pile_bytes, 1.05 * plan.held_bytes / plan.num_piles)
    working = threads * max(plan.held_per_writer, pile) + LOCAL_BASE_BYTES
    return budget, max(0, int(budget - working)), found


def _keep_runs_in_memory(plan: Plan, budget: int, found, options, input_bytes) -> None:
    """Set the plan's ``--memory`` budget and what of it keeps pass-1 runs (``_memory_for_runs``):
    runs kept in memory never reach the temp folder, which then needs that much less."""
    plan.memory_budget, plan.memory_for_runs, plan.memory = _memory_for_runs(
        plan, budget, found, options
    )
    if plan.memory_for_runs and plan.work_dir in plan.needs:
        plan.needs[plan.work_dir] = max(0, plan.needs[plan.work_dir] - plan.memory_for_runs)
        plan.space = _free_space(plan.needs, input_bytes)
