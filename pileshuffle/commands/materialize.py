"""``pileshuffle materialize``: a store's second pass, written as the shuffled shards ``run``
writes (under the output's lock, as ``run``), from a version whose files are all there."""

import time

import apache_beam as beam
from apache_beam.options.pipeline_options import GoogleCloudOptions

from pileshuffle import names
from pileshuffle.commands.report import as_command, shards_at_stake_on_interrupt
from pileshuffle.commands.store_options import (
    MaterializeOptions,
    materialize_options,
)
from pileshuffle.engine.output_files import remove_tree
from pileshuffle.engine.runner import execute
from pileshuffle.errors import InputError, OutputError, UsageError
from pileshuffle.io import storage
from pileshuffle.store import layout
from pileshuffle.store.layout import existing_store
from pileshuffle.store.publish import stored_schema
from pileshuffle.store.read import live_piles, missing_files

__all__ = ["materialize", "materialize_main"]


def materialize(options) -> dict:
    """``pileshuffle materialize``: the second pass over a store, as ``options``
    (``MaterializeOptions``, or its command-line arguments) say; returns the written manifest."""
    from pileshuffle.engine.output_files import discard_unpublished, read_manifest
    from pileshuffle.planning.locations import check_shard_output, taken_output, work_dir_for
    from pileshuffle.planning.runners import runner_defaults

    args = options if isinstance(options, MaterializeOptions) else materialize_options(options)
    options = args.beam
    prefix = existing_store(args.store)
    shards_at_stake_on_interrupt(args.output)
    if layout.clean_prefix(args.output) == prefix:
        raise OutputError(
            f"--output {args.output} is the store's own prefix: its shards would hide the store "
            f"from readers (they take {prefix}-manifest.json first); choose another prefix"
        )
    # run's checks: never a file no run wrote
    output, _ = check_shard_output(args.output, args.overwrite)
    manifest = _materializable_manifest(prefix, args.version)
    work_dir = work_dir_for(output, options.view_as(GoogleCloudOptions).temp_location)
    max_pile_bytes = _pile_bound(args.max_pile_bytes, manifest, options)
    piles = live_piles(prefix, manifest, max_pile_bytes, work_dir=work_dir)
    first = next((f["path"] for g in manifest["generations"] for f in g["files"]), None)
    schema = stored_schema(prefix, first) if manifest["format"] == "parquet" and first else None
    fields = _manifest_fields(prefix, manifest, output, max_pile_bytes)
    started = time.time()

    def graph(pipeline):
        return _write_piles(pipeline, piles, output, manifest, schema, fields, started)

    def failed(error):
        remove_tree(work_dir)
        discard_unpublished(output)

    with taken_output(output, args.overwrite, work_dir, args.describe()):  # as run does
        result = execute(runner_defaults(options), graph, len(piles), failed)
    if result is not None:
        return result
    written = read_manifest(output)
    written["wall_seconds"] = time.time() - started
    return written


def _pile_bound(given, manifest: dict, options) -> int:
    """The most of one pile ordered whole: ``--max_pile_bytes`` as given; else the store's, or
    less where the workers that order the piles hold less (``job_model.workers_pile_bound``). A
    pile over it is ordered in sub-piles, in the same order: the bound changes the memory held,
    never the bytes written."""
    from pileshuffle.planning.job_model import workers_pile_bound
    from pileshuffle.planning.parameters import parse_bytes

    if given:
        return parse_bytes(given)
    stored = manifest["max_pile_bytes"]
    return min(stored, workers_pile_bound(options) or stored)


def _materializable_manifest(prefix: str, version) -> dict:
    """The store's manifest at ``--version`` (None: the current one), refused when there is no
    store, a file it lists is gone, or it has no live records."""
    manifest = layout.read_store_manifest(prefix, _readable_version(prefix, version))
    if manifest is None:
        raise OutputError(f"no store at {names.store_dir(prefix)}")
    _refuse_missing_files(prefix, manifest)
    if not manifest["totals"]["records"]:
        raise OutputError(
            f"{names.store_dir(prefix)} version {manifest['version']} has no live records "
            f"(generations: {[g['generation'] for g in manifest['generations']]}): nothing to "
            "materialize"
        )
    return manifest


def _manifest_fields(prefix: str, manifest: dict, output: str, max_pile_bytes: int) -> dict:
    """The written manifest's own fields: the store's seed, format and piles, the version and
    generations read, and a dedup or balanced store's options (and a balanced run's counts)."""
    fields = {
        "output": output,
        "seed": manifest["seed"],
        "options": {
            "format": manifest["format"],
            "compression": manifest["compression"],
            "num_piles": manifest["num_piles"],
            "num_piles_reason": f"the store's ({names.store_dir(prefix)})",
            "max_pile_bytes": max_pile_bytes,
            "intermediate": "store",
            "skip_corrupt": False,
        },
        "store": {
            "prefix": prefix,
            "version": manifest["version"],
            "generations": [g["generation"] for g in manifest["generations"]],
        },
    }
    if layout.store_dedup(manifest) is not None:
        # each distinct record of the window once: `verify --input` proves it
        fields["options"].update(manifest["options"])
    if layout.store_balance(manifest) is not None:  # the store's --balance, and its counts
        fields["store"]["options"] = manifest["options"]
        if len(manifest["generations"]) == 1:
            # run --balance's bytes: its manifest's options and counts too
            fields["options"].update(manifest["options"])
            fields["balance"] = manifest["generations"][0]["balance"]
    return fields


def _write_piles(pipeline, piles, output, manifest, schema, fields, started):
    """The graph ``materialize`` runs: the store's live ``piles`` spread over the workers and
    written as ``output``'s shards, ``fields`` in their manifest."""
    from pileshuffle.engine.transforms.write import WritePiles

    return (
        pipeline
        | "ListPiles" >> beam.Create(piles)
        | "SpreadPiles" >> beam.Reshuffle()
        | "WritePiles"
        >> WritePiles(
            output,
            manifest["format"],
            manifest["compression"],
            num_piles=manifest["num_piles"],
            overwrite=True,
            schema=schema,
            manifest_fields=fields,
            started=started,
        )
    )


def _readable_version(prefix: str, version):
    """``--version``: None (the current one) or a version the store still has."""
    if version is None:
        return None
    versions = layout.manifest_versions(prefix)
    if version not in versions:
        kept = f"{versions[0]} to {versions[-1]}" if len(versions) > 1 else f"{versions[0]}"
        raise UsageError(
            f"--version {version}: {names.store_dir(prefix)} has version(s) {kept} (current "
            f"{versions[-1]}; versions start at 1, and gc deletes superseded ones after their "
            "grace period)"
        )
    return version


def _refuse_missing_files(prefix: str, manifest: dict):
    """Name a data file the manifest lists that is gone (deleted by hand), and the version
    and generation that list it, before anything is written."""
    missing = missing_files(prefix, manifest)
    if missing:
        generation, path = missing[0]
        others = f" ({len(missing) - 1} more file(s) are missing too)" if len(missing) > 1 else ""
        listing = storage.join(
            names.store_dir(prefix), names.store_manifest_name(manifest["version"])
        )
        raise InputError(
            path,
            f"is missing, but version {manifest['version']} of the store ({listing}) "
            f"lists it in generation {generation}{others}; `pileshuffle verify --output {prefix}` "
            f"checks every file",
        )


@as_command
def materialize_main(argv):
    """``pileshuffle materialize``: write a store as shards, then print the run summary."""
    from pileshuffle.commands.report import summary

    manifest = materialize(argv)
    if isinstance(manifest, dict):
        print(summary(manifest))
    return 0
