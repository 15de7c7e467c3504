"""``pileshuffle expire`` and ``pileshuffle gc``: drop a store's oldest generations, and
delete the files no recent manifest version lists."""

from pileshuffle.commands.report import as_command, store_summary
from pileshuffle.commands.store_options import (
    expire_options,
    gc_options,
)
from pileshuffle.store import lock
from pileshuffle.store.expire import collect, expire
from pileshuffle.store.layout import existing_store

__all__ = ["expire_main", "gc_main"]


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
        f"expired   {len(dropped)} generation(s) {dropped}; deleted the files of "
        f"{deleted['generations']}"
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
