"""``pileshuffle run --layout store``: pass 1 only, into a new pile store ``{output}-store/``
as its generation 0 (manifest version 1); nothing to do when the store holds these inputs so."""

import sys

from pileshuffle import names
from pileshuffle.commands.report import store_at_stake_on_interrupt
from pileshuffle.engine.output_files import schema_json
from pileshuffle.errors import OutputError
from pileshuffle.io import storage
from pileshuffle.planning.parameters import PileshuffleOptions, parse_flag
from pileshuffle.planning.plan import make_plan
from pileshuffle.planning.runners import runner_defaults
from pileshuffle.planning.space import check_space
from pileshuffle.store import layout
from pileshuffle.store.lock import command_line, release_lock, store_lock
from pileshuffle.store.write import same_inputs, write_generation

__all__ = ["run_store"]


def run_store(options, wait=None):
    """``pileshuffle run --layout store``: pass 1 only, into ``{output}-store/`` as
    generation 0 of a new store (manifest version 1)."""
    store_at_stake_on_interrupt(
        layout.clean_prefix(options.view_as(PileshuffleOptions).output or "")
    )
    options = runner_defaults(options)
    plan = make_plan(options)
    check_space(plan.space)
    prefix = plan.output
    if storage.exists(names.manifest_path(prefix)):
        raise OutputError(
            f"{names.manifest_path(prefix)} exists: a store at the same prefix would be hidden by "
            "those shards (readers take shards first); choose another --output"
        )
    sources = plan.sources  # match_inputs leaves store files out
    base = _first_manifest(plan)
    with store_lock(prefix, command_line()) as token:
        current = layout.read_store_manifest(prefix)
        if current is not None:
            if _holds_this_run(current, base, plan):
                print(
                    f"pileshuffle: {names.store_dir(prefix)} already holds these inputs as "
                    f"generation 0 (version {current['version']}): nothing to do",
                    file=sys.stderr,
                )
                release_lock(prefix, token)
                return current
            raise OutputError(
                f"a store exists at {names.store_dir(prefix)} (version {current['version']}): add "
                f"data with `pileshuffle append --store {prefix} --input ...`, or delete it first "
                "(--overwrite never replaces a store: it holds every generation's data)"
            )
        if not parse_flag(options.view_as(PileshuffleOptions).quiet):
            print(
                f"pileshuffle: {len(sources)} input file(s), {sum(s.size for s in sources):,} "
                f"bytes -> store {names.store_dir(prefix)}, {plan.num_piles} piles "
                f"({plan.num_piles_reason})",
                file=sys.stderr,
            )
        return write_generation(
            plan.options, prefix, base, sources, plan.seed, plan.skip_corrupt, token, wait
        )


def _first_manifest(plan) -> dict:
    """The manifest the new store starts from (``layout.new_manifest``): the plan's format,
    piles, seed and pile size, its input schema, and its balance and dedup options."""
    return layout.new_manifest(
        plan.format,
        plan.compression,
        plan.num_piles,
        plan.seed,
        plan.max_pile_bytes,
        schema_json(plan.schema) if plan.schema is not None else None,
        None if plan.balance is None else (plan.label, plan.balance, plan.keep_unlabeled),
        plan.dedup,
    )


def _holds_this_run(current: dict, base: dict, plan) -> bool:
    """Whether the store's manifest ``current`` is this run's, done: generation 0 alone, from
    the plan's sources, with its seed, piles and format, and ``base``'s options (a re-run)."""
    first = current["generations"][:1]
    return (
        len(current["generations"]) == 1
        and first[0]["generation"] == 0
        and same_inputs(first[0], plan.sources)
        and (current["seed"], current["num_piles"], current["format"])
        == (plan.seed, plan.num_piles, plan.format)
        and current.get("options") == base.get("options")
    )
