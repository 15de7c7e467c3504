"""The template's parameters, defined once, and the checks of their values: ``--help``,
the pipeline's option parser, ``templates/metadata.json`` and ``check_values`` are all
generated from ``PARAMETERS``. Reading a command line (unknown options, Beam's own) is
``options``' job.
"""

import dataclasses
import re

from apache_beam.options.pipeline_options import PipelineOptions

from pileshuffle.errors import UsageError

__all__ = [
    "Parameter",
    "parse_bytes",
    "parse_flag",
    "PARAMETERS",
    "PileshuffleOptions",
    "check_values",
    "check_max_pile_bytes",
    "check_compression",
    "balance_policy",
    "dedup_of",
]

_MIN_MAX_PILE_BYTES = 1 << 20  # with --num_piles=auto, where it sets the number of piles
_MIN_RUN_BYTES = (
    1 << 20
)  # --run_bytes: below it every chunk is its own run, parts as small as before runs
_MIN_SPLIT_BYTES = 16 << 10  # with a given --num_piles, where it only sets the sub-pile size
_MAX_SEED = (1 << 64) - 1  # seeds are 64-bit: larger ones would alias smaller ones


@dataclasses.dataclass(frozen=True)
class Parameter:
    """One template parameter: its option (``--name``), label, help text and example (what
    ``--help`` and metadata.json show), its default (None: required) and what a value may
    be (``choices``, ``regex``, ``kind``; ``flag``: true or false, given bare; ``param_type``: what
    the Dataflow Console asks for)."""

    name: str
    label: str
    help: str
    example: str
    default: object = None
    choices: tuple = ()
    regex: str = None
    kind: type = str
    flag: bool = False
    metavar: str = "VALUE"
    param_type: str = (
        "TEXT"  # metadata.json's paramType (flags: BOOLEAN); on Dataflow paths must be gs://
    )

    @property
    def optional(self) -> bool:
        return self.default is not None or self.flag

    @property
    def usage(self) -> str:
        """``--name VALUE`` as ``--help`` shows it."""
        if self.flag:
            return f"--{self.name}"
        return f"--{self.name} " + (
            "{" + ",".join(self.choices) + "}" if self.choices else self.metavar
        )


_UNITS = {
    "": 1,
    "b": 1,
    "k": 1 << 10,
    "kb": 1 << 10,
    "kib": 1 << 10,
    "m": 1 << 20,
    "mb": 1 << 20,
    "mib": 1 << 20,
    "g": 1 << 30,
    "gb": 1 << 30,
    "gib": 1 << 30,
    "t": 1 << 40,
    "tb": 1 << 40,
    "tib": 1 << 40,
}
_SIZE = re.compile(r"^([0-9]+(?:\.[0-9]*)?)\s*([a-zA-Z]*)$")


def parse_bytes(text) -> int:
    """'256MiB', '1G', '64MB', '1048576' -> bytes (every unit is binary: MB = MiB)."""
    found = _SIZE.match(str(text).strip())
    if not found or found.group(2).lower() not in _UNITS:
        raise ValueError(f"not a size: {text!r} (a number with KiB, MiB, GiB or TiB, e.g. 128MiB)")
    return int(float(found.group(1)) * _UNITS[found.group(2).lower()])


_FLAG_WORDS = {
    "1": True,
    "true": True,
    "yes": True,
    "on": True,
    "": True,
    "0": False,
    "false": False,
    "no": False,
    "off": False,
}


def parse_flag(text) -> bool:
    """A flag's value: true for 1/true/yes/on or a bare flag, else false."""
    return _FLAG_WORDS.get(str(text).lower(), False)


_SIZE_TEXT = (
    r"[0-9]+(\.[0-9]+)?([KMGT]i?B?|[kmgt]i?b?)?"  # a size as the template's parameters accept it
)

