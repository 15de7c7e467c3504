"""``pileshuffle verify``: re-read a finished output (shards or a pile store), and its input when
given, and prove nothing was lost, duplicated or corrupted. Exit code 0: every check passed;
1: problems, each on a line; 2: a usage error: nothing to verify at ``--output`` (or an unfinished
run, named with the command that finishes it), an ``--input`` pattern that names no file."""

import sys

from pileshuffle import interrupt, names
from pileshuffle.commands.help_style import CommandParser
from pileshuffle.commands.options import parse_command
from pileshuffle.commands.report import reporting_errors
from pileshuffle.engine.dedup import Dedup
from pileshuffle.engine.inputs import select_inputs
from pileshuffle.formats import FORMATS
from pileshuffle.io import storage
from pileshuffle.io.unfinished import unfinished_run
from pileshuffle.names import manifest_path, shard_pattern
from pileshuffle.store import layout
from pileshuffle.store.layout import clean_prefix, is_store, store_prefix
from pileshuffle.store.read import check_store, damaged_generations
from pileshuffle.verify.checks import ShardVerifier, verify_shards
from pileshuffle.verify.shard_names import matching_files

__all__ = ["verify", "main"]


def verify(input_glob, output_prefix, format=None) -> list:
    """Problems found with the output under ``output_prefix`` (and, given ``input_glob``,
    against its input); an empty list means every check passed."""
    output_prefix = output_prefix.rstrip("/") if "://" not in output_prefix else output_prefix
    if _is_store(output_prefix):
        return check_store(output_prefix, input_glob=input_glob)[0]
    return verify_shards(input_glob, output_prefix, format)


def _is_store(prefix: str) -> bool:
    """A pile store (``{P}-store/``) and no shard output at ``prefix``."""
    prefix = clean_prefix(prefix)
    return not storage.exists(manifest_path(prefix)) and is_store(store_prefix(prefix))


def _anything_at(prefix: str) -> bool:
    """A manifest or any shard-named file at ``prefix`` (a store is checked before): what a
    run, finished or not, leaves; with neither, ``--output`` names no output (a usage error,
    not a failed check)."""
    return storage.exists(manifest_path(prefix)) or bool(matching_files(shard_pattern(prefix)))


def main(argv=None):
    """``pileshuffle verify``; an error that stops the checks (an unreadable manifest) is one
    line, exit code 2."""
    return reporting_errors(lambda: _verify_command(argv))


def _verify_command(argv):
    """Verify the output ``argv`` names and print the report: exit code 0 (every check
    passed), 1 (problems) or 2 (nothing to verify there)."""
    args = parse_command(_verify_parser(), argv)
    interrupt.describe(
        f"{args.output} was not checked to the end; verify changes nothing, "
        "so run it again to check"
    )
    prefix = args.output.rstrip("/") if "://" not in args.output else args.output
    if args.input:  # a pattern that names no input file is a usage error, as in run (exit code 2)
        select_inputs(args.input, prefix)
    if _is_store(args.output):
        return _verify_store_main(args.output, args.input)
    unfinished = unfinished_run(prefix)
    if unfinished or not _anything_at(prefix):
        nothing = (
            f"nothing to verify there (no {manifest_path(prefix)}, no shards, "
            f"no pile store {prefix}-store/)"
        )
        print(
            f"pileshuffle verify: error: --output {args.output}: {unfinished or nothing}",
            file=sys.stderr,
        )
        return 2
    return _verify_shards_main(args.output, prefix, args.input, args.format)


def _verify_shards_main(output: str, prefix: str, input_glob, format) -> int:
    """``pileshuffle verify --output P`` where P (``prefix``, cleaned) is a shard output: print
    each problem, or what every check proved, and return the exit code (1 or 0)."""
    verifier = ShardVerifier(input_glob, prefix, format)
    problems = verifier.run()
    for problem in problems:
        print(f"pileshuffle verify: FAILED: {problem}", file=sys.stderr)
    if problems:
        print(f"pileshuffle verify: {len(problems):,} problem(s) with {output}", file=sys.stderr)
        return 1
    fp = verifier.output_fp
    checked = (
        _input_checked(verifier.manifest or {}) if input_glob else "input not re-read (no --input)"
    )
    print(
        f"pileshuffle verify: OK: {fp.records:,} records in {verifier.num_shards:,} shard(s) under "
        f"{output}; every shard reads back whole and matches the manifest; {checked} "
        f"(hash sum {fp.hash_sum:016x}, xor {fp.hash_xor:016x})"
    )
    return 0


