"""Which files are input, and in which format: comma-separated patterns listed (local
patterns by our own walk, which sees markers and links; ``gs://`` through Beam: each pattern
listed by ``input_patterns``), what a pattern matched that is not input skipped and counted
(markers, hidden and checksum files, folders, dangling links, pileshuffle's own files), one
name per real file, the format from the extensions, and the same columns in every Parquet
file. It only reads."""

import dataclasses
import os
import re

from pileshuffle.engine.input_patterns import list_pattern
from pileshuffle.engine.sources import Source
from pileshuffle.errors import InputError
from pileshuffle.formats import RecordFormat, format_of_name, get_format, known_extensions
from pileshuffle.io import storage
from pileshuffle.names import (
    SHARD_NAME,
    WORK_DIRECTORY,
    is_store_file,
    manifest_path,
    prefix_of_manifest,
)

__all__ = [
    "Inputs",
    "split_patterns",
    "select_inputs",
    "match_inputs",
    "file_identity",
    "resolve_format",
    "check_format_fits",
    "own_file",
    "describe_left_out",
    "describe_skipped",
    "check_schemas",
    "describe_difference",
]


def match_inputs(patterns: str, output: str = None) -> list:
    """Sorted, de-duplicated files matching comma-separated ``patterns``, without
    pileshuffle's own files and what is not an input file (see ``select_inputs``)."""
    return select_inputs(patterns, output).sources


@dataclasses.dataclass
class Inputs:
    """What ``--input`` names: the files to read, and every matched name left out, with why."""

    sources: list
    left_out: dict  # path -> why: files pileshuffle wrote
    # path -> why: matched names that are not input files (markers, hidden files, folders,
    # dangling links)
    skipped: dict
    duplicates: dict  # path -> the name kept: other names of a file already matched


def split_patterns(text: str) -> list:
    """The patterns of a comma-separated ``--input``, each stripped; a comma that is part of a
    path is written ``\\,`` (``--input 'data/a\\,b.jsonl,more/*.jsonl'``)."""
    parts = re.split(r"(?<!\\),", text or "")
    return [p.strip().replace("\\,", ",") for p in parts if p.strip()]


def select_inputs(patterns: str, output: str = None) -> Inputs:
    """The files matching comma-separated ``patterns``, sorted and de-duplicated by their
    real identity (``file_identity``), and every matched name left out: pileshuffle's own
    files (``own_file``), and names a wildcard matched that are no input file (markers, hidden
    and checksum files, folders, dangling symbolic links: ``input_patterns.list_pattern``). A
    name given without wildcards is taken as it is. Every pattern must match a file; a pattern
    whose files are all pileshuffle's own is refused. A pattern that matches only the shards of
    another finished output (and its manifest) keeps them: shuffling an output again."""
    candidates, left_out, skipped = [], {}, {}
    for rank, pattern in enumerate(split_patterns(patterns)):
        found, passed_over = list_pattern(pattern)
        skipped.update(passed_over)
        if not found and not passed_over:
            what = "matches no file" if any(c in pattern for c in "*?[") else "does not exist"
            raise InputError(pattern, what + _home_hint(pattern) + _comma_hint(patterns, rank))
        owned = {path: own_file(path, output, found) for path in found}
        owned = {path: why for path, why in owned.items() if why}
        rest = [path for path in found if path not in owned]
        if not rest and any(why.startswith(_FINISHED_SHARD) for why in owned.values()):
            keep = {path for path, why in owned.items() if why.startswith(_FINISHED_SHARD)}
            owned = {path: why for path, why in owned.items() if path not in keep}
        if found and len(owned) == len(found):
            raise InputError(
                pattern,
                f"matches only files pileshuffle wrote ({describe_left_out(owned)}), "
                "not input: nothing to shuffle",
            )
        if not found:
            raise InputError(
                pattern, f"matches no input file, only {describe_left_out(passed_over)}"
            )
        left_out.update(owned)
        candidates += [(rank, path, size) for path, size in found.items() if path not in owned]
    if not candidates:
        raise InputError(patterns, "names no file")
    paths, duplicates = _one_name_per_file(candidates)
    sources = [Source(i, path, paths[path]) for i, path in enumerate(sorted(paths))]
    return Inputs(sources, left_out, skipped, duplicates)


def _home_hint(pattern: str) -> str:
    """For a pattern that starts with ``~`` (``storage.unexpanded_home``): the pattern meant."""
    advice = storage.unexpanded_home(pattern)
    return f" ({advice})" if advice else ""


