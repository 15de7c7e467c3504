"""The template parameters' values (the parameters themselves are ``template_parameters``):
Beam's parser of them (``PileshuffleOptions``), sizes and flags read from text, and the checks of
every value a user can mistype, each a UsageError naming its option before anything runs.
Reading a command line (unknown options, Beam's own) is ``commands.options``' job.
"""

import re

from apache_beam.options.pipeline_options import PipelineOptions

from pileshuffle.errors import UsageError
from pileshuffle.planning.template_parameters import PARAMETERS

__all__ = [
    "parse_bytes",
    "parse_flag",
    "PileshuffleOptions",
    "check_values",
    "check_max_pile_bytes",
    "check_compression",
    "balance_policy",
    "check_balance_fits",
    "dedup_of",
]

_MIN_MAX_PILE_BYTES = 1 << 20  # with --num_piles=auto, where it sets the number of piles
# --run_bytes: below it every chunk is its own run, parts as small as before runs
_MIN_RUN_BYTES = 1 << 20
_MIN_SPLIT_BYTES = 16 << 10  # with a given --num_piles, where it only sets the sub-pile size
_MAX_SEED = (1 << 64) - 1  # seeds are 64-bit: larger ones would alias smaller ones


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
    """Every value a user can mistype, checked before anything runs (UsageError naming the
    option)."""
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
    """The ``balance.Policy`` that ``--label_field``, ``--balance`` and ``--undersample`` ask
    for, or None; a half-given or malformed request (``--keep_unlabeled`` too) is a UsageError
    naming the option."""
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
            "--balance: needs --label_field FIELD "
            "(the record's class: a column, JSON key, feature or member)"
        )
    try:
        return Policy.parse(policy, undersample)
    except ValueError as error:
        raise UsageError(str(error)) from None


def check_balance_fits(format_name: str, policy):
    """Refuse copies of tar samples: a copy keeps its sample's WebDataset key (no header is
    rewritten), and a shard cannot hold a key twice (it would read back as one sample)."""
    if format_name == "tar" and policy is not None and not policy.undersample:
        raise UsageError(
            "--balance on tar samples copies samples, and a copy keeps its sample's WebDataset "
            "key, which one shard cannot hold twice: give --undersample (cuts, no copies), or "
            "balance the samples before writing them as tar"
        )


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
            f"--max_pile_bytes: {value} is below the minimum of 1MiB with --num_piles=auto: "
            "smaller piles cost more in per-pile work (a shard, a part per pass-1 run) than they "
            "save in memory; give --num_piles to choose the number of piles yourself"
        )
    if size < _MIN_SPLIT_BYTES:
        raise UsageError(
            f"--max_pile_bytes: {value} is below the minimum of 16KiB "
            "(the smallest sub-pile worth loading)"
        )


def _check_run_bytes(value):
    """``--run_bytes``: auto, or a size of at least 1 MiB (a 16 MiB input chunk is then held
    whole)."""
    text = str(value).strip()
    if text == "auto":
        return
    try:
        size = parse_bytes(text)
    except ValueError as error:
        raise UsageError(f"--run_bytes: {error}") from None
    if size < _MIN_RUN_BYTES:
        raise UsageError(
            f"--run_bytes: {value} is below the minimum of 1MiB: pass 1 would write a run per "
            "input chunk, with parts as small as a chunk's share of each pile; give auto or more"
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
            f"--compression: {format_name} output takes {', '.join(fmt.compressions)}, "
            f"not {compression!r}"
        )
