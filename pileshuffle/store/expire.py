"""Dropping a store's oldest generations (``expire``) and deleting the files no recent
manifest version lists (``gc``): manifest first, files after a grace period, so a reader
that opened an older version finishes its epoch."""

import math
import time

from pileshuffle import names
from pileshuffle.errors import OutputError, UsageError
from pileshuffle.io import storage
from pileshuffle.store import layout
from pileshuffle.store.lock import StoreLock, release_lock

__all__ = ["DEFAULT_GRACE_SECONDS", "check_grace_seconds", "parse_before", "expire", "collect"]

# files of an expired generation outlive its last manifest version by this
DEFAULT_GRACE_SECONDS = 24 * 3600


def check_grace_seconds(value: float) -> float:
    """``--grace_seconds`` as given, if a finite number of seconds, 0 or more; else a UsageError."""
    if not math.isfinite(value) or value < 0:
        raise UsageError(f"--grace_seconds: must be 0 or more seconds, not {value:g}")
    return value


def parse_before(text: str):
    """``--before``'s time, or a UsageError that names the option and the forms it takes."""
    try:
        return layout.parse_time(text)
    except ValueError:
        raise UsageError(
            f"--before: {text!r} is not a time: give a UTC date or time in ISO 8601, e.g. "
            "2026-11-01, 2026-11-01T18:30 or 2026-11-01T18:30:00Z"
        ) from None


def expire(
    prefix,
    keep_generations=None,
    before=None,
    grace_seconds=DEFAULT_GRACE_SECONDS,
    command="expire",
    everything=False,
):
    """Drop whole generations: publish the next version without them, then collect files
    no version within the grace period lists. Dropping every live generation (an empty
    store) needs ``everything`` (``--all``). Returns ``(manifest, dropped, deleted)``."""
    if keep_generations is None and before is None:
        raise ValueError("expire needs --keep_generations N or --before TIME")
    if keep_generations is not None and int(keep_generations) < 0:
        raise ValueError(f"--keep_generations must be 0 or more, got {keep_generations}")
    cutoff = parse_before(before) if isinstance(before, str) else before
    check_grace_seconds(grace_seconds)
    prefix = layout.existing_store(prefix)
    token = StoreLock(prefix, command).acquire()
    try:
        current = layout.read_store_manifest(prefix)
        if current is None:
            raise OutputError(f"no store at {names.store_dir(prefix)}")
        kept = list(current["generations"])
        if keep_generations is not None:
            kept = (
                kept[max(0, len(kept) - int(keep_generations)) :] if int(keep_generations) else []
            )
        if cutoff is not None:
            kept = [g for g in kept if layout.parse_time(g["created"]) >= cutoff]
        dropped = [g["generation"] for g in current["generations"] if g not in kept]
        if dropped and not kept and not everything:
            raise UsageError(
                f"this would expire every live generation of {names.store_dir(prefix)} "
                f"(generation(s) {', '.join(map(str, dropped))}), leaving no records to train on: "
                "pass --all to do that"
            )
        if dropped:
            current = layout.next_manifest(current, kept)
            layout.publish_manifest(prefix, current)
        deleted = collect(prefix, grace_seconds)
    finally:
        release_lock(prefix, token)
    return current, dropped, deleted


def collect(prefix, grace_seconds=DEFAULT_GRACE_SECONDS, now=None) -> dict:
    """Delete what no reader can need (call under the lock): the generations that
    unprotected manifest versions list and no protected one does, then those versions.
    Protected: the current version and every version superseded less than
    ``grace_seconds`` ago (a reader that opened it may still be in its epoch)."""
    now = time.time() if now is None else now
    versions = layout.manifest_versions(prefix)
    if not versions:
        return {"generations": [], "versions": []}
    manifests = {v: layout.read_store_manifest(prefix, v) for v in versions}
    protected = {versions[-1]}
    for version in versions[:-1]:
        successor = manifests.get(version + 1)
        retired = successor.get("published") if successor else None
        if retired is None or layout.parse_time(retired).timestamp() > now - grace_seconds:
            protected.add(version)
    needed = {g["generation"] for v in protected for g in manifests[v]["generations"]}
    listed = {
        g["generation"] for v in set(versions) - protected for g in manifests[v]["generations"]
    }
    doomed = sorted(listed - needed)  # from the manifests, without listing the whole store
    store = names.store_dir(prefix)
    for generation in doomed:
        storage.delete_tree(storage.join(store, names.generation_dir_name(generation)))
    # after their generations: a killed collection is redone
    old = sorted(set(versions) - protected)
    if old:
        storage.delete([storage.join(store, names.store_manifest_name(v)) for v in old])
    return {"generations": doomed, "versions": old}