PARAMETERS = (  # the template's parameters, in the order --help and metadata.json show them
    Parameter(
        "input",
        "Input files",
        "Comma-separated file patterns to shuffle: local paths or any location Beam's FileSystems opens (gs://...); "
        "a comma inside a path is written \\,. Compression is detected from each file name (.gz).",
        "gs://my-bucket/data/train-*.tfrecord",
        regex=r"^[^\n]+$",
        metavar="PATTERNS",
        param_type="GCS_READ_FILE",
    ),
    Parameter(
        "output",
        "Output prefix",
        "Path prefix of the output: shards are {output}-00000-of-00064.tfrecord etc., plus {output}-manifest.json.",
        "gs://my-bucket/shuffled/train",
        regex=r"^[^\n,*?]+$",
        metavar="PREFIX",
        param_type="GCS_WRITE_FILE",
    ),
    Parameter(
        "format",
        "Record format",
        "Format of input and output records. auto: from the input files' extension (.tfrecord, .parquet, "
        ".jsonl, .tar, with .gz for the byte formats); every file must say the same. Give a format to read files "
        "whose names say none.",
        "parquet",
        default="auto",
        choices=("auto", "tfrecord", "parquet", "jsonl", "tar"),
    ),
    Parameter(
        "compression",
        "Output compression",
        "auto: as the input (gzip if every input is .gz; Parquet: snappy); none; gzip. Parquet also takes snappy, zstd.",
        "auto",
        default="auto",
        choices=("auto", "none", "gzip", "snappy", "zstd"),
    ),
    Parameter(
        "num_piles",
        "Number of piles",
        "Number of piles = output shards, or auto to size piles from the input and max_pile_bytes.",
        "auto",
        default="auto",
        regex=r"^(auto|[1-9][0-9]*)$",
        metavar="{auto,N}",
    ),
    Parameter(
        "max_pile_bytes",
        "Largest pile in memory",
        "Upper bound on the records of one pile held in a worker's memory (num_piles=auto plans piles of at most "
        "this with s + 6*sqrt(s) headroom; a larger pile is split again). auto: a third of what one worker thread "
        "holds (Dataflow: from the worker machine type and its threads; locally: from --memory), at least 8 "
        "piles per thread, within 64MiB and 1GiB; other runners 64MiB. Suffixes KiB, MiB, GiB; at least 1MiB "
        "with num_piles=auto.",
        "1GiB",
        default="auto",
        regex=f"^(auto|{_SIZE_TEXT})$",
        metavar="SIZE",
    ),  # as materialize's
    Parameter(
        "run_bytes",
        "Pass-1 run per writer",
        "How much of pass 1's output one writer gathers before it writes it as one pile-ordered run (files mode) "
        "or sends it as one element per pile (shuffle mode): a pile's part is about run_bytes / num_piles. auto: "
        "num_piles x 64KiB, at least 64MiB and at most 1GiB; files mode on an object store (gs://): num_piles x "
        "256KiB, up to 32GiB, as pass 2 pays a request per part there. Memory: up to 1GiB per worker thread; a "
        "larger run is spilled to the local temp folder and merged.",
        "512MiB",
        default="auto",
        regex=f"^(auto|{_SIZE_TEXT})$",
        metavar="{auto,SIZE}",
    ),
    Parameter(
        "memory",
        "Memory budget of a local run",
        "How much memory a run on the local runner may use: what pass 1 and pass 2 hold, and pass 1's runs kept "
        "in memory between the passes instead of in the temp folder (a run that does not fit goes there). auto: "
        "60% of the memory available when it starts. The output is the same for any budget; one no larger than "
        "what the passes hold (plan's memory line) keeps every run on disk. Other runners keep runs in the temp "
        "location.",
        "8GiB",
        default="auto",
        regex=f"^(auto|{_SIZE_TEXT})$",
        metavar="{auto,SIZE}",
    ),
    Parameter(
        "seed",
        "Random seed",
        "Seed of the shuffle: the same input, seed and piles give the same bytes.",
        "42",
        default="0",
        regex=r"^[0-9]+$",
        kind=int,
        metavar="N",
    ),
    Parameter(
        "intermediate",
        "Intermediate mode",
        "files: pass 1 writes pile fragments to the temp location and only their names are grouped (bounded memory "
        "on local runners); shuffle: records are grouped in per-pile chunks by the runner (use on Dataflow's Shuffle).",
        "files",
        default="files",
        choices=("files", "shuffle"),
    ),
    Parameter(
        "layout",
        "Output layout",
        "shards: shuffled shards (both passes); store: pass 1 only, into a pile store {output}-store/ that "
        "`pileshuffle append` extends, `expire` trims and `materialize` or the loader turns into shuffled order.",
        "shards",
        default="shards",
        choices=("shards", "store"),
    ),
    Parameter(
        "overwrite",
        "Overwrite output",
        "Replace an existing output with the same prefix.",
        "true",
        flag=True,
        regex=r"^(true|false)$",
    ),
    Parameter(
        "label_field",
        "Label field (for balance)",
        "The class of every record, for --balance: a Parquet column, a JSON key, a tf.train.Example feature "
        "(TFRecord) or a member extension (tar, e.g. cls). (--label itself is Beam's: Dataflow job labels.)",
        "label",
        default="",
        regex=r"^[^\n]*$",
        metavar="FIELD",
    ),
    Parameter(
        "balance",
        "Class balance",
        "Write each --label_field class to a target count, the copies spread over the output: uniform (every class "
        "as large as the largest), sqrt (class ratios become their square roots) or CLASS=WEIGHT,... (target "
        "shares). A first pass counts the classes. Records are copied, none dropped, unless --undersample.",
        "uniform",
        default="",
        regex=r"^[^\n]*$",
        metavar="POLICY",
    ),
    Parameter(
        "undersample",
        "Undersample instead",
        "With --balance: cut large classes down (an evenly spaced subset) instead of copying small ones up.",
        "false",
        flag=True,
        regex=r"^(true|false)$",
    ),
    Parameter(
        "keep_unlabeled",
        "Keep unlabeled records",
        "With --balance: a record without the --label_field label (or whose label cannot be read) is the class "
        "null, as a null label is, instead of stopping the run.",
        "false",
        flag=True,
        regex=r"^(true|false)$",
    ),
    Parameter(
        "dedup",
        "Exact deduplication",
        "exact: write each distinct record once (the first of its copies in input order), compared by its "
        "bytes (a Parquet row by its values); duplicates meet in one pile, so it costs no extra pass. The manifest "
        "and the summary say how many were dropped. key: by the value of --dedup_key (which alone means key). "
        "none: keep every record. With --layout store: each distinct record of the store's live window once "
        "(the oldest live copy), through every append and expire.",
        "key",
        default="none",
        choices=("none", "exact", "key"),
    ),
    Parameter(
        "dedup_key",
        "Deduplicate by field",
        "Keep one record per value of this field (the first in input order): a Parquet column, a JSON key, a "
        "tf.train.Example feature (TFRecord) or a member extension (tar), compared as --label_field compares "
        "labels. A record without the field stops the run.",
        "url",
        default="",
        regex=r"^[^\n]*$",
        metavar="FIELD",
    ),
    Parameter(
        "skip_corrupt",
        "Skip corrupt records",
        "Skip corrupt TFRecord records (resynchronising at the next valid record) and report them, instead of "
        "failing; a tar shard is read up to a damaged header and the rest of it is reported skipped; a JSONL "
        "file's last line cut short (no newline, not a whole JSON value) is skipped.",
        "false",
        flag=True,
        regex=r"^(true|false)$",
    ),
    Parameter(
        "quiet",
        "No progress lines",
        "Print no progress on stderr. Without it a local run shows pass 1 (files and bytes read, MB/s, ETA) "
        "and pass 2 (piles written): a live line on a terminal, a line every few seconds otherwise.",
        "false",
        flag=True,
        regex=r"^(true|false)$",
    ),
)