_COMMAS_TRIED = 3  # a path's commas that _comma_hint puts back, on each side of the pattern


def _comma_hint(patterns: str, rank: int) -> str:
    """When the ``rank``-th pattern of ``patterns`` names nothing but, joined again to its
    neighbours at the commas that split it off, names files: the escape that keeps that comma
    in the path (``\\,``); else ""."""
    parts = re.split(r"(?<!\\),", patterns or "")
    kept = [i for i, part in enumerate(parts) if part.strip()]
    at = kept[rank] if rank < len(kept) else None
    if at is None:
        return ""
    for first in range(at, max(-1, at - _COMMAS_TRIED), -1):
        for last in range(at, min(len(parts), at + _COMMAS_TRIED)):
            if first == last:
                continue
            joined = ",".join(parts[first : last + 1]).strip()
            if _names_something(joined.replace("\\,", ",")):
                escaped = joined.replace("\\,", ",").replace(",", "\\,")
                whole = ",".join([*parts[:first], escaped, *parts[last + 1 :]])
                return (
                    f" (--input splits its patterns at commas; a comma that is part of a path is "
                    f"written \\,: --input '{whole}')"
                )
    return ""


def _names_something(pattern: str) -> bool:
    """Whether ``pattern`` (one, not split at commas) names a file or a folder's files."""
    try:
        found, passed_over = list_pattern(pattern)
    except InputError:  # a folder, a dangling link: something is there
        return True
    return bool(found or passed_over)


def _one_name_per_file(candidates):
    """``({path: size}, {dropped name: kept name})`` from ``(pattern rank, path, size)``
    triples: one name per real file (``file_identity``), the one from the earliest
    pattern, a file's own name before a symbolic link's, then the first in sort order; so
    naming a file again changes nothing, not even the order of the output."""
    groups = {}
    for rank, path, size in candidates:
        groups.setdefault(file_identity(path), {})[path] = (rank, size)
    paths, duplicates = {}, {}
    for names in groups.values():
        kept = min(
            names,
            key=lambda p: (
                names[p][0],
                len(names) > 1 and not storage.is_remote(p) and os.path.islink(p),
                p,
            ),
        )
        paths[kept] = names[kept][1]
        duplicates.update({name: kept for name in names if name != kept})
    return paths, duplicates


def file_identity(path: str) -> str:
    """What makes two names one file: the resolved real path on a local disk (relative
    names, ``./``, absolute paths and symbolic links), else the location itself
    (``gs://bucket/object``)."""
    return os.path.realpath(path) if not storage.is_remote(path) else path


def resolve_format(requested: str, sources) -> RecordFormat:
    """``--format``, or with ``auto`` the format every input file's name says
    (``formats.FORMAT_OF_EXTENSION``); a name that says none, or two names that disagree,
    are refused."""
    if requested and requested != "auto":
        return get_format(requested)
    first = None
    for source in sources:
        name = format_of_name(source.path)
        if name is None:
            raise InputError(source.path, _unknown_format(source.path, sources))
        if first is None:
            first = (name, source.path)
        elif name != first[0]:
            raise InputError(
                source.path,
                f"is {name} by its name but {first[1]} is {first[0]}: one run reads one "
                "format (give --format to read every file as one format)",
            )
    return get_format(first[0])


def _unknown_format(path: str, sources) -> str:
    """Why ``path``'s format is unknown, and what to do: narrow a pattern that also matches
    files of a known format (a README.md beside the data), else give --format."""
    known = sorted({format_of_name(s.path) for s in sources} - {None})
    if len(known) == 1:
        return (
            f"matched beside {known[0]} files, and its name says no format: narrow --input to "
            f"the data (e.g. a pattern ending in *.{known[0]}), or give --format to read every "
            "matched file as one format"
        )
    return (
        f"cannot tell its format from its name (known extensions: {known_extensions()}, each "
        "may end in .gz but .parquet): give --format"
    )


def check_format_fits(sources, format_name: str, holder: str):
    """Refuse an input file whose name says another format than ``holder``'s."""
    for source in sources:
        name = format_of_name(source.path)
        if name is not None and name != format_name:
            raise InputError(
                source.path,
                f"is {name} (by its name) but {holder} holds {format_name} records: "
                "the formats differ",
            )


_FINISHED_SHARD = "a shard of the finished output "


