"""The store's commands: ``run --layout store``, ``append``, ``expire``, ``gc``, ``materialize``.

Every command that changes the store holds its lock from before it reads the current
manifest until it has published (``lock.StoreLock``), deletes what a killed command of
its own kind left (unpublished generation directories) before it writes, and publishes
one manifest version last. Killed at any point, the store stays readable at its previous
version; the same command run again finishes the job.
"""

import contextlib
import sys
import time

import apache_beam as beam
from apache_beam.options.pipeline_options import GoogleCloudOptions

from pileshuffle import interrupt, names
from pileshuffle.commands import running
from pileshuffle.commands.report import as_command, shards_at_stake_on_interrupt, store_summary
from pileshuffle.commands.running import execute
from pileshuffle.commands.store_options import (
    AppendOptions,
    MaterializeOptions,
    append_options,
    expire_options,
    gc_options,
    materialize_options,
)
from pileshuffle.engine.balance import Policy
from pileshuffle.engine.output_files import missing_local_folders, remove_empty_folders, remove_tree
from pileshuffle.errors import InputError, OutputError, UsageError
from pileshuffle.io import storage
from pileshuffle.planning.parameters import PileshuffleOptions, parse_flag
from pileshuffle.store import layout, lock
from pileshuffle.store import write as store_write
from pileshuffle.store.expire import collect, expire
from pileshuffle.store.layout import existing_store
from pileshuffle.store.publish import stored_schema
from pileshuffle.store.read import live_piles, missing_files
from pileshuffle.store.write import build_generation, writer_groups

__all__ = [
    "run_store",
    "append",
    "materialize",
    "append_main",
    "expire_main",
    "gc_main",
    "materialize_main",
]


# --- running a pipeline ------------------------------------------------------------------------


def _same_inputs(generation: dict, sources) -> bool:
    listed = {(i["path"], i.get("bytes")) for i in generation["inputs"]}
    return listed == {(s.path, s.size) for s in sources}


def _input_identity(path: str, size) -> tuple:
    """What makes an input the same file under any name: its real identity (resolved real
    path on a local disk, bucket + object on gs://; ``inputs.file_identity``) and its size."""
    from pileshuffle.engine.inputs import file_identity

    return file_identity(path), size


def _held_inputs(manifest: dict, sources) -> dict:
    """``{path: (generation, the name it was added under)}`` of the ``sources`` that a live
    generation of ``manifest`` already holds. A generation's inputs carry their identity
    (``identity``); a manifest written before that resolves their paths from here."""
    held = {}
    for generation in manifest["generations"]:
        for entry in generation["inputs"]:
            known = (
                (entry["identity"], entry.get("bytes"))
                if "identity" in entry
                else _input_identity(entry["path"], entry.get("bytes"))
            )
            held.setdefault(known, (generation["generation"], entry["path"]))
    return {s.path: held[key] for s in sources if (key := _input_identity(s.path, s.size)) in held}


def _refuse_held_inputs(prefix: str, manifest: dict, sources):
    """Appending files a live generation holds would repeat their records in every epoch."""
    held = _held_inputs(manifest, sources)
    if not held:
        return
    named = "; ".join(
        f"{path} (generation {g}" + ("" if added == path else f", as {added}") + ")"
        for path, (g, added) in sorted(held.items())[:5]
    )
    more = f" and {len(held) - 5} more" if len(held) > 5 else ""
    raise InputError(
        "--input",
        f"{len(held)} file(s) are already in live generations of {names.store_dir(prefix)} "
        f"(version {manifest['version']}): {named}{more}; appending them again would repeat "
        f"their records in every epoch. Pass --allow_duplicate_inputs if you mean it, or "
        f"expire those generations first",
    )


def _at_stake_on_interrupt(prefix: str, version: int = None):
    """What Ctrl-C leaves of a command that publishes the next version of the store at ``prefix``."""
    store, now = (
        names.store_dir(prefix),
        "" if version is None else f": it is still at version {version}",
    )
    interrupt.describe(
        f"nothing was published to {store}{now}; run the same command again (it removes what this one "
        f"left and writes the same generation)",
        f"it had published {store}'s next version"
        if version is None
        else f"it had published version {version + 1} of {store}",
    )


@contextlib.contextmanager
def _store_lock(prefix: str, command: str):
    """Hold the store's lock for a command that publishes its next version; yields the
    token. The publication releases it (``PublishGeneration``), or the command does when it
    has nothing to publish. A refusal, failure or Ctrl-C releases it and removes the store
    folder if that holds nothing else: a first run that published nothing leaves no
    ``-store`` folder."""
    token, created = None, missing_local_folders(storage.split(prefix)[0])
    try:  # taking the lock too: a Ctrl-C as it is taken leaves neither the lock nor the folder it made
        token = lock.StoreLock(prefix, command).acquire()
        yield token
    except BaseException:
        with (
            interrupt.not_cut()
        ):  # one step: no lock, nor an empty folder, is left by a Ctrl-C inside it
            if token is not None:
                lock.release_lock(prefix, token)
            lock.remove_if_empty(prefix)
            remove_empty_folders(created)  # and the folders above it this command made
        raise


