"""``pileshuffle quality``: how uniform a finished run's order is, shown and measured.

A finished run is shard output (``PREFIX-manifest.json``) or a pile store
(``PREFIX-store/``, measured in its written order: the order ``materialize`` writes).

Writes ``DIR/quality.json``, ``DIR/quality.png`` (and ``DIR/training.png`` with
``--compare``) and prints a one-screen summary. Needs no index field: output records are
located in the input by their fingerprint hash, on a hash-value sample of about
``--sample`` records (memory bounded on any input size). ``--label_field`` and ``--compare``
hold one label / a few positions per record (O(N) memory). A ``--balance`` output is
measured against its input with each record repeated by its copies; with a label the
report shows each class's share per batch before and after. matplotlib is imported only to
draw the figures; a run never imports it.

With ``--mixture PREFIX=WEIGHT,...`` it measures a ``loader.Mixture`` of finished outputs
instead: each dataset's share per batch and per sliding window against its weight, beside
independent coin flips (``quality.mixture``); it writes ``DIR/mixture.json``.
"""

import argparse
import io
import json
import os
import sys
import tempfile

from pileshuffle.commands.help_style import CommandParser
from pileshuffle.errors import InputError
from pileshuffle.io import storage
from pileshuffle.quality import MIN_SAMPLE


