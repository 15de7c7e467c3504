"""``pileshuffle append``: new input files as a store's next generation, refused when live
generations hold them already or the balance asked differs from the store's."""

import sys

from pileshuffle import names
from pileshuffle.commands.report import as_command, store_at_stake_on_interrupt, store_summary
from pileshuffle.commands.store_options import (
    AppendOptions,
    append_options,
)
from pileshuffle.engine.balance import Policy
from pileshuffle.errors import InputError, OutputError, UsageError
from pileshuffle.planning.runners import runner_defaults
from pileshuffle.store import layout, lock
from pileshuffle.store.layout import existing_store
from pileshuffle.store.lock import store_lock
from pileshuffle.store.publish import stored_schema
from pileshuffle.store.write import input_identity, same_inputs, write_generation

__all__ = ["append", "append_main"]


def append(options) -> dict:
    """``pileshuffle append``: ``options`` (``AppendOptions``, or its command-line arguments)'s
    records as the store's next generation; returns the new manifest (or Beam's result when
    the runner is not waited for)."""
    from pileshuffle.engine.inputs import check_format_fits, match_inputs

    args = options if isinstance(options, AppendOptions) else append_options(options)
    prefix = existing_store(args.store)
    store_at_stake_on_interrupt(prefix)
    with store_lock(prefix, args.describe()) as token:
        base = layout.read_store_manifest(prefix)
        if base is None:
            raise OutputError(
                f"no store at {names.store_dir(prefix)}: create one with `pileshuffle run "
                f"--layout store --output {prefix} --input ...`"
            )
        store_at_stake_on_interrupt(prefix, base["version"])
        _refuse_other_balance(prefix, base, args)
        sources = match_inputs(args.input)  # never a store's own files
        check_format_fits(sources, base["format"], names.store_dir(prefix))
        newest = base["generations"][-1] if base["generations"] else None
        # a re-run after a crash, with the option too
        if newest is not None and same_inputs(newest, sources):
            print(
                f"pileshuffle: these inputs are already generation {newest['generation']} of "
                f"{names.store_dir(prefix)} (version {base['version']}): nothing to do",
                file=sys.stderr,
            )
            lock.release_lock(prefix, token)
            return base
        if not args.allow_duplicate_inputs:
            _refuse_held_inputs(prefix, base, sources)
        _refuse_other_schema(prefix, base, sources)
        if not args.quiet:
            print(
                f"pileshuffle: {len(sources)} input file(s), {sum(s.size for s in sources):,} "
                f"bytes -> generation {base['next_generation']} of {names.store_dir(prefix)}",
                file=sys.stderr,
            )
        return write_generation(
            runner_defaults(args.beam),
            prefix,
            base,
            sources,
            base["seed"],
            args.skip_corrupt,
            token,
            allow_duplicates=args.allow_duplicate_inputs,
        )


def _refuse_other_schema(prefix: str, base: dict, sources):
    """The inputs' schema (``inputs.check_schemas``) must have the store's columns: else name
    how it differs from the schema of the store's first data file."""
    from pileshuffle.engine.inputs import check_schemas, describe_difference
    from pileshuffle.engine.transforms.finalize import schema_json
    from pileshuffle.formats import get_format

    schema = check_schemas(get_format(base["format"]), sources)
    if (
        schema is None
        or not base.get("schema")
        or schema_json(schema)["fields"] == base["schema"]["fields"]
    ):
        return
    expected = (
        stored_schema(prefix, base["generations"][0]["files"][0]["path"])
        if base["generations"]
        else None
    )
    detail = describe_difference(expected, schema) if expected is not None else "different columns"
    raise InputError(sources[0].path, f"has a different schema from the store's: {detail}")


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
                else input_identity(entry["path"], entry.get("bytes"))
            )
            held.setdefault(known, (generation["generation"], entry["path"]))
    return {s.path: held[key] for s in sources if (key := input_identity(s.path, s.size)) in held}


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
            f"{given}: {store} was created without --balance, so it cannot balance a generation; "
            "create a "
            "new store with `pileshuffle run --layout store --label_field FIELD --balance POLICY "
            "...`"
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


@as_command
def append_main(argv):
    """``pileshuffle append``: add a generation, then print the store's summary."""
    manifest = append(argv)
    if isinstance(manifest, dict):
        print(store_summary(manifest))
    return 0