def _write_generation(
    options, prefix, base, sources, seed, skip_corrupt, token, wait=None, allow_duplicates=False
):
    """Pass 1 of ``sources`` into the store as generation ``base['next_generation']``
    (under ``_store_lock``); a failure or Ctrl-C removes the generation's directory."""
    layout.remove_unpublished(prefix)
    try:
        generation = base["next_generation"]
        groups = writer_groups(sources, store_write.STORE_WRITERS)
        sizes = {s.path: s.size for s in sources}
        identities = {s.path: _input_identity(s.path, s.size)[0] for s in sources}
        started = time.time()
        result = execute(
            options,
            lambda p: build_generation(
                p,
                prefix,
                base,
                generation,
                groups,
                seed,
                skip_corrupt,
                token,
                sizes,
                identities,
                allow_duplicates,
            ),
            len(groups),
            wait=wait,
        )
        if result is not None:
            return result
        manifest = layout.read_store_manifest(prefix)
        if manifest is None or manifest["version"] != base["version"] + 1:
            raise OutputError(
                f"the pipeline finished but {names.store_dir(prefix)} has no version {base['version'] + 1}"
            )
    except BaseException:
        layout.remove_unpublished(prefix)
        raise
    manifest["wall_seconds"] = time.time() - started
    return manifest


def run_store(options, wait=None, hold_worker_stderr=False):
    """``pileshuffle run --layout store``: pass 1 only, into ``{output}-store/`` as
    generation 0 of a new store (manifest version 1)."""
    from pileshuffle.engine.transforms.write import schema_json
    from pileshuffle.names import manifest_path
    from pileshuffle.planning.plan import make_plan
    from pileshuffle.planning.space import check_space

    running.HOLD_WORKER_STDERR["on"] = hold_worker_stderr
    _at_stake_on_interrupt(layout.clean_prefix(options.view_as(PileshuffleOptions).output or ""))
    plan = make_plan(options)
    check_space(plan.space)
    prefix = plan.output
    if storage.exists(manifest_path(prefix)):
        raise OutputError(
            f"{manifest_path(prefix)} exists: a store at the same prefix would be hidden by those shards "
            f"(readers take shards first); choose another --output"
        )
    sources = plan.sources  # match_inputs leaves store files out
    base = layout.new_manifest(
        plan.format,
        plan.compression,
        plan.num_piles,
        plan.seed,
        plan.max_pile_bytes,
        schema_json(plan.schema) if plan.schema is not None else None,
        None if plan.balance is None else (plan.label, plan.balance, plan.keep_unlabeled),
        plan.dedup,
    )
    with _store_lock(prefix, lock.command_line()) as token:
        current = layout.read_store_manifest(prefix)
        if current is not None:
            first = current["generations"][:1]
            if (
                len(current["generations"]) == 1
                and first[0]["generation"] == 0
                and _same_inputs(first[0], sources)
                and (current["seed"], current["num_piles"], current["format"])
                == (plan.seed, plan.num_piles, plan.format)
                and current.get("options") == base.get("options")
            ):
                print(
                    f"pileshuffle: {names.store_dir(prefix)} already holds these inputs as generation 0 "
                    f"(version {current['version']}): nothing to do",
                    file=sys.stderr,
                )
                lock.release_lock(prefix, token)
                return current
            raise OutputError(
                f"a store exists at {names.store_dir(prefix)} (version {current['version']}): add data "
                f"with `pileshuffle append --store {prefix} --input ...`, or delete it first (--overwrite "
                "never replaces a store: it holds every generation's data)"
            )
        if not parse_flag(options.view_as(PileshuffleOptions).quiet):
            print(
                f"pileshuffle: {len(sources)} input file(s), {sum(s.size for s in sources):,} bytes -> store "
                f"{names.store_dir(prefix)}, {plan.num_piles} piles ({plan.num_piles_reason})",
                file=sys.stderr,
            )
        return _write_generation(
            options, prefix, base, sources, plan.seed, plan.skip_corrupt, token, wait
        )


