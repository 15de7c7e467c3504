"""Reading a command line: ``--help`` from ``template_parameters.PARAMETERS``, and the refusals.

A command that takes pipeline options calls ``check_argv(argv)`` before anything runs:
every ``--name`` must be one of its parameters or a Beam option (any registered
``PipelineOptions`` subclass: Dataflow's, Dask's when installed), and every value of
ours must parse. Both raise ``UsageError`` (one line naming the option, exit code 2).
"""

import argparse
import difflib
import textwrap

from pileshuffle.commands.help_style import WIDTH, option_lines
from pileshuffle.errors import UsageError
from pileshuffle.planning.template_parameters import PARAMETERS

__all__ = [
    "CONCEPTS",
    "help_text",
    "wants_help",
    "check_argv",
    "check_command_argv",
    "parse_command",
]

# One concept, one option name in every command: the name, and the names people reach for
# instead. No command offers one of the latter (tests/test_messages.py walks every command's
# --help); given to a command, one is answered with the name ("did you mean --label_field?").
CONCEPTS = {
    "input": ("inputs", "input_pattern", "input_patterns", "input_glob", "in"),
    "output": ("out", "output_prefix", "prefix", "output_path"),
    "store": ("store_prefix", "store_path"),
    "format": ("input_format", "record_format"),
    "label_field": ("label", "label_key", "label_column", "label_name", "class_field", "class_key"),
    "dedup_key": ("dedup_field", "dedupe_key", "dedup_column", "unique_key"),
    "num_piles": ("piles", "num_shards", "shards", "num_buckets"),
    "seed": ("random_seed", "shuffle_seed"),
    "skip_corrupt": ("skip_errors", "skip_bad_records", "ignore_corrupt", "ignore_errors"),
    "overwrite": ("force", "replace"),
    "quiet": ("silent", "no_progress"),
    "batch_size": ("batch",),
}
_NAME_FOR = {synonym: name for name, synonyms in CONCEPTS.items() for synonym in synonyms}

# -- the command line -------------------------------------------------------------------------

_BEAM_OPTIONS_NOTE = """\
Beam's own options are accepted too: --runner (default: the local FnApiRunner, one thread
per core), --temp_location, --direct_num_workers, Dataflow's (--project, --region,
--worker_machine_type, --max_num_workers, ...) and Dask's (--dask_client_address, ...). See
https://beam.apache.org/releases/pydoc/current/apache_beam.options.pipeline_options.html,
docs/dataflow.md and docs/dask.md."""


def help_text(prog: str, summary: str, parameters=PARAMETERS) -> str:
    """``--help``: every parameter with its default and the help text metadata.json carries."""
    lines = [
        f"usage: {prog} --input PATTERNS --output PREFIX [options] [Beam options]",
        "",
        *textwrap.wrap(summary, WIDTH),
        "",
        "options:",
    ]
    for p in parameters:
        lines += option_lines(
            p.usage,
            "required"
            if not p.optional
            else "default: false"
            if p.flag
            else f"default: {p.default or 'none'}",
            p.help,
        )
    lines += ["  -h, --help  show this help and exit", "", _BEAM_OPTIONS_NOTE]
    return "\n".join(lines)


def wants_help(argv) -> bool:
    """Whether ``argv`` asks for ``--help`` (before a ``--``)."""
    return any(a in ("-h", "--help") for a in _before_separator(argv))


def _before_separator(argv):
    argv = list(argv)
    return argv[: argv.index("--")] if "--" in argv else argv


def _beam_parser() -> argparse.ArgumentParser:
    """A parser of every registered ``PipelineOptions`` subclass's options, as Beam declares
    them (types, choices), that raises UsageError in one line instead of printing Beam's
    whole usage."""
    from apache_beam.options.pipeline_options import PipelineOptions, _BeamArgumentParser

    class QuietBeamParser(_BeamArgumentParser):
        def error(self, message):
            raise UsageError(message.removeprefix("argument "))

    parser = QuietBeamParser(allow_abbrev=False, add_help=False)
    for cls in {str(c): c for c in PipelineOptions.__subclasses__()}.values():
        try:
            cls._add_argparse_args(parser)
        except argparse.ArgumentError:  # the same option in two classes
            pass
    return parser


def _beam_option_names() -> set:
    """Every option string of every registered ``PipelineOptions`` subclass."""
    return {option for option in _beam_parser()._option_string_actions if option.startswith("--")}


# Beam options the local runner reads whose range Beam never checks: name -> (minimum, why)
_BEAM_MINIMUMS = {
    # -1 failed deep in the FnApiRunner (IndexError)
    "direct_num_workers": (0, "0 = one worker per core"),
}


def _check_beam_values(argv):
    """Refuse a value of Beam's own options in ``argv`` that Beam's parser refuses (type,
    choices: ``--direct_running_mode``), a ``--runner`` Beam cannot create, or a value out
    of ``_BEAM_MINIMUMS``' range, in one line naming the option (UsageError), before
    anything runs."""
    from pileshuffle.planning.runners import runner_problem

    argv = _before_separator(argv)
    values, rest = _beam_parser().parse_known_args(argv)
    stray = [a for a in rest if not a.startswith("-")]
    # dropped silently otherwise: an unquoted pattern the shell expanded, a value without its option
    if stray:
        raise UsageError(
            f"{stray[0]!r} is not an option or an option's value (options are --name=value; "
            "quote a pattern so that the shell does not expand it)"
        )
    problem = runner_problem(values.runner)
    if problem:
        raise UsageError(problem)
    given = set(_option_names(argv))
    for name, (minimum, meaning) in _BEAM_MINIMUMS.items():
        value = getattr(values, name, None)
        if name in given and value is not None and value < minimum:
            raise UsageError(f"--{name}: must be at least {minimum} ({meaning}), not {value}")


