"""``pileshuffle info --output PREFIX``: what a finished output or a pile store holds, from its
manifest alone (nothing else is read): its kind and version, format, records and files, the seed
and options that made it, and what its manifest proves. ``--json``: the same as one JSON object.
"""

import json
import sys

from pileshuffle.commands.help_style import CommandParser
from pileshuffle.commands.options import parse_command
from pileshuffle.commands.report import dedup_units, reporting_errors
from pileshuffle.engine.output_files import read_manifest
from pileshuffle.errors import InputError
from pileshuffle.io import storage
from pileshuffle.io.unfinished import unfinished_run
from pileshuffle.names import STORE_KIND, format_problem, manifest_path, store_dir
from pileshuffle.store import layout

__all__ = ["main", "describe"]


def describe(prefix: str) -> dict:
    """What the manifest at ``prefix`` (a shard output's, else the store's current one) says, as
    the lines ``info`` prints (``{name: text}``); an InputError when there is neither."""
    if storage.exists(manifest_path(prefix)):
        manifest = read_manifest(prefix)
        where = manifest_path(prefix)
    else:
        manifest = layout.read_store_manifest(layout.store_prefix(prefix))
        where = store_dir(layout.store_prefix(prefix))
        if manifest is None:
            nothing = (
                f"holds no finished output: no {manifest_path(prefix)} and no pile store "
                f"{store_dir(prefix)}/ (give the prefix a run wrote, e.g. out/train)"
            )
            raise InputError(prefix, unfinished_run(prefix) or nothing)
    problem = format_problem(manifest)
    if problem:
        raise InputError(where, problem)
    lines = _store_lines(manifest) if manifest.get("kind") == STORE_KIND else _shard_lines(manifest)
    return {"manifest": where, **lines}


def _shard_lines(manifest: dict) -> dict:
    """The lines of a shard output's manifest: its kind, format, records, what made it, its input
    and what the manifest proves."""
    totals, piles = manifest["totals"], manifest["pile_records"]
    fingerprint = manifest["output_fingerprint"]
    checked = (
        "each shard's size and CRC32C"
        if all("crc32c" in s for s in manifest["shards"])
        else "each shard's size"
    )
    made = _made_by_text(manifest)
    skipped = manifest.get("skipped", {})
    return {
        "kind": f"shard output (format_version {manifest.get('format_version', '1.0')}, "
        f"pileshuffle {manifest.get('pileshuffle_version', '?')})",
        "format": f"{manifest['format']}, compression {manifest['compression']}",
        "records": f"{totals['records']:,} in {manifest['num_piles']} shard(s) "
        f"(per shard min {piles['min']:,} / mean {piles['mean']:,.0f} / max {piles['max']:,}); "
        f"{totals['payload_bytes']:,} payload bytes, {totals['shard_bytes']:,} in files",
        "made by": made,
        "input": (
            f"{len(manifest.get('inputs', []))} file(s); {skipped.get('records', 0)} corrupt "
            f"record(s) skipped, {skipped.get('blank_lines', 0)} blank line(s)"
        )
        if "inputs" in manifest
        else "records handed to WritePiles",
        "proves": (
            f"the output's records are the input's ({fingerprint['records']:,} records, hash sum "
            f"{fingerprint['hash_sum']}, xor {fingerprint['hash_xor']})"
            + (" with --balance's copies" if manifest.get("balance") else "")
            + (
                ", the first of each distinct one: "
                f"{manifest['dedup']['records_dropped']:,} duplicate(s) of "
                f"{manifest['dedup']['records_read']:,} read left out"
                if manifest.get("dedup")
                else ""
            )
            + f"; {checked} are listed (`pileshuffle verify` re-checks all of it)"
        ),
    }


def _made_by_text(manifest: dict) -> str:
    """What made a shard output: its seed (else a composed pipeline's ``WritePiles``), the piles
    and intermediate mode its options chose, and the store it was materialized from."""
    options = manifest.get("options", {})
    made = f"seed {manifest['seed']}" if "seed" in manifest else "a composed pipeline (WritePiles)"
    if options:
        made += (
            f"; {manifest['num_piles']} piles ({options.get('num_piles_reason', '')}), "
            f"intermediate {options.get('intermediate')}"
            + (", skipping corrupt records" if options.get("skip_corrupt") else "")
        )
    if manifest.get("store"):
        store = manifest["store"]
        made += f"; materialized from {store['prefix']} version {store['version']}"
    return made


def _store_options_text(manifest: dict) -> str:
    """How a store's generations are made beyond its seed: balanced, or deduplicated over the
    window."""
    options, dedup = manifest.get("options") or {}, layout.store_dedup(manifest)
    if dedup is not None:
        return (
            f"; deduplicated: {manifest['totals'].get('distinct', 0):,} distinct "
            f"{dedup_units(dedup.field)} visible, the oldest live copy of each"
        )
    return f"; balanced: {options}" if options else ""


def _store_lines(manifest: dict) -> dict:
    generations = manifest["generations"]
    listed = ", ".join(
        f"{g['generation']} ({g['records']:,} records from {len(g['inputs'])} file(s), "
        f"{g.get('created', '?')})"
        for g in generations[:5]
    ) + (", ..." if len(generations) > 5 else "")
    checked = "CRC32C" if all("crc32c" in f for g in generations for f in g["files"]) else "sizes"
    return {
        "kind": f"pile store, version {manifest['version']} "
        f"(format_version {manifest.get('format_version', '1.0')})",
        "format": f"{manifest['format']}; materialize writes compression {manifest['compression']}",
        "records": f"{manifest['totals']['records']:,} in {len(generations)} live generation(s), "
        f"{manifest['num_piles']} piles; {manifest['totals']['payload_bytes']:,} payload bytes",
        "made by": f"seed {manifest['seed']}" + _store_options_text(manifest),
        "generations": listed or "none live",
        "proves": f"each generation's files hold its inputs' records (fingerprints), "
        f"their {checked} listed (`pileshuffle verify` re-checks all of it)",
    }


def main(argv=None) -> int:
    """``pileshuffle info``: the lines of ``describe``, or ``--json``; exit code 2 for no output
    there."""
    parser = CommandParser(
        prog="pileshuffle info",
        allow_abbrev=False,
        description="What a finished output or a pile store holds, from its manifest.",
    )
    parser.add_argument(
        "--output",
        required=True,
        metavar="PREFIX",
        help="the prefix a run wrote (its --output), or a store's prefix",
    )
    parser.add_argument(
        "--json", action="store_true", help="print one JSON object instead of lines"
    )
    args = parse_command(parser, argv)

    def show() -> int:
        lines = describe(args.output.rstrip("/") if "://" not in args.output else args.output)
        if args.json:
            print(json.dumps(lines, indent=1))
        else:
            width = max(map(len, lines))
            print("\n".join(f"{name:<{width}}  {text}" for name, text in lines.items()))
        return 0

    return reporting_errors(show)


if __name__ == "__main__":
    sys.exit(main())