def append(options) -> dict:
    """``pileshuffle append``: ``options`` (``AppendOptions``, or its command-line arguments)'s
    records as the store's next generation; returns the new manifest (or Beam's result when
    the runner is not waited for)."""
    from pileshuffle.engine.inputs import (
        check_format_fits,
        check_schemas,
        describe_difference,
        match_inputs,
    )
    from pileshuffle.engine.transforms.write import schema_json
    from pileshuffle.formats import get_format

    args = options if isinstance(options, AppendOptions) else append_options(options)
    prefix = existing_store(args.store)
    _at_stake_on_interrupt(prefix)
    with _store_lock(prefix, args.describe()) as token:
        base = layout.read_store_manifest(prefix)
        if base is None:
            raise OutputError(
                f"no store at {names.store_dir(prefix)}: create one with `pileshuffle run --layout store "
                f"--output {prefix} --input ...`"
            )
        _at_stake_on_interrupt(prefix, base["version"])
        _refuse_other_balance(prefix, base, args)
        sources = match_inputs(args.input)  # never a store's own files
        check_format_fits(sources, base["format"], names.store_dir(prefix))
        newest = base["generations"][-1] if base["generations"] else None
        if newest is not None and _same_inputs(
            newest, sources
        ):  # a re-run after a crash, with the option too
            print(
                f"pileshuffle: these inputs are already generation {newest['generation']} of {names.store_dir(prefix)} "
                f"(version {base['version']}): nothing to do",
                file=sys.stderr,
            )
            lock.release_lock(prefix, token)
            return base
        if not args.allow_duplicate_inputs:
            _refuse_held_inputs(prefix, base, sources)
        fmt = get_format(base["format"])
        schema = check_schemas(fmt, sources)
        if (
            schema is not None
            and base.get("schema")
            and schema_json(schema)["fields"] != base["schema"]["fields"]
        ):
            expected = (
                stored_schema(prefix, base["generations"][0]["files"][0]["path"])
                if base["generations"]
                else None
            )
            detail = (
                describe_difference(expected, schema)
                if expected is not None
                else "different columns"
            )
            raise InputError(sources[0].path, f"has a different schema from the store's: {detail}")
        if not args.quiet:
            print(
                f"pileshuffle: {len(sources)} input file(s), {sum(s.size for s in sources):,} bytes -> generation "
                f"{base['next_generation']} of {names.store_dir(prefix)}",
                file=sys.stderr,
            )
        return _write_generation(
            args.beam,
            prefix,
            base,
            sources,
            base["seed"],
            args.skip_corrupt,
            token,
            allow_duplicates=args.allow_duplicate_inputs,
        )


def _refuse_other_balance(prefix: str, base: dict, args: AppendOptions):
    """Every generation is balanced with the policy the store was created with
    (``layout.store_balance``): a balance option given to ``append`` must be the store's."""
    asked, store = args.balance_asked(), names.store_dir(prefix)
    if not asked:
        return
    if layout.store_balance(base) is None:
        given = " ".join(
            f"--{name}" if value is True else f"--{name} {value}" for name, value in asked.items()
        )
        raise UsageError(
            f"{given}: {store} was created without --balance, so it cannot balance a generation; create a "
            f"new store with `pileshuffle run --layout store --label_field FIELD --balance POLICY ...`"
        )
    stored = base["options"]
    for name, value in asked.items():
        ours = stored.get(name, False)  # keep_unlabeled is written only when given
        same = Policy.parse(value).spec() == ours if name == "balance" else value == ours
        if not same:
            policy = (
                f"--label_field {stored['label_field']} --balance {stored['balance']}"
                + (" --undersample" if stored["undersample"] else "")
                + (" --keep_unlabeled" if stored.get("keep_unlabeled") else "")
            )
            raise UsageError(
                f"--{name} {_option_text(value)} differs from the store's {_option_text(ours)}: "
                f"{store} balances every generation with {policy}; leave the option out to use the "
                f"store's, or create a new store"
            )


def _option_text(value) -> str:
    """A balance option's value as the command line gives it (flags as true/false)."""
    return str(value).lower() if isinstance(value, bool) else repr(value)


# --- expire and gc -----------------------------------------------------------------------------


# --- materialize -------------------------------------------------------------------------------