def _at_least(minimum: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a whole number, not {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum:,}, not {value:,}")
        return value

    return parse


USAGE = (
    "pileshuffle quality (--input PATTERNS --output PREFIX | --mixture PREFIX=WEIGHT,...) "
    "[--report DIR] [--label_field FIELD | --label_bytes START:END] [--compare] [--sample N] "
    "[--batch_size N]"
)


def parse(argv):
    """The command's options (unknown options and bad values: a usage error, exit code 2)."""
    from pileshuffle.commands.options import parse_command

    parser = CommandParser(
        prog="pileshuffle quality",
        usage=USAGE,
        allow_abbrev=False,
        description="Measure and draw how uniform a finished run's order is.",
    )
    parser.add_argument("--input", metavar="PATTERNS", help="the run's --input patterns")
    parser.add_argument("--output", metavar="PREFIX", help="the run's --output prefix")
    parser.add_argument(
        "--report",
        metavar="DIR",
        help="directory for quality.json, quality.png, training.png (without it: the "
        "statistics are printed only)",
    )
    which = parser.add_mutually_exclusive_group()
    which.add_argument(
        "--label_field",
        metavar="FIELD",
        help="label field, as run's --label_field: a Parquet column, a JSON key, a "
        "tf.train.Example feature (TFRecord: int64 or bytes) or a tar member's "
        "extension (cls)",
    )
    which.add_argument(
        "--label_bytes",
        metavar="START:END",
        help="label = payload bytes START:END (TFRecord, JSONL)",
    )
    parser.add_argument(
        "--compare",
        action="store_true",
        help="also measure no shuffle, file-order shuffle, a shuffle buffer and the loader's "
        "epochs",
    )
    parser.add_argument(
        "--sample",
        type=_at_least(MIN_SAMPLE),
        default=100_000,
        metavar="N",
        help=f"records to locate by hash (default 100000, at least {MIN_SAMPLE})",
    )
    parser.add_argument(
        "--batch_size",
        type=_at_least(1),
        default=256,
        metavar="N",
        help="batch size for label balance, class shares, re-meeting and a mixture's windows",
    )
    mixing = parser.add_argument_group("a Mixture instead of a run (pileshuffle.loader.Mixture)")
    mixing.add_argument(
        "--mixture",
        metavar="PREFIX=WEIGHT,...",
        help="finished outputs and their weights: PREFIX=WEIGHT,PREFIX=WEIGHT",
    )
    mixing.add_argument(
        "--stop",
        choices=("first", "restart"),
        default="first",
        help="the Mixture's stop (default first)",
    )
    mixing.add_argument(
        "--records_per_epoch",
        type=_at_least(1),
        metavar="N",
        help="the Mixture's records_per_epoch",
    )
    mixing.add_argument(
        "--seed", type=_at_least(0), default=0, metavar="N", help="the Mixture's seed (default 0)"
    )
    args = parse_command(parser, argv)
    if not args.mixture and not (args.input and args.output):
        parser.error(
            "give --input and --output (a finished run), or --mixture (outputs and weights)"
        )
    if args.mixture and (
        args.input or args.output or args.label_field or args.label_bytes or args.compare
    ):
        parser.error(
            "--mixture measures the mixture alone: leave out --input, --output, --label_field "
            "and --compare"
        )
    return args


def _figure(draw):
    """The PNG bytes ``draw(file)`` writes."""
    buffer = io.BytesIO()
    draw(buffer)
    return buffer.getvalue()


def report_problem(directory: str):
    """Why the report cannot be written to ``directory`` (checked before any work), or None:
    it, or a folder it would be made in, is a file, or nothing can be created there; on an
    object store, its bucket does not answer."""
    if storage.is_remote(directory):
        try:
            storage.exists(directory)
        except InputError as error:
            return error.problem
        return None
    path = os.path.abspath(directory)
    existing = path
    while not os.path.exists(existing) and os.path.dirname(existing) != existing:
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        return (
            f"{existing} is a file, not a folder"
            if existing == path
            else f"{existing} is a file, not a folder to make it in"
        )
    try:
        with tempfile.TemporaryFile(dir=existing, prefix=".probe-"):
            pass
    except OSError as error:
        return f"cannot write in {existing}: {error.strerror or error}"
    return None


def write_report(report, directory: str, figures: bool = True) -> list:
    """Write the JSON, the policies table (with ``--compare``) and the figures, each whole or
    not at all (``storage.write_whole``: a local folder or gs://); returns the paths written."""
    from pileshuffle.quality.text import policies_table

    files = {"quality.json": lambda: json.dumps(report.summary, indent=1).encode()}
    if "policies" in report.summary:
        files["policies.md"] = lambda: (
            policies_table(report.summary["policies"], markdown=True) + "\n"
        ).encode()
    if figures:
        from pileshuffle.quality import render

        files["quality.png"] = lambda: _figure(lambda out: render.quality_figure(report, out))
        # not on fewer records than a batch
        if len(report.rows) > 1 and any(row.curve["steps"] for row in report.rows):
            files["training.png"] = lambda: _figure(lambda out: render.training_figure(report, out))
    written = []
    for name, contents in files.items():
        written.append(storage.join(directory, name))
        storage.write_whole(written[-1], contents())
    return written


def finished_output(prefix: str):
    """``(manifest, output)`` of the finished output at ``prefix``: shards (their paths in
    order) or else a pile store (opened by the loader, which names what is missing)."""

    from pileshuffle.engine.output_files import read_manifest
    from pileshuffle.names import manifest_path

    if storage.exists(manifest_path(prefix)):
        manifest = read_manifest(prefix)
        return manifest, [shard["path"] for shard in manifest["shards"]]
    from pileshuffle.loader.outputs import open_output
    from pileshuffle.loader.piles import read_json, resolve

    store = open_output(prefix)
    return read_json(resolve(prefix)[0], store.location), store


def main(argv=None) -> int:
    """``pileshuffle quality``: locate, measure, print the summary, write the report."""
    from pileshuffle import interrupt

    args = parse(argv)
    interrupt.describe(
        f"no report was written to {args.report}; run it again to measure"
        if args.report
        else "nothing was written; run it again to measure",
        f"it had written its report to {args.report}",
    )
    try:
        from pileshuffle.quality.report import measure
        from pileshuffle.quality.text import text_summary
    except ImportError as error:
        print(
            "pileshuffle quality: error: needs the report extra, "
            f"pip install 'pileshuffle[report]' ({error})",
            file=sys.stderr,
        )
        return 2
    from pileshuffle.errors import PileshuffleError

    problem = report_problem(args.report) if args.report else None
    if problem:
        print(f"pileshuffle quality: error: --report {args.report}: {problem}", file=sys.stderr)
        return 2
    if args.mixture:
        return _mixture_main(args)
    try:
        report = _measured_run(args, measure)
    except (PileshuffleError, ValueError) as error:
        print(f"pileshuffle quality: error: {error}", file=sys.stderr)
        return 2
    print(text_summary(report))
    if args.report:
        _publish_report(report, args.report)
    return 0


__all__ = ["USAGE", "finished_output", "main", "parse", "report_problem", "write_report"]


def _mixture_main(args) -> int:
    """``pileshuffle quality --mixture``: the mixture's shares per window, printed and written."""
    from pileshuffle import interrupt
    from pileshuffle.errors import PileshuffleError
    from pileshuffle.loader import Mixture
    from pileshuffle.quality.mixture import parse_mixture, text_lines, window_shares

    try:
        prefixes, weights = parse_mixture(args.mixture)
        mixture = Mixture(
            prefixes,
            weights,
            seed=args.seed,
            stop=args.stop,
            records_per_epoch=args.records_per_epoch,
        )
        section = window_shares(mixture, args.batch_size)
    except (PileshuffleError, ValueError) as error:
        print(f"pileshuffle quality: error: {error}", file=sys.stderr)
        return 2
    print("\n".join(text_lines(section)))
    if not args.report:
        return 0
    path = storage.join(args.report, "mixture.json")
    with interrupt.publishing():  # written whole: Ctrl-C waits for it
        storage.write_whole(path, json.dumps({"mixture": section}, indent=1).encode())
    print(f"report written to {args.report}: mixture.json")
    return 0


def _measured_run(args, measure):
    """The ``quality.report.Report`` (``measure``) of the finished run at ``--output``, located in
    its ``--input`` (which the run read in the output's format) with the label asked for."""
    from pileshuffle.engine.inputs import check_format_fits, match_inputs
    from pileshuffle.formats import get_format
    from pileshuffle.quality.label import Label

    prefix = args.output.rstrip("/") if "://" not in args.output else args.output
    label = (
        Label.parse_bytes(args.label_bytes)
        if args.label_bytes
        else Label(field=args.label_field)
        if args.label_field
        else None
    )
    manifest, output = finished_output(prefix)
    sources = match_inputs(args.input)
    check_format_fits(sources, manifest["format"], prefix)  # the run read its input in that format
    return measure(
        get_format(manifest["format"]),
        {s.path: s.size for s in sources},
        output,
        manifest,
        args.sample,
        label,
        args.batch_size,
        args.compare,
    )


def _publish_report(report, directory: str) -> None:
    """Write the report to ``directory`` as one set (``write_report``; Ctrl-C waits for it), the
    numbers without the figures where matplotlib is missing, and say which files it wrote."""
    from pileshuffle import interrupt

    with interrupt.publishing():  # the report's files are written as one set: Ctrl-C waits for them
        try:
            written = write_report(report, directory)
        except RuntimeError as error:  # no matplotlib: the numbers are still written
            written = write_report(report, directory, figures=False)
            print(f"pileshuffle quality: {error}; figures not drawn", file=sys.stderr)
    print(f"report written to {directory}: {', '.join(os.path.basename(p) for p in written)}")