class PileshuffleOptions(PipelineOptions):
    """Beam pipeline options of the template (Beam's own options, such as --runner and
    --temp_location, come from Beam)."""

    @classmethod
    def _add_argparse_args(cls, parser):
        for parameter in PARAMETERS:
            if parameter.flag:
                parser.add_argument(
                    f"--{parameter.name}",
                    nargs="?",
                    const=True,
                    default=False,
                    type=parse_flag,
                    help=parameter.help,
                )
            else:
                parser.add_argument(
                    f"--{parameter.name}",
                    default=parameter.default,
                    help=parameter.help,
                    choices=parameter.choices or None,
                    required=False,
                )


def check_values(values, parameters=PARAMETERS):
    """Every value a user can mistype, checked before anything runs (UsageError naming the option)."""
    names = {p.name for p in parameters}
    for p in parameters:
        value = getattr(values, p.name, None)
        if value is None:
            continue
        if p.flag and not isinstance(value, bool) and str(value).lower() not in _FLAG_WORDS:
            raise UsageError(f"--{p.name}: {value!r} is not true or false")
        if p.choices and value not in p.choices:
            raise UsageError(f"--{p.name}: {value!r} is not one of {', '.join(p.choices)}")
    if "num_piles" in names:
        _check_num_piles(getattr(values, "num_piles", "auto"))
    if "max_pile_bytes" in names:
        check_max_pile_bytes(
            getattr(values, "max_pile_bytes", None),
            str(getattr(values, "num_piles", "auto")) == "auto",
        )
    if "run_bytes" in names:
        _check_run_bytes(getattr(values, "run_bytes", "auto"))
    if "memory" in names:
        _check_memory(getattr(values, "memory", "auto"))
    if "seed" in names:
        _check_seed(getattr(values, "seed", 0))
    if {"format", "compression"} <= names:
        check_compression(getattr(values, "format", "auto"), getattr(values, "compression", "auto"))
    if "balance" in names:
        balance_policy(values)
    if "dedup" in names:
        dedup_of(values)