def materialize(options) -> dict:
    """``pileshuffle materialize``: the second pass over a store, as ``options``
    (``MaterializeOptions``, or its command-line arguments) say; returns the written manifest."""
    from pileshuffle.commands.output_lock import taken_output
    from pileshuffle.engine.output_files import discard_unpublished, read_manifest
    from pileshuffle.engine.transforms.write import WritePiles
    from pileshuffle.planning.parameters import parse_bytes
    from pileshuffle.planning.plan import check_shard_output, work_dir_for

    args = options if isinstance(options, MaterializeOptions) else materialize_options(options)
    options = args.beam
    prefix = existing_store(args.store)
    shards_at_stake_on_interrupt(args.output)
    if layout.clean_prefix(args.output) == prefix:
        raise OutputError(
            f"--output {args.output} is the store's own prefix: its shards would hide the store from "
            f"readers (they take {prefix}-manifest.json first); choose another prefix"
        )
    output, _ = check_shard_output(
        args.output, args.overwrite
    )  # run's checks: never a file no run wrote
    manifest = layout.read_store_manifest(prefix, _readable_version(prefix, args.version))
    if manifest is None:
        raise OutputError(f"no store at {names.store_dir(prefix)}")
    _refuse_missing_files(prefix, manifest)
    if not manifest["totals"]["records"]:
        raise OutputError(
            f"{names.store_dir(prefix)} version {manifest['version']} has no live records "
            f"(generations: {[g['generation'] for g in manifest['generations']]}): nothing to materialize"
        )
    work_dir = work_dir_for(output, options.view_as(GoogleCloudOptions).temp_location)
    max_pile_bytes = (
        parse_bytes(args.max_pile_bytes) if args.max_pile_bytes else manifest["max_pile_bytes"]
    )
    piles = live_piles(prefix, manifest, max_pile_bytes, work_dir=work_dir)
    first = next((f["path"] for g in manifest["generations"] for f in g["files"]), None)
    schema = stored_schema(prefix, first) if manifest["format"] == "parquet" and first else None
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
    if (
        layout.store_dedup(manifest) is not None
    ):  # each distinct record of the window once: `verify --input` proves it
        fields["options"].update(manifest["options"])
    if layout.store_balance(manifest) is not None:  # the store's --balance, and its counts
        fields["store"]["options"] = manifest["options"]
        if (
            len(manifest["generations"]) == 1
        ):  # run --balance's bytes: its manifest's options and counts too
            fields["options"].update(manifest["options"])
            fields["balance"] = manifest["generations"][0]["balance"]
    started = time.time()

    def build(pipeline):
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

    def failed():
        remove_tree(work_dir)
        discard_unpublished(output)

    with taken_output(output, args.overwrite, work_dir, args.describe()):  # as run does
        result = execute(options, build, len(piles), failed)
    if result is not None:
        return result
    written = read_manifest(output)
    written["wall_seconds"] = time.time() - started
    return written


def _readable_version(prefix: str, version):
    """``--version``: None (the current one) or a version the store still has."""
    if version is None:
        return None
    versions = layout.manifest_versions(prefix)
    if version not in versions:
        kept = f"{versions[0]} to {versions[-1]}" if len(versions) > 1 else f"{versions[0]}"
        raise UsageError(
            f"--version {version}: {names.store_dir(prefix)} has version(s) {kept} (current "
            f"{versions[-1]}; versions start at 1, and gc deletes superseded ones after their grace period)"
        )
    return version


def _refuse_missing_files(prefix: str, manifest: dict):
    """Name a data file the manifest lists that is gone (deleted by hand), and the version
    and generation that list it, before anything is written."""
    missing = missing_files(prefix, manifest)
    if missing:
        generation, path = missing[0]
        others = f" ({len(missing) - 1} more file(s) are missing too)" if len(missing) > 1 else ""
        raise InputError(
            path,
            f"is missing, but version {manifest['version']} of the store "
            f"({storage.join(names.store_dir(prefix), names.store_manifest_name(manifest['version']))}) "
            f"lists it in generation {generation}{others}; `pileshuffle verify --output {prefix}` "
            f"checks every file",
        )


# --- the command line --------------------------------------------------------------------------


@as_command
def append_main(argv):
    """``pileshuffle append``: add a generation, then print the store's summary."""
    manifest = append(argv)
    if isinstance(manifest, dict):
        print(store_summary(manifest))
    return 0


@as_command
def expire_main(argv):
    """``pileshuffle expire``: drop the oldest generations, then print what was deleted."""
    args = expire_options(argv)
    manifest, dropped, deleted = expire(
        args.store,
        args.keep_generations,
        args.before,
        args.grace_seconds,
        args.describe(),
        everything=args.all,
    )
    print(
        f"expired   {len(dropped)} generation(s) {dropped}; deleted the files of {deleted['generations']}"
    )
    print(store_summary(manifest))
    return 0


@as_command
def gc_main(argv):
    """``pileshuffle gc``: delete store files no recent manifest version lists."""
    args = gc_options(argv)
    prefix = existing_store(args.store)
    token = lock.StoreLock(prefix, args.describe()).acquire()
    try:
        deleted = collect(prefix, args.grace_seconds)
    finally:
        lock.release_lock(prefix, token)
    print(
        f"deleted   generations {deleted['generations']}, manifest versions {deleted['versions']}"
    )
    return 0


@as_command
def materialize_main(argv):
    """``pileshuffle materialize``: write a store as shards, then print the run summary."""
    from pileshuffle.commands.report import summary

    manifest = materialize(argv)
    if isinstance(manifest, dict):
        print(summary(manifest))
    return 0
