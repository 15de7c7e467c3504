"""``pileshuffle metadata``: the Dataflow flex template's metadata.json, made from the one list of
the template's parameters (``template_parameters.PARAMETERS``); templates/metadata.json is its
output."""

import json

from pileshuffle.commands.help_style import CommandParser
from pileshuffle.commands.options import parse_command
from pileshuffle.planning.template_parameters import PARAMETERS

__all__ = ["template_metadata", "main"]


def template_metadata() -> dict:
    """The flex template's metadata.json, from ``PARAMETERS``."""
    parameters = []
    for p in PARAMETERS:
        entry = {
            "name": p.name,
            "label": p.label,
            "helpText": f"{p.help} Example: {p.example}",
            "isOptional": p.optional,
            "paramType": "BOOLEAN" if p.flag else p.param_type,
        }
        if p.choices:
            entry["regexes"] = ["^(" + "|".join(p.choices) + ")$"]
        # the template runs on Dataflow: its paths are on Cloud Storage
        elif p.param_type.startswith("GCS_"):
            entry["regexes"] = [p.regex.replace("^", "^gs://", 1)]
        elif p.regex:
            entry["regexes"] = [p.regex]
        parameters.append(entry)
    return {
        "name": "pileshuffle",
        "description": "Globally shuffle TFRecord, Parquet or JSONL files with a seeded 2-pass "
        "pile shuffle (uniform random order, deterministic for a seed).",
        "parameters": parameters,
    }


def main(argv=None):
    """``pileshuffle metadata``: print the Dataflow flex template's metadata.json."""
    parse_command(
        CommandParser(
            prog="pileshuffle metadata",
            allow_abbrev=False,
            description="Print the Dataflow flex template's metadata.json.",
        ),
        argv or [],
    )
    print(json.dumps(template_metadata(), indent=2))
    return 0
