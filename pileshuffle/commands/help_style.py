"""The one look of every command's ``--help``: a usage line, the summary, then each option with
``(required)`` or ``(default: ...)`` and its help indented below it, wrapped at 96 columns.
``options.help_text`` writes ``run``'s and ``plan``'s from their parameters; ``CommandParser``
writes the same for a command parsed by argparse. Beam-free: ``generate`` uses it too."""

import argparse
import textwrap

__all__ = ["WIDTH", "option_lines", "CommandParser"]

WIDTH = 96


def option_lines(usage: str, state: str, text: str) -> list:
    """One option's lines: ``  --name VALUE  (state)`` and its help below."""
    return [
        f"  {usage}  ({state})",
        *textwrap.wrap(text or "", width=WIDTH, initial_indent=" " * 6, subsequent_indent=" " * 6),
    ]


class CommandParser(argparse.ArgumentParser):
    """An ``argparse.ArgumentParser`` whose ``--help`` has the look above (``usage=``: its own
    usage line)."""

    def format_help(self) -> str:
        # a hidden option (help SUPPRESS) is refused with a reason, not shown
        actions = [
            a
            for a in self._actions
            if not isinstance(a, argparse._HelpAction) and a.help != argparse.SUPPRESS
        ]
        usage = self.usage or " ".join(
            [f"{self.prog}", *(_usage(a) for a in actions if a.required), "[options]"]
        )
        lines = [
            f"usage: {usage}",
            "",
            *textwrap.wrap(self.description or "", WIDTH),
            "",
            "options:",
        ]
        for action in actions:
            lines += option_lines(_usage(action), _state(action), action.help)
        lines.append("  -h, --help  show this help and exit")
        return "\n".join(lines) + "\n"


def _usage(action) -> str:
    name = action.option_strings[-1] if action.option_strings else action.dest
    if action.nargs == 0:
        return name
    value = action.metavar or (
        "{" + ",".join(map(str, action.choices)) + "}" if action.choices else action.dest.upper()
    )
    return f"{name} {value}"


def _state(action) -> str:
    if action.required:
        return "required"
    if action.nargs == 0:
        return "default: false"
    return f"default: {'none' if action.default is None else action.default}"