def own_file(path: str, output: str, matched) -> str:
    """Why ``path`` is a file pileshuffle wrote, or "" if it is not: a manifest, a shard of
    this run's output or of a finished output (its manifest exists), a file under a staging
    or work directory, or a pile store's file (``{P}-store/``)."""
    if WORK_DIRECTORY.search(path):
        return "a staging, work or lock file"
    if is_store_file(path):
        return "a pile store's file"
    if prefix_of_manifest(path) and _is_shard_manifest(path):
        return f"the manifest of {prefix_of_manifest(path)}"
    shard = SHARD_NAME.match(path)
    if shard:
        prefix = shard.group("prefix")
        if output is not None and prefix == output:
            return f"a shard of this run's output {prefix}"
        if manifest_path(prefix) in matched or storage.exists(manifest_path(prefix)):
            return f"{_FINISHED_SHARD}{prefix}"
    return ""


def _is_shard_manifest(path: str) -> bool:
    """Whether ``path`` holds a shard output's manifest
    (a JSON object with ``shards`` and ``num_piles``)."""
    try:
        manifest = storage.read_json(path)  # whole: a manifest of 100,000 shards passes 16 MiB
    except Exception:
        return False
    return isinstance(manifest, dict) and "shards" in manifest and "num_piles" in manifest


def describe_left_out(left_out: dict) -> str:
    """``{path: why}`` in a few words: "3 shards of the finished output data/a,
    the manifest of data/a"."""
    counts = {}
    for why in left_out.values():
        counts[why] = counts.get(why, 0) + 1
    return ", ".join(why if n == 1 else f"{n} x {why}" for why, n in sorted(counts.items()))


def describe_skipped(skipped: dict) -> str:
    """``{path: why}`` by reason, each with a few of its names:
    "2 x a folder (_temporary, logs)"."""
    groups = {}
    for path, why in sorted(skipped.items()):
        groups.setdefault(why, []).append(path.replace("\\", "/").rstrip("/").rsplit("/", 1)[-1])
    return ", ".join(
        f"{len(names)} x {why} ({', '.join(names[:3])}{', ...' if len(names) > 3 else ''})"
        for why, names in groups.items()
    )


# columns the piles add to every record (names.KEY_COLUMN, names.HASH_COLUMN)
RESERVED_PREFIX = "_pileshuffle_"


def check_schemas(fmt, sources):
    """The common schema of all sources (Parquet), or None; a mismatch names both files
    and the first difference, a column pileshuffle reserves (``RESERVED_PREFIX``) the file."""
    first_schema, first_path = None, None
    for source in sources:
        schema = fmt.check_source(source.path)
        if schema is None:
            continue
        reserved = [name for name in schema.names if name.startswith(RESERVED_PREFIX)]
        if reserved:
            raise InputError(
                source.path,
                f"has a column named {reserved[0]!r}: names starting {RESERVED_PREFIX!r} are "
                "pileshuffle's own (each record's key and hash in the piles); rename it",
            )
        if first_schema is None:
            first_schema, first_path = schema, source.path
        elif not schema.equals(first_schema, check_metadata=False):
            raise InputError(
                source.path,
                f"has a different schema from {first_path}: "
                f"{describe_difference(first_schema, schema)}",
            )
    return first_schema


def describe_difference(expected, actual) -> str:
    """What differs between two Arrow schemas, in a line: the columns missing, extra or of
    another type, else the first column out of order or of another nullability."""
    expected_fields = {f.name: str(f.type) for f in expected}
    actual_fields = {f.name: str(f.type) for f in actual}
    parts = [f"missing column {n!r}" for n in expected_fields if n not in actual_fields]
    parts += [f"extra column {n!r}" for n in actual_fields if n not in expected_fields]
    parts += [
        f"column {n!r} is {actual_fields[n]}, not {t}"
        for n, t in expected_fields.items()
        if n in actual_fields and actual_fields[n] != t
    ]
    if parts:
        return "; ".join(parts)
    for i, (here, there) in enumerate(zip(actual, expected)):
        if here.name != there.name:
            return (
                f"the same columns in another order: column {i} is {here.name!r} here, "
                f"{there.name!r} there (write the files with one column order)"
            )
        if here.nullable != there.nullable:
            here_not, there_not = ("", "not ") if here.nullable else ("not ", "")
            return f"column {here.name!r} is {here_not}nullable here, {there_not}there"
        if not here.type.equals(there.type):
            return f"column {here.name!r} is {here.type} here, {there.type} there"
    return "their field metadata differs"
