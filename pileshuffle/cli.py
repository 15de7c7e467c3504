"""``pileshuffle COMMAND [options]``: one entry in ``COMMANDS`` per command.

A command is a module with ``main(argv) -> exit code`` and a one-line description. A
command whose options are pipeline options checks them with
``pileshuffle.commands.options.check_argv`` (unknown options, bad values: exit code 2 before
anything runs) and answers ``--help`` from its parameters (``options.help_text``).
"""

import dataclasses
import importlib
import importlib.util
import logging
import multiprocessing
import os
import sys

__all__ = ["Command", "COMMANDS", "main", "entry"]

CLOSED_STDOUT_EXIT_CODE = 141  # 128 + SIGPIPE: what a shell reports for `yes | head`


@dataclasses.dataclass(frozen=True)
class Command:
    """One command: ``module``'s ``function(argv) -> exit code`` and the line ``pileshuffle`` shows
    for it. The module is imported only when the command runs."""

    module: str
    description: str
    function: str = "main"

    def main(self, argv, name: str) -> int:
        """Run the command on ``argv``; a missing ``pipeline`` extra is one line and exit code 2."""
        from pileshuffle import interrupt
        from pileshuffle.engine.tuning import importing_without_gc, keep_freed_memory

        interrupt.describe("it had not started: nothing was written")
        keep_freed_memory()  # before Beam's import starts threads
        try:
            with importing_without_gc():
                module = importlib.import_module(self.module)
            interrupt.describe(None)  # from here the command says what Ctrl-C would leave
            return getattr(module, self.function)(argv)
        except ModuleNotFoundError as missing:  # `pip install pileshuffle` is the reader alone
            lacking = _uninstalled_pipeline_module(missing)
            if lacking is None:
                raise
            print(
                f"pileshuffle {name}: needs {lacking}, which this install lacks: "
                'pip install "pileshuffle[pipeline]"',
                file=sys.stderr,
            )
            return 2


# The top-level modules of setup.py's `pipeline` extra, which the commands import (some only
# once they run, like `quality`) and a reader-only install lacks; by the names users know.
_PIPELINE_MODULES = {"apache_beam": "Apache Beam", "tqdm": "tqdm"}


def _uninstalled_pipeline_module(missing: ModuleNotFoundError):
    """The name of the ``pipeline`` extra's package whose absence raised ``missing``, or None
    when ``missing`` is about another module or one inside an installed package (a real bug)."""
    top = (missing.name or "").split(".")[0]
    if top in _PIPELINE_MODULES and importlib.util.find_spec(top) is None:
        return _PIPELINE_MODULES[top]
    return None


COMMANDS = {  # name -> Command: what `pileshuffle NAME` runs, in the order the usage lists them
    "run": Command(
        "pileshuffle.pipeline",
        "shuffle: the template's pipeline (same options as python -m pileshuffle.pipeline)",
    ),
    "plan": Command(
        "pileshuffle.commands.plan",
        "show what a run would do (files, bytes, piles, memory, space) without running it",
    ),
    "verify": Command(
        "pileshuffle.commands.verify",
        "re-read input and output and prove nothing was lost, duplicated or corrupted",
    ),
    "info": Command(
        "pileshuffle.commands.info",
        "say what a finished output or a pile store holds, from its manifest",
    ),
    "append": Command(
        "pileshuffle.commands.append",
        "add new input files to a pile store (run --layout store) as a new generation",
        "append_main",
    ),
    "expire": Command(
        "pileshuffle.commands.expire",
        "drop a pile store's oldest generations (--keep_generations N, --before TIME)",
        "expire_main",
    ),
    "gc": Command(
        "pileshuffle.commands.expire",
        "delete a pile store's files that no recent manifest version lists",
        "gc_main",
    ),
    "materialize": Command(
        "pileshuffle.commands.materialize",
        "write a pile store's records as the shuffled shards `run` writes",
        "materialize_main",
    ),
    "generate": Command(
        "pileshuffle.commands.sample",
        "write sample data whose records carry their index (for trying things out)",
    ),
    "metadata": Command(
        "pileshuffle.commands.metadata", "print the Dataflow flex template's metadata.json"
    ),
    "quality": Command(
        "pileshuffle.commands.quality",
        "measure and draw how uniform a finished run's order is (and the shuffles people use "
        "instead)",
    ),
}


def _usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"  {name:<{width}}  {command.description}" for name, command in COMMANDS.items()]
    return "\n".join(
        [
            "usage: pileshuffle COMMAND [options]",
            "",
            "commands:",
            *lines,
            "",
            "'pileshuffle COMMAND --help' shows a command's options; 'pileshuffle --version' the "
            "version.",
        ]
    )


def main(argv=None):
    """``pileshuffle COMMAND [options]`` (``argv`` without the program name): the command's exit
    code; no command, or an unknown one, prints the usage (exit code 2; 0 for ``--help``)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    # before Beam's import: a count that would take the machine
    if argv and argv[0] in ("run", "plan"):
        from pileshuffle.errors import UsageError
        from pileshuffle.planning.pile_bound import check_num_piles_argv

        try:
            check_num_piles_argv(argv[1:])
        except UsageError as error:
            print(f"pileshuffle: error: {error}", file=sys.stderr)
            return 2
    if argv and argv[0] in COMMANDS:
        return COMMANDS[argv[0]].main(argv[1:], argv[0])
    if argv == ["--version"]:
        from pileshuffle.version import __version__

        print(f"pileshuffle {__version__}")
        return 0
    asked = bool(argv) and argv[0] in ("-h", "--help")
    if argv and not asked:
        print(f"pileshuffle: error: unknown command {argv[0]!r}", file=sys.stderr)
    print(_usage(), file=sys.stdout if asked else sys.stderr)
    return 0 if asked else 2


def entry():
    """The ``pileshuffle`` command: ``main``, then, when it returned and started no child
    process that is still alive, exit without tearing the interpreter down. Every output
    is closed and renamed by then; the teardown (freeing Beam's and Arrow's objects one by
    one, joining their thread pools) took 0.4 s of a 6 s run. A local command imports Beam
    without the connectors it cannot use (``tuning.without_remote_connectors``). An exception
    exits normally; Ctrl-C exits with one line and code 130 (``pileshuffle.interrupt``); a
    closed stdout quietly, with the code a shell reports for a process SIGPIPE ended (141)."""
    from pileshuffle import interrupt
    from pileshuffle.engine.tuning import without_remote_connectors

    without_remote_connectors(sys.argv[1:])
    named = sys.argv[1] if len(sys.argv) > 1 and sys.argv[1] in COMMANDS else None
    try:
        with interrupt.handling(named):
            code = main()
        logging.shutdown()
        sys.stdout.flush()
    except BrokenPipeError:
        # the reader of stdout is gone (`pileshuffle plan ... | head`): end quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = CLOSED_STDOUT_EXIT_CODE
    sys.stderr.flush()
    if multiprocessing.active_children():
        sys.exit(code)
    os._exit(code)


if __name__ == "__main__":
    entry()