def _register_optional_runners():
    """Import the options of runners that live outside Beam's core module (Dask)."""
    try:
        import apache_beam.runners.dask.dask_runner  # noqa: F401  (registers DaskOptions)
    except Exception:  # dask not installed
        pass


def check_argv(argv, parameters=PARAMETERS):
    """Refuse unknown options and bad values of ``parameters`` in ``argv`` (UsageError).
    Returns the parsed values of ``parameters`` (an ``argparse.Namespace``)."""
    _refuse_unknown(_option_names(argv), [p.name for p in parameters])
    _refuse_repeated(_option_names(argv), [p.name for p in parameters])
    from pileshuffle.planning.parameters import check_values  # Beam's options: a pipeline command

    values = _parse_own(argv, parameters)
    check_values(values, parameters)
    _check_required(values, parameters)
    _check_beam_values(argv)
    return values


def _check_required(values, parameters=PARAMETERS):
    """Refuse a missing parameter that has no default, in the form of every value error."""
    for p in parameters:
        if not p.optional and not getattr(values, p.name, None):
            raise UsageError(
                f"--{p.name}: is required ({p.label.lower()}, e.g. --{p.name}={p.example})"
            )


def check_command_argv(parser: argparse.ArgumentParser, argv):
    """Parse a command's own options with ``parser`` and refuse any other option that
    Beam does not know (UsageError with a suggestion), first: a misspelt required option
    is named as a misspelling, not as a missing option. Returns ``(args, beam_args)``."""
    own = _long_options(parser)
    template_only = {f"--{p.name}" for p in PARAMETERS} - {
        f"--{o}" for o in own
    }  # run's options mean nothing here
    _refuse_unknown(_option_names(argv), own, template_only, prog=parser.prog)
    _refuse_repeated(_option_names(argv), own)
    args, rest = parser.parse_known_args(argv)
    _check_beam_values(rest)
    return args, rest


def parse_command(parser: argparse.ArgumentParser, argv):
    """``parser.parse_args(argv)`` for a command that takes no Beam options, with any other
    option refused first in one line with the closest name (argparse reports a misspelt
    required option as a missing one, and an unknown one with no hint)."""
    own = _long_options(parser)
    unknown = [name for name in _option_names(argv) if name not in own]
    if unknown:
        parser.exit(
            2,
            f"{parser.prog}: error: unknown option --{unknown[0]}"
            f"{_did_you_mean(unknown[0], own, set(), parser.prog)}\n",
        )
    return parser.parse_args(argv)


def _long_options(parser: argparse.ArgumentParser) -> list:
    """The names of ``parser``'s ``--name`` options."""
    return [
        a[2:] for action in parser._actions for a in action.option_strings if a.startswith("--")
    ]


def _refuse_repeated(names, own):
    """Raise UsageError for the first of our ``own`` options given twice (argparse keeps the last
    silently: `--seed 1 ... --seed 2` would shuffle with 2). Beam's may repeat
    (``--experiments``)."""
    mine = [name for name in names if name in set(own)]
    twice = next((name for name in mine if mine.count(name) > 1), None)
    if twice:
        raise UsageError(f"--{twice}: given {mine.count(twice)} times; give it once")


def _option_names(argv) -> list:
    """The names of the ``--name`` / ``--name=value`` options in ``argv`` (before a ``--``)."""
    return [
        a[2:].split("=", 1)[0] for a in _before_separator(argv) if a.startswith("--") and len(a) > 2
    ]


def _refuse_unknown(names, own, excluded=frozenset(), prog=None):
    """Raise UsageError for the first of ``names`` that is neither one of ``own`` nor an
    option of Beam or an installed runner (minus ``excluded``); it suggests the closest
    name, ours first. Beam's options are listed only when a name is not ours."""
    known = {f"--{name}" for name in own}
    unknown = [n for n in names if f"--{n}" not in known]
    for register in (lambda: None, _register_optional_runners):
        if not unknown:
            return
        register()
        known |= _beam_option_names() - excluded
        unknown = [n for n in unknown if f"--{n}" not in known]
    if unknown:
        where = f"{prog}: " if prog else ""
        raise UsageError(
            f"{where}unknown option --{unknown[0]}{_did_you_mean(unknown[0], own, known, prog)}"
        )


def _did_you_mean(name: str, own, known, prog=None) -> str:
    if _NAME_FOR.get(name) in set(own):  # another name of one of ours (CONCEPTS)
        return f" (did you mean --{_NAME_FOR[name]}?)"
    close = difflib.get_close_matches(
        name, list(own), n=1, cutoff=0.6
    ) or difflib.get_close_matches(name, [k[2:] for k in known], n=1, cutoff=0.75)
    if close:
        return f" (did you mean --{close[0]}?)"
    return f" (see {prog} --help)" if prog else " (see --help)"


def _parse_own(argv, parameters):
    """Our parameters' raw values, every other option ignored (no choices: check_values
    reports those in one line)."""
    parser = _QuietParser(allow_abbrev=False, add_help=False)
    for p in parameters:
        if p.flag:
            parser.add_argument(f"--{p.name}", nargs="?", const="true", default="false")
        else:
            parser.add_argument(f"--{p.name}", default=p.default)
    values, _ = parser.parse_known_args(_before_separator(argv))
    return values


class _QuietParser(argparse.ArgumentParser):
    """Raises UsageError (e.g. "argument --seed: expected one argument") instead of printing
    usage."""

    def error(self, message):
        raise UsageError(message.removeprefix("argument "))