def _verify_parser() -> CommandParser:
    """``pileshuffle verify``'s options: ``--output`` (required), ``--input``, ``--format``, and
    run's ``--skip_corrupt`` and ``--quiet``, taken so that a run's options can be given again."""
    parser = CommandParser(
        prog="pileshuffle verify",
        allow_abbrev=False,
        description="Re-read input and output of a finished run: counts, fingerprints, "
        "shard integrity, manifest.",
    )
    parser.add_argument(
        "--input",
        metavar="PATTERNS",
        help="the run's --input patterns (omit to check the output and manifest only)",
    )
    parser.add_argument(
        "--output", required=True, metavar="PREFIX", help="the run's --output prefix"
    )
    parser.add_argument("--format", choices=sorted(FORMATS), help="default: the manifest's")
    parser.add_argument(
        "--skip_corrupt",
        action="store_true",
        help="taken as run takes it, so that a run's options can be given again; verify reads the "
        "input as the run did, skipping corrupt records only if its manifest says it did",
    )
    parser.add_argument(
        "--quiet", action="store_true", help="as run --quiet: verify prints only its report anyway"
    )
    return parser


def _input_checked(manifest: dict) -> str:
    """What re-reading the input proved, in the terms the run compared records in: the whole
    record's content, or with ``--dedup_key`` the key's value."""
    dedup = manifest.get("dedup")
    if not dedup:
        return "input and output fingerprints match"
    field = Dedup.from_options(manifest.get("options")).field
    counts = (
        f"{dedup['records_read']:,} read, {dedup['records_kept']:,} distinct, "
        f"{dedup['records_dropped']:,} duplicates left out"
    )
    if field is None:
        return (
            f"the output is exactly the input's distinct records, each once: {counts} "
            "(records compared by a 64-bit hash of their content)"
        )
    return (
        f"the output is exactly the first record of each distinct {field!r} value in the input: "
        f"{counts} (records compared by a 64-bit hash of their {field!r} value)"
    )


def _verify_store_main(prefix: str, input_glob: str = None) -> int:
    """``pileshuffle verify --output P`` where P is a store: print and exit as verify does."""
    prefix = layout.store_prefix(prefix)
    problems, manifest = check_store(prefix, input_glob=input_glob)
    for problem in problems:
        print(f"pileshuffle verify: FAILED: {problem}", file=sys.stderr)
    if problems:
        damaged = damaged_generations(problems)
        where = (
            f"; damaged generation(s): {', '.join(map(str, damaged))} "
            f"of version {manifest['version']}"
            if damaged and manifest
            else ""
        )
        print(
            f"pileshuffle verify: {len(problems)} problem(s) with the store "
            f"{names.store_dir(prefix)}{where}",
            file=sys.stderr,
        )
        return 1
    files = sum(len(g["files"]) for g in manifest["generations"])
    print(
        f"pileshuffle verify: OK: store {names.store_dir(prefix)} version {manifest['version']}: "
        f"{manifest['totals']['records']:,} records in {len(manifest['generations'])} "
        f"generation(s), {files} file(s); every file reads back whole and matches the manifest "
        "(counts, piles, fingerprints)"
        + _visible_text(manifest)
        + ("; the input holds exactly the live generations' records" if input_glob else "")
    )
    return 0


def _visible_text(manifest: dict) -> str:
    """A dedup store: the records readers get, and that its copies files were checked."""
    if "distinct" not in manifest["totals"]:
        return ""
    options = manifest["options"]
    each = "record" if options["dedup"] == "exact" else f"{options['dedup_key']!r} value"
    return (
        f"; {manifest['totals']['distinct']:,} records visible (one per distinct {each}), "
        "every copies file as listed"
    )


if __name__ == "__main__":
    sys.exit(main())
