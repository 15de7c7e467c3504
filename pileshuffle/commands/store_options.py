"""The store commands' options: one typed object per command (``append``, ``materialize``,
``expire``, ``gc``), made once from the command line by its parser (unknown options and bad
values refused before anything runs) or built directly by a Python caller. The commands'
functions take these objects; nothing re-parses arguments after this module."""

import argparse
import dataclasses
import typing

from pileshuffle.commands.help_style import CommandParser
from pileshuffle.commands.options import check_command_argv
from pileshuffle.engine.balance import Policy
from pileshuffle.errors import UsageError
from pileshuffle.store.expire import DEFAULT_GRACE_SECONDS, check_grace_seconds

if typing.TYPE_CHECKING:
    from apache_beam.options.pipeline_options import PipelineOptions

__all__ = [
    "AppendOptions",
    "ExpireOptions",
    "GcOptions",
    "MaterializeOptions",
    "append_options",
    "expire_options",
    "gc_options",
    "materialize_options",
]

_STORE_HELP = "the store's prefix P (its files are under P-store/)"


def _beam_options(args=()):
    """Beam's options of ``args``: imported here, so that ``expire`` and ``gc`` never import
    Beam (they start in a fraction of a second)."""
    from apache_beam.options.pipeline_options import PipelineOptions

    return PipelineOptions(list(args))


@dataclasses.dataclass(frozen=True)
class AppendOptions:
    """``pileshuffle append``: the records of ``input`` as the store's next generation.
    ``label_field``, ``balance``, ``undersample``, ``keep_unlabeled``: None takes the store's (a
    store balances every generation as it was created to); a value must be the store's."""

    store: str
    input: str
    skip_corrupt: bool = False
    allow_duplicate_inputs: bool = False
    # runner, temp location, ...
    beam: "PipelineOptions" = dataclasses.field(default_factory=_beam_options)
    label_field: str = None
    balance: str = None
    undersample: bool = None
    keep_unlabeled: bool = None
    quiet: bool = False  # no start line on stderr (as run --quiet)

    def __post_init__(self):
        if self.balance is not None:
            try:
                Policy.parse(self.balance)
            except ValueError as error:
                raise UsageError(str(error)) from None

    def balance_asked(self) -> dict:
        """The balance options given, by name (``--label_field``, ``--balance``, ``--undersample``,
        ``--keep_unlabeled``)."""
        asked = {
            "label_field": self.label_field,
            "balance": self.balance,
            "undersample": self.undersample,
            "keep_unlabeled": self.keep_unlabeled,
        }
        return {name: value for name, value in asked.items() if value is not None}

    def describe(self) -> str:
        return f"pileshuffle append --store {self.store} --input {self.input}"


@dataclasses.dataclass(frozen=True)
class MaterializeOptions:
    """``pileshuffle materialize``: a store version's live records as the shards ``run`` writes."""

    store: str
    output: str
    version: int = None  # None: the current one
    overwrite: bool = False
    max_pile_bytes: str = None  # None: the store's
    beam: "PipelineOptions" = dataclasses.field(default_factory=_beam_options)
    quiet: bool = False  # as run --quiet (materialize prints only its summary and warnings anyway)

    def __post_init__(self):
        # the store fixes the piles
        from pileshuffle.planning.parameters import check_max_pile_bytes  # (Beam's options)

        check_max_pile_bytes(self.max_pile_bytes, auto=False, allow_auto=False)

    def describe(self) -> str:
        return f"pileshuffle materialize --store {self.store} --output {self.output}"


@dataclasses.dataclass(frozen=True)
class ExpireOptions:
    """``pileshuffle expire``: drop generations (``keep_generations`` newest kept, or those
    created ``before`` a time); their files go once ``grace_seconds`` have passed."""

    store: str
    keep_generations: int = None
    before: str = None
    grace_seconds: float = DEFAULT_GRACE_SECONDS
    all: bool = False  # allow expiring every live generation

    def __post_init__(self):
        if self.keep_generations is None and self.before is None:
            raise UsageError("give --keep_generations N or --before TIME")

    def describe(self) -> str:
        return f"pileshuffle expire --store {self.store}"


@dataclasses.dataclass(frozen=True)
class GcOptions:
    """``pileshuffle gc``: delete the files no version published within ``grace_seconds`` lists."""

    store: str
    grace_seconds: float = DEFAULT_GRACE_SECONDS

    def __post_init__(self):
        check_grace_seconds(self.grace_seconds)

    def describe(self) -> str:
        return f"pileshuffle gc --store {self.store}"


def _parser(command: str, description: str) -> argparse.ArgumentParser:
    return CommandParser(prog=f"pileshuffle {command}", allow_abbrev=False, description=description)


def _add_quiet(parser: argparse.ArgumentParser):
    parser.add_argument(
        "--quiet",
        action="store_true",
        help="print no start line or progress on stderr, as run --quiet "
        "(the summary is still printed)",
    )


def _add_grace_seconds(parser: argparse.ArgumentParser):
    parser.add_argument(
        "--grace_seconds",
        type=float,
        default=DEFAULT_GRACE_SECONDS,
        metavar="SECONDS",
        help="keep files a superseded version lists for this long",
    )


