"""Splitting an epoch's global sequence among consumers, as lists of position ranges.

A consumer's sequence is a list of ``(start, stop)`` ranges of global positions, read
one after another. Nothing here reads data.

- ``rank_share``: the standard split. ``remainder="drop"``: each of ``world_size`` ranks
  gets ``N // world_size`` consecutive positions, the last ``N % world_size`` positions
  are nobody's (DDP needs equal counts). ``"pad"``: each gets ``ceil(N / world_size)``;
  the sequence is read as if repeated, so the last rank's share runs on into the start.
- ``part``: a share split again into contiguous parts (DataLoader workers) whose sizes
  differ by at most one; every position of the share is in exactly one part.
- ``redeal``: resuming with another split: the union of all consumers' unfinished
  tails, in global order, dealt out again in contiguous parts. ``"drop"`` drops nothing
  here (parts differ by at most one record), unless ``equal``: then, as in the standard
  split, every rank gets ``N // world_size`` and the last ``N % world_size`` are nobody's
  (hosts in lockstep need equal parts); ``"pad"`` pads to equal parts by repeating the
  start of the remaining sequence.
"""

import math

__all__ = ["length", "tail", "part", "union", "rank_share", "redeal"]


def length(ranges) -> int:
    """How many positions the sequence ``ranges`` holds."""
    return sum(b - a for a, b in ranges)


def _cut(ranges, start: int, stop: int) -> list:
    """Positions ``start .. stop-1`` of the sequence ``ranges`` (as ranges)."""
    out, offset = [], 0
    for a, b in ranges:
        lo, hi = max(start, offset), min(stop, offset + b - a)
        if lo < hi:
            out.append((a + lo - offset, a + hi - offset))
        offset += b - a
    return _merge_adjacent(out)


def _cyclic_cut(ranges, start: int, stop: int) -> list:
    """Like ``_cut`` on the sequence ``ranges`` repeated endlessly."""
    size = length(ranges)
    if size == 0 or start >= stop:
        return []
    out = []
    while start < stop:
        lap_start = (start // size) * size
        end = min(stop, lap_start + size)
        out += _cut(ranges, start - lap_start, end - lap_start)
        start = end
    return _merge_adjacent(out)


def tail(ranges, position: int) -> list:
    """The sequence ``ranges`` from its ``position``-th position on (what a consumer has left)."""
    return _cut(ranges, position, length(ranges))


def part(ranges, index: int, parts: int) -> list:
    """Contiguous part ``index`` of ``parts`` of the sequence (sizes differ by at most one)."""
    if not 0 <= index < parts:
        raise ValueError(f"part {index} is not in 0..{parts - 1}")
    size = length(ranges)
    return _cut(ranges, index * size // parts, (index + 1) * size // parts)


def _merge_adjacent(ranges) -> list:
    out = []
    for a, b in ranges:
        if a >= b:
            continue
        if out and out[-1][1] == a:
            out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out


def union(ranges) -> list:
    """The set union of ranges, sorted (global order), overlaps merged."""
    out = []
    for a, b in sorted((a, b) for a, b in ranges if a < b):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _check(rank, world_size, remainder):
    if not 0 <= rank < world_size:
        raise ValueError(
            f"rank must be in 0..world_size-1, got rank={rank}, world_size={world_size}"
        )
    if remainder not in ("drop", "pad"):
        raise ValueError(f"remainder must be 'drop' or 'pad', got {remainder!r}")


def rank_share(total: int, rank: int, world_size: int, remainder: str = "drop") -> list:
    """The standard split of an epoch of ``total`` records: this rank's ranges."""
    _check(rank, world_size, remainder)
    whole = [(0, total)] if total else []
    if remainder == "drop":
        each = total // world_size
        return _cut(whole, rank * each, (rank + 1) * each)
    each = math.ceil(total / world_size)
    return _cyclic_cut(whole, rank * each, (rank + 1) * each)


def redeal(
    remaining, rank: int, world_size: int, remainder: str = "drop", *, equal: bool = False
) -> list:
    """This rank's share of ``remaining`` (ranges in global order) in a new split; with
    ``equal``, every rank's share the same size (``"drop"`` leaves out fewer than
    ``world_size``)."""
    _check(rank, world_size, remainder)
    if remainder == "drop" and equal:
        each = length(remaining) // world_size
        return _cut(remaining, rank * each, (rank + 1) * each)
    if remainder == "drop":
        return part(remaining, rank, world_size)
    each = math.ceil(length(remaining) / world_size)
    return _cyclic_cut(remaining, rank * each, (rank + 1) * each)
