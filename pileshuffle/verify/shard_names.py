"""The files under an output prefix sorted into one run's shards and everything else.

A complete output is ``{output}-00000-of-M`` .. ``{output}-(M-1)-of-M`` with the format's suffix
and nothing more: a file of another shard count, a temp file or an index out of range is one
line each; missing shards are named one a line up to ``_MISSING_NAMED``, one more line counts
the rest. M is the manifest's ``num_piles``, else the most common count among the names.
"""

import posixpath
from typing import NamedTuple

from pileshuffle.formats import FORMATS
from pileshuffle.io import storage
from pileshuffle.names import SHARD_TAIL, shard_name, shard_pattern
from pileshuffle.verify.wording import describe_count

__all__ = ["matching_files", "basename", "format_of_names", "ShardNames", "sort_shard_names"]
_MISSING_NAMED = 10  # missing shards named one a line; one more line counts the rest


def basename(path: str) -> str:
    """The last part of a local path or object name (either separator on a local one)."""
    return (
        posixpath.basename(path.rstrip("/"))
        if "://" in path
        else path.replace("\\", "/").rsplit("/", 1)[-1]
    )


def matching_files(pattern: str) -> dict:
    """{path: size} of the files matching ``pattern`` (empty when none do)."""
    try:
        return {f.path: f.size for f in storage.match(pattern)}
    except Exception:
        return {}


def format_of_names(prefix: str):
    """The name of the format whose suffix the shard names under ``prefix`` have, or None."""
    suffixes = {
        SHARD_TAIL.match(basename(p)[len(basename(prefix)) :]).group(3)
        for p in matching_files(shard_pattern(prefix))
    }
    return next(
        (f.name for f in FORMATS.values() for s in suffixes if s.startswith(f".{f.name}")),
        None,
    )


class ShardNames(NamedTuple):
    """``shards``: {index: (path, size)} of the run's shards in order; ``total``: M; ``missing``:
    the indices of no file; ``problems``: one line per extra file and missing shard."""

    shards: dict
    total: int
    missing: list
    problems: list


def sort_shard_names(prefix: str, fmt, manifest) -> ShardNames:
    """The files matching the shard pattern under ``prefix`` sorted into the run's shards, with a
    line for each gap and extra."""
    found = matching_files(shard_pattern(prefix))
    compression = (manifest or {}).get("compression")
    expected_suffixes = (
        {fmt.suffix(compression)} if compression else {fmt.suffix("none"), fmt.suffix("gzip")}
    )
    counts, problems = {}, []
    for path in found:
        name = basename(path)
        match = (
            SHARD_TAIL.match(name[len(basename(prefix)) :])
            if name.startswith(basename(prefix))
            else None
        )
        if match is None or match.group(3) not in expected_suffixes:
            problems.append(
                f"{path}: unexpected file under the output prefix (not a {fmt.name} shard name)"
            )
            continue
        counts.setdefault(int(match.group(2)), {})[int(match.group(1))] = (path, found[path])
    declared = (manifest or {}).get("num_piles")
    if declared is not None:
        total = int(declared)
    elif counts:
        total = max(counts, key=lambda m: len(counts[m]))
    else:
        total = 0
    for other in sorted(set(counts) - {total}):
        for index, (path, _) in sorted(counts[other].items()):
            problems.append(f"{path}: shard of another run (of {other:,}, not of {total:,})")
    shards = counts.get(total, {})
    for index in sorted(set(shards) - set(range(total))):
        problems.append(f"{shards[index][0]}: shard index {index} is out of range 0..{total - 1}")
    missing = sorted(set(range(total)) - set(shards))
    problems += _missing_lines(prefix, fmt, manifest, total, missing)
    if not found and total == 0:
        problems.append(f"{prefix}: no shards found")
    in_order = {i: shards[i] for i in range(total) if i in shards}
    return ShardNames(in_order, total, missing, problems)


def _missing_lines(prefix: str, fmt, manifest, total: int, missing: list) -> list:
    """One line per missing shard, with what its manifest lists (one more counts any past
    ``_MISSING_NAMED``)."""
    listed = (manifest or {}).get("shards") or []
    suffix = fmt.suffix((manifest or {}).get("compression") or "none")
    lines = []
    for index in missing[:_MISSING_NAMED]:
        path = shard_name(prefix, index, total, suffix)
        entry = listed[index] if index < len(listed) and isinstance(listed[index], dict) else {}
        held = (
            f" (its manifest lists it with {describe_count(entry.get('records'))} records, "
            f"{describe_count(entry.get('bytes'))} bytes)"
            if entry
            else ""
        )
        lines.append(f"shard {path} is missing{held}")
    if len(missing) > _MISSING_NAMED:
        lines.append(
            f"{len(missing) - _MISSING_NAMED:,} more of the {total:,} shards are missing "
            f"({missing[_MISSING_NAMED]:05d} .. {missing[-1]:05d})"
        )
    return lines