def append_options(argv) -> AppendOptions:
    """``pileshuffle append``'s command line as ``AppendOptions`` (Beam's options inside)."""
    parser = _parser(
        "append",
        (
            "Add the records of --input to the pile store at --store as a new generation: pass 1 "
            "only, into the store's piles, keys from (seed, generation, file, position). Existing "
            "files are never rewritten; the new generation is live once the next manifest version "
            "is published (written last)."
        ),
    )
    parser.add_argument("--store", required=True, metavar="PREFIX", help=_STORE_HELP)
    parser.add_argument(
        "--input",
        required=True,
        metavar="PATTERNS",
        help="comma-separated file patterns of the new records",
    )
    parser.add_argument(
        "--skip_corrupt", action="store_true", help="skip corrupt TFRecord records and report them"
    )
    parser.add_argument(
        "--allow_duplicate_inputs",
        action="store_true",
        help=(
            "add files that a live generation already holds (same real file and size) again, or "
            "files whose records are exactly a live generation's (copies of its inputs: the same "
            "fingerprint), so that their records appear twice in every epoch; without it such an "
            "append is refused (the newest generation's exact inputs are still 'nothing to do': a "
            "re-run)"
        ),
    )
    parser.add_argument(
        "--label_field",
        metavar="FIELD",
        help="the store's label field (default: the store's; another is refused)",
    )
    parser.add_argument(
        "--balance",
        metavar="POLICY",
        help="the store's --balance policy (default: the store's; another is refused: "
        "each generation is balanced on its own class counts with the store's policy)",
    )
    parser.add_argument(
        "--undersample",
        action="store_true",
        default=None,
        help="as the store was created (default: the store's; refused if it was created without)",
    )
    parser.add_argument(
        "--keep_unlabeled",
        action="store_true",
        default=None,
        help="as the store was created (default: the store's; refused if it was created without)",
    )
    # refused with a reason, not as an unknown option
    parser.add_argument("--dedup", help=argparse.SUPPRESS)
    parser.add_argument("--dedup_key", help=argparse.SUPPRESS)
    _add_quiet(parser)
    args, beam_args = check_command_argv(parser, argv)
    if args.dedup not in (None, "none") or args.dedup_key:
        raise UsageError(
            "--dedup: a store deduplicates as it was created: one made with `pileshuffle run "
            "--layout store --dedup ...` keeps each distinct record of its live window once "
            "through every append (docs/stores.md); leave the option out of append"
        )
    return AppendOptions(
        args.store,
        args.input,
        args.skip_corrupt,
        args.allow_duplicate_inputs,
        _beam_options(beam_args),
        args.label_field,
        args.balance,
        args.undersample,
        args.keep_unlabeled,
        args.quiet,
    )


def materialize_options(argv) -> MaterializeOptions:
    """``pileshuffle materialize``'s command line as ``MaterializeOptions``."""
    parser = _parser(
        "materialize",
        (
            "The second pass over a pile store: write its live records as the shards and manifest "
            "`pileshuffle run` writes (byte-identical to `run` for the same inputs, seed and "
            "piles)."
        ),
    )
    parser.add_argument("--store", required=True, metavar="PREFIX", help=_STORE_HELP)
    parser.add_argument(
        "--output", required=True, metavar="PREFIX", help="prefix of the shards to write"
    )
    parser.add_argument(
        "--version",
        type=int,
        metavar="N",
        help="the manifest version to read (default: the current one)",
    )
    parser.add_argument(
        "--overwrite", action="store_true", help="replace an existing output with this prefix"
    )
    parser.add_argument(
        "--max_pile_bytes",
        metavar="SIZE",
        help="load piles larger than this in sub-piles (default: the store's, or less where the "
        "workers hold less, as run's auto: same bytes, less memory)",
    )
    _add_quiet(parser)
    args, beam_args = check_command_argv(parser, argv)
    return MaterializeOptions(
        args.store,
        args.output,
        args.version,
        args.overwrite,
        args.max_pile_bytes,
        _beam_options(beam_args),
        args.quiet,
    )


def expire_options(argv) -> ExpireOptions:
    """``pileshuffle expire``'s command line as ``ExpireOptions`` (neither limit given: a usage
    error)."""
    parser = _parser(
        "expire",
        (
            "Drop whole generations from a pile store: the next manifest version without them is "
            "published first; their files are deleted once no version published within "
            "--grace_seconds lists them (readers that opened an older version finish their epoch)."
        ),
    )
    parser.add_argument("--store", required=True, metavar="PREFIX", help="the store's prefix P")
    parser.add_argument(
        "--keep_generations", type=int, metavar="N", help="keep the N newest live generations"
    )
    parser.add_argument(
        "--before",
        metavar="TIME",
        help="drop generations created before this UTC time (ISO 8601, e.g. 2026-11-01)",
    )
    _add_grace_seconds(parser)
    parser.add_argument(
        "--all",
        action="store_true",
        help="allow expiring every live generation (the store is left empty); refused without it",
    )
    args, _ = check_command_argv(parser, argv)
    if args.keep_generations is None and args.before is None:
        parser.error("give --keep_generations N or --before TIME")
    return ExpireOptions(
        args.store, args.keep_generations, args.before, args.grace_seconds, args.all
    )


def gc_options(argv) -> GcOptions:
    """``pileshuffle gc``'s command line as ``GcOptions``."""
    parser = _parser(
        "gc",
        "Delete a pile store's files that no manifest version within --grace_seconds lists, "
        "and older versions.",
    )
    parser.add_argument("--store", required=True, metavar="PREFIX", help="the store's prefix P")
    _add_grace_seconds(parser)
    args, _ = check_command_argv(parser, argv)
    return GcOptions(args.store, args.grace_seconds)
