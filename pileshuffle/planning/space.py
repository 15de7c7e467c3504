"""The disk space a run writes, where, and whether the disks have it.

A run writes, before it finishes and all at once at its peak (pass 2 reads the pass-1 runs while
it writes the shards): the pass-1 runs in its work folder (files mode: the input as Arrow holds
it, with framing) and the staged shards beside the output (about the input's bytes). Locations on
one filesystem add up. ``plan`` prints what ``free_space`` found; ``run`` refuses up front, with
``check_space``, a run that those figures say will fill a local disk.
"""

import os
import shutil

from pileshuffle.errors import OutputError
from pileshuffle.names import staging_dir, store_dir

__all__ = ["FRAGMENT_OVERHEAD", "space_needed", "free_space", "space_note", "check_space"]

FRAGMENT_OVERHEAD = 1.1  # Arrow IPC framing, the 8-byte key and 8-byte hash per record


def space_needed(
    sources, total: int, growth: float, layout: str, intermediate: str, work_dir: str, output: str
) -> dict:
    """Bytes a run writes at each location before it finishes: pass-1 runs (files mode: the
    input as Arrow holds it, ``total``, with their framing) and the staged shards (about the
    input); a store run (``layout``) its store's fragments instead. Times ``growth``:
    ``--balance`` writes copies."""
    if layout == "store":
        needs = {store_dir(output): int(total * FRAGMENT_OVERHEAD)}
    else:
        needs = {staging_dir(output): sum(s.size for s in sources)}
        if intermediate == "files":
            needs[work_dir] = needs.get(work_dir, 0) + int(total * FRAGMENT_OVERHEAD)
    return {location: int(need * growth) for location, need in needs.items()}


def free_space(needs: dict) -> dict:
    """``{location: (needed, free)}`` of ``needs`` (``{location: bytes}``), where the locations
    of one filesystem share its free bytes and their need adds up; ``free`` is None where it
    cannot be known (remote filesystems)."""
    devices, space = {}, {}
    for location, need in needs.items():
        if "://" in location:
            space[location] = (need, None)
            continue
        existing = os.path.abspath(location)
        while not os.path.exists(existing) and os.path.dirname(existing) != existing:
            existing = os.path.dirname(existing)
        try:
            free, device = shutil.disk_usage(existing).free, os.stat(existing).st_dev
        except OSError:
            space[location] = (need, None)
            continue
        entry = devices.setdefault(device, [0, free, []])
        entry[0] += need
        entry[2].append(location)
    for need, free, locations in devices.values():
        for location in locations:
            space[location] = (need, free)
    return space


def _by_disk(space: dict) -> dict:
    """``{(needed, free): [locations]}``: the locations of one filesystem share its figures."""
    groups = {}
    for location, need_free in space.items():
        groups.setdefault(need_free, []).append(location)
    return groups


def space_note(space: dict) -> str:
    """What the run needs where (``free_space``'s), for the message of a run that ran out of
    space."""
    parts = []
    for (need, free), locations in _by_disk(space).items():
        known = "" if free is None else f" ({free:,} were free when it started)"
        parts.append(f"about {need:,} bytes at {' and '.join(locations)}{known}")
    return "this run needs " + " and ".join(parts) if parts else "the disk is full"


def check_space(space: dict):
    """Refuse (OutputError), before anything is written, a run that writes more to a local disk
    than it has free (``free_space``'s figures)."""
    for (need, free), locations in _by_disk(space).items():
        if free is not None and free < need:
            raise OutputError(
                f"not enough disk space: {' and '.join(locations)} "
                f"{'have' if len(locations) > 1 else 'has'} {free:,} bytes free, and this run "
                f"writes about {need:,} bytes there before it finishes (pass-1 runs and staged "
                "shards; `pileshuffle plan` shows them): free some, or give --temp_location on "
                "another disk for the pass-1 runs; nothing was written"
            )
