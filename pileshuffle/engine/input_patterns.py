"""What one ``--input`` pattern names: the files, and the names it matched that are no input.

A name that exists as given is taken literally (brackets in names work); local wildcards are
matched by our own walk, which sees what Beam's match drops silently (folders, dangling
symbolic links), ``gs://`` patterns through Beam (``storage.match``). What a wildcard matched
that is no input file is set aside with why: Hadoop's and Spark's markers and hidden files, and
checksum files. A folder named as input is refused, with the pattern that reads its files.
"""

import os
import re

from pileshuffle.errors import InputError
from pileshuffle.io import storage
from pileshuffle.names import WORK_DIRECTORY, is_store_file

__all__ = ["list_pattern"]

_WILDCARDS = re.compile(r"[*?\[]")
_MARKER_OR_HIDDEN = "a marker or hidden file"
_CHECKSUM = "a checksum file (.crc)"


def _not_input(path: str, root: str) -> str:
    """Why a file a wildcard matched is no input file, or "": Hadoop's and Spark's rule for
    the entries below ``root`` (``_SUCCESS``, ``_committed_*``, ``_started_*``, ``_temporary/``,
    ``.name.crc``, any name starting with ``_`` or ``.``), and checksum files."""
    below = path[len(root) :].replace("\\", "/").strip("/").split("/")
    if any(part.startswith(("_", ".")) for part in below):
        return _MARKER_OR_HIDDEN
    if path.endswith(".crc"):
        return _CHECKSUM
    return ""


def list_pattern(pattern: str):
    """``({path: size}, {path: why})``: the files ``pattern`` names, and the names it
    matched that are not input files. A name that exists as given is taken literally
    (brackets in names work); wildcards follow Beam's ``FileSystems.match`` (``*`` within a
    folder, ``**`` across folders). A trailing ``/`` changes nothing: a folder is refused
    with or without it (``_refuse_folder``), so a pattern never reads a folder's files unasked."""
    pattern = pattern.rstrip("/\\") or pattern
    if not storage.is_remote(pattern):
        if os.path.lexists(pattern):
            return _literal_local_file(pattern), {}
        if not _WILDCARDS.search(pattern):
            return {}, {}
        found, skipped = _walk_local_pattern(pattern)
        # brackets in folder or file names, not a set
        if not found and not skipped and "[" in pattern:
            found, skipped = _walk_local_pattern(_brackets_literal(pattern))
    else:
        found = _match_remote(pattern)
        if not found and "[" in pattern:
            found = _match_remote(_brackets_literal(pattern))
        if not _WILDCARDS.search(pattern):
            if not found and _is_remote_folder(pattern):
                _refuse_folder(pattern)
            return found, {}
        skipped = {}
    root = (
        os.path.dirname(_WILDCARDS.split(pattern, 1)[0])
        if not storage.is_remote(pattern)
        else _WILDCARDS.split(pattern, 1)[0].rsplit("/", 1)[0]
    )
    for path in list(found):
        why = _not_input(path, root)
        if why and not is_store_file(path) and not WORK_DIRECTORY.search(path):
            skipped[path] = why
            del found[path]
    return found, skipped


def _brackets_literal(pattern: str) -> str:
    """``pattern`` with its ``[`` taken as a character (Beam has no escape),
    ``*`` and ``?`` kept."""
    return pattern.replace("[", "[\\[]")


def _refuse_folder(path: str):
    """A folder named as input: say which pattern reads its files."""
    files = os.path.join(path, "*") if not storage.is_remote(path) else f"{path}/*"
    raise InputError(path, f"is a folder: give a pattern for its files, such as '{files}'")


def _is_remote_folder(path: str) -> bool:
    """Whether objects exist below ``path/`` (a folder on ``gs://``; asked only when no
    object is named ``path``)."""
    try:
        return bool(_match_remote(f"{path}/*"))
    except InputError:
        return False


def _literal_local_file(path: str) -> dict:
    """``{path: size}`` of a local name given without wildcards;
    a folder or a dangling link is refused."""
    if os.path.isdir(path):
        _refuse_folder(path)
    if not os.path.exists(path):
        raise InputError(path, "is a dangling symbolic link (what it points to does not exist)")
    return {path: os.path.getsize(path)}


def _walk_local_pattern(pattern: str):
    """Beam's match of a local wildcard pattern, with the entries it drops silently named:
    ``({file: size}, {path: why})`` for folders and dangling symbolic links."""
    regex = storage.pattern_regex(pattern)
    root = os.path.dirname(_WILDCARDS.split(pattern, 1)[0])
    depth = None if "**" in pattern else pattern[len(root) :].strip("/").count("/") + 1
    found, folders, dangling = {}, [], []
    for directory, dirs, files in os.walk(root or "."):
        level = (
            0
            if directory == (root or ".")
            else directory[len(root or ".") :].strip("/").count("/") + 1
        )
        folder_names = set(dirs)
        for name in dirs + files:
            path = (
                os.path.join(directory, name)
                if root
                else os.path.relpath(os.path.join(directory, name))
            )
            if not regex.match(path):
                continue
            if name in folder_names:
                folders.append(path)
            elif not os.path.exists(path):
                dangling.append(path)
            else:
                try:
                    found[path] = os.path.getsize(path)
                except OSError:  # gone meanwhile
                    pass
        if depth is not None and level + 1 >= depth:
            dirs[:] = []
    holding = {os.path.dirname(p) for p in found}
    skipped = {
        f: "a folder"
        for f in folders
        if not any(h == f or h.startswith(f + os.sep) for h in holding)
    }
    skipped.update({d: "a dangling symbolic link" for d in dangling})
    return found, skipped


def _match_remote(pattern: str) -> dict:
    """``{path: size}`` of what a remote pattern matches;
    a listing failure is an InputError naming it."""
    try:
        return {f.path: f.size for f in storage.match(pattern)}
    except InputError as error:
        raise InputError(pattern, f"cannot be listed: {error.problem}") from None
    except Exception as error:
        raise InputError(pattern, f"cannot be listed: {error}") from error