def dedup_of(values):
    """The ``dedup.Dedup`` that ``--dedup`` and ``--dedup_key`` ask for, or None; both at once, or
    with ``--balance``, is a UsageError."""
    from pileshuffle.engine.dedup import Dedup

    kind = getattr(values, "dedup", "none") or "none"
    field = getattr(values, "dedup_key", "") or ""
    if kind == "exact" and field:
        raise UsageError(
            "--dedup exact and --dedup_key: give one (whole records, or one field's value)"
        )
    if kind == "key" and not field:
        raise UsageError(
            "--dedup key: needs --dedup_key FIELD (a column, JSON key, feature or member)"
        )
    if kind == "none" and not field:
        return None
    if getattr(values, "balance", ""):
        raise UsageError(
            "--dedup with --balance: balancing copies records that dedup would drop again; "
            "deduplicate in one run, then balance its output in another"
        )
    return Dedup(field or None)


def balance_policy(values):
    """The ``balance.Policy`` that ``--label_field``, ``--balance`` and ``--undersample`` ask for, or
    None; a half-given or malformed request (``--keep_unlabeled`` too) is a UsageError naming the option."""
    from pileshuffle.engine.balance import Policy

    label, policy = (getattr(values, name, "") or "" for name in ("label_field", "balance"))
    undersample = parse_flag(getattr(values, "undersample", False))
    keep_unlabeled = parse_flag(getattr(values, "keep_unlabeled", False))
    if not policy:
        given = [
            name
            for name, value in (
                ("label_field", label),
                ("undersample", undersample),
                ("keep_unlabeled", keep_unlabeled),
            )
            if value
        ]
        if given:
            raise UsageError(f"--{given[0]}: only means something with --balance POLICY")
        return None
    if not label:
        raise UsageError(
            "--balance: needs --label_field FIELD (the record's class: a column, JSON key, feature or member)"
        )
    try:
        return Policy.parse(policy, undersample)
    except ValueError as error:
        raise UsageError(str(error)) from None


def _check_num_piles(value):
    text = str(value).strip()
    if text == "auto":
        return
    if not re.fullmatch(r"[0-9]+", text) or int(text) < 1:
        raise UsageError(
            f"--num_piles: must be auto or a whole number of at least 1, not {value!r}"
        )


def check_max_pile_bytes(value, auto: bool, allow_auto: bool = True):
    """With ``--num_piles=auto`` the value sets the number of piles: below 1 MiB each pile's
    fixed costs (a shard file, a part per pass-1 run, a task) outweigh its records (1 KiB
    on 25 MB made 24,613 piles, more than records, at 0.8 MB/s). With a given number of piles
    it only sets the size of the sub-piles a large pile is loaded in: at least 16 KiB.
    ``auto`` (``allow_auto``: a run's, sized by ``job_model``) is not a size to check."""
    if value is None or (allow_auto and str(value).strip() == "auto"):
        return
    try:
        size = parse_bytes(value)
    except ValueError as error:
        raise UsageError(f"--max_pile_bytes: {error}") from None
    if auto and size < _MIN_MAX_PILE_BYTES:
        raise UsageError(
            f"--max_pile_bytes: {value} is below the minimum of 1MiB with --num_piles=auto: smaller piles cost more "
            "in per-pile work (a shard, a part per pass-1 run) than they save in memory; give --num_piles to "
            "choose the number of piles yourself"
        )
    if size < _MIN_SPLIT_BYTES:
        raise UsageError(
            f"--max_pile_bytes: {value} is below the minimum of 16KiB (the smallest sub-pile worth loading)"
        )


def _check_run_bytes(value):
    """``--run_bytes``: auto, or a size of at least 1 MiB (a 16 MiB input chunk is then held whole)."""
    text = str(value).strip()
    if text == "auto":
        return
    try:
        size = parse_bytes(text)
    except ValueError as error:
        raise UsageError(f"--run_bytes: {error}") from None
    if size < _MIN_RUN_BYTES:
        raise UsageError(
            f"--run_bytes: {value} is below the minimum of 1MiB: pass 1 would write a run per input "
            "chunk, with parts as small as a chunk's share of each pile; give auto or more"
        )


def _check_memory(value):
    """``--memory``: auto, or a size."""
    if str(value).strip() != "auto":
        try:
            parse_bytes(value)
        except ValueError as error:
            raise UsageError(f"--memory: {error}") from None


def _check_seed(value):
    text = str(value).strip()
    if not re.fullmatch(r"[0-9]+", text) or int(text) > _MAX_SEED:
        raise UsageError(f"--seed: must be a whole number from 0 to 2**64-1, not {value!r}")


def check_compression(format_name, compression):
    """Refuse a ``--compression`` that ``--format`` does not write (UsageError); a format name
    that is not a format (``auto``) passes: the inputs decide it later."""
    from pileshuffle.formats import FORMATS

    fmt = FORMATS.get(format_name)
    if fmt is not None and compression not in fmt.compressions:
        raise UsageError(
            f"--compression: {format_name} output takes {', '.join(fmt.compressions)}, not {compression!r}"
        )
