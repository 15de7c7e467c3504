"""A shard output's files and what vouches for each: its manifest (a finished output), a
publication journal (an unfinished one), or nothing (someone else's file).

Only files that a run's own records list may be replaced: the output's manifest (its
shards and itself, replaced with --overwrite) and the journals in the staging folder (a
publication that did not finish: what it was creating and deleting, replaced by the next
run). A journal is written before Finalize changes any final name and removed with the
staging folder after the manifest is in place. Any other file named like a shard of the
output is someone else's: a run refuses it, naming it, and never replaces or deletes it.
How a manifest records a schema (``schema_json``) is here, for the run, the store and verify.
"""

import dataclasses
import json
import logging
import os
import uuid

from pileshuffle.engine import memory_runs
from pileshuffle.engine.fragments import write_failure
from pileshuffle.errors import InputError, OutputError
from pileshuffle.io import storage
from pileshuffle.names import (
    JOURNAL_PREFIX,
    MANIFEST_SUFFIX,
    SHARD_TAIL,
    format_problem,
    journal_name,
    literal_pattern,
    manifest_path,
    shard_pattern,
    staging_dir,
)

__all__ = [
    "OutputFiles",
    "read_manifest",
    "file_name",
    "write_journal",
    "check_replaceable",
    "discard_unpublished",
    "remove_tree",
    "missing_local_folders",
    "remove_empty_folders",
    "lock_holder_at",
    "release_lock_file",
    "schema_json",
]


def read_manifest(prefix: str) -> dict:
    """The manifest of the shard output at ``prefix``;
    refuses a format this pileshuffle cannot read."""
    manifest = storage.read_json(manifest_path(prefix))
    if format_problem(manifest):
        raise InputError(manifest_path(prefix), format_problem(manifest))
    return manifest


def _existing_outputs(prefix: str):
    """Paths of earlier output under ``prefix``: files named like its shards, and its manifest."""
    found = []
    for pattern in (shard_pattern(prefix), literal_pattern(manifest_path(prefix))):
        try:
            found += [f.path for f in storage.match(pattern)]
        except Exception:  # BeamIOError when nothing matches
            pass
    named = len(file_name(prefix))  # the glob matches more than shard numbers: SHARD_TAIL tells
    return sorted(
        p for p in found if p.endswith(MANIFEST_SUFFIX) or SHARD_TAIL.match(file_name(p)[named:])
    )


def file_name(path: str) -> str:
    """The last part of a local or object-store path."""
    return path.replace("\\", "/").rstrip("/").rsplit("/", 1)[-1]


def _read_journals(prefix: str) -> list:
    """The journals of unfinished publications under ``prefix`` (dicts with ``creates`` and
    ``deletes``: final paths); an unreadable journal counts as listing nothing."""
    paths = [
        f.path
        for f in storage.match(
            storage.join(literal_pattern(staging_dir(prefix)), f"{JOURNAL_PREFIX}*.json")
        )
    ]
    journals = []
    for path in sorted(paths):
        try:
            journals.append(storage.read_json(path))
        except Exception:
            continue
    return journals


def write_journal(prefix: str, creates, deletes):
    """Record, before any final name changes, every final path a publication creates or deletes."""
    path = storage.join(staging_dir(prefix), journal_name(uuid.uuid4().hex[:12]))
    try:
        with storage.open_write(path, "uncompressed", "application/json") as handle:
            handle.write(
                json.dumps(
                    {"creates": sorted(creates), "deletes": sorted(deletes)}, indent=1
                ).encode()
            )
    except OSError as error:
        raise write_failure(staging_dir(prefix), error) from error


@dataclasses.dataclass
class OutputFiles:
    """The files under an output prefix's final names, by which record lists them."""

    prefix: str
    manifest: str = None  # the output's manifest, if one is published
    finished: list = dataclasses.field(default_factory=list)  # the shards the manifest lists
    # what an unfinished publication's journal lists
    unpublished: list = dataclasses.field(default_factory=list)
    # named like shards, listed by nothing: not ours
    foreign: list = dataclasses.field(default_factory=list)

    @property
    def replaceable(self) -> list:
        """Every file a run to this prefix may delete, the manifest first (unpublish,
        then delete)."""
        return ([self.manifest] if self.manifest else []) + self.finished + self.unpublished


def _output_files(prefix: str) -> OutputFiles:
    """Sort the files under ``prefix``'s final names by the records that list them."""
    files = OutputFiles(prefix)
    existing = _existing_outputs(prefix)
    listed_by_manifest = set()
    if manifest_path(prefix) in existing:
        files.manifest = manifest_path(prefix)
        try:
            listed_by_manifest = {
                file_name(s["path"]) for s in read_manifest(prefix).get("shards", [])
            }
        except Exception:  # unreadable: it vouches for no shard
            pass
    journaled = {
        file_name(p)
        for journal in _read_journals(prefix)
        for p in list(journal.get("creates", [])) + list(journal.get("deletes", []))
    }
    for path in existing:
        if path == files.manifest:
            continue
        if file_name(path) in listed_by_manifest:
            files.finished.append(path)
        elif file_name(path) in journaled:
            files.unpublished.append(path)
        else:
            files.foreign.append(path)
    return files


def check_replaceable(prefix: str, overwrite: bool) -> OutputFiles:
    """The output's files, if a run to ``prefix`` may go ahead: none is someone else's
    (with or without ``overwrite``), and a finished output is replaced only with ``overwrite``."""
    files = _output_files(prefix)
    if files.foreign:
        raise OutputError(
            f"{files.foreign[0]} is named like a shard of --output {prefix} but no pileshuffle "
            f"run wrote it (neither {manifest_path(prefix)} nor a journal in "
            f"{staging_dir(prefix)} lists it); pileshuffle never replaces or "
            f"deletes such a file: move it, or choose another --output"
            + (f" ({len(files.foreign)} such files)" if len(files.foreign) > 1 else "")
        )
    if files.manifest and not overwrite:
        raise OutputError(
            f"output already exists: {(files.finished or [files.manifest])[0]} "
            "(pass --overwrite to replace it)"
        )
    return files


def discard_unpublished(prefix: str) -> list:
    """Delete what a publication that never finished left under final names (what its
    journals list, when no manifest is published), then the staging folder. Returns the
    paths deleted. Call only under the output's lock (or from the run that wrote them)."""
    files = (
        _output_files(prefix) if not storage.exists(manifest_path(prefix)) else OutputFiles(prefix)
    )
    if files.unpublished:
        storage.delete(files.unpublished)
    remove_tree(staging_dir(prefix))
    return files.unpublished


def missing_local_folders(directory: str) -> list:
    """The folders of a local ``directory`` that do not exist yet, deepest first."""
    missing = []
    if "://" in directory:
        return missing
    folder = os.path.abspath(directory)
    while not os.path.exists(folder) and os.path.dirname(folder) != folder:
        missing.append(folder)
        folder = os.path.dirname(folder)
    return missing


def remove_empty_folders(folders: list):
    """Remove ``folders`` (``missing_local_folders``', deepest first) while they are empty: what
    a command created and left nothing in; one that holds files (another run's) stays."""
    for folder in folders:
        try:
            os.rmdir(folder)
        except OSError:
            break


def remove_tree(directory: str):
    """Delete a directory tree if it exists, local or on an object store, and forget the runs kept
    in memory under it (``memory_runs``). A failure does not stop the command (leftovers are only
    temp files, which the next run to the same output removes), but it is reported, naming the
    folder and why, on stderr."""
    memory_runs.drop(directory)  # the runs kept in memory under it, too
    try:
        storage.delete_tree(directory)
    except Exception as error:  # noqa: BLE001 - reported, not swallowed
        logging.getLogger("pileshuffle").warning(
            "could not remove %s (%s): delete it by hand, or run the same command "
            "again to the same output",
            directory,
            error,
        )


def lock_holder_at(path: str):
    """The holder (dict) of the lock file at ``path`` (``store.lock.FileLock``), None if
    unlocked."""
    try:
        return storage.read_json(path)
    except Exception:
        return {} if storage.exists(path) else None


def release_lock_file(path: str, token: str):
    """Remove the lock file at ``path`` if ``token`` still holds it (best effort): what a lock's
    holder does, and a job handed a shard output's lock once it has published."""
    try:
        if (lock_holder_at(path) or {}).get("token") == token:
            storage.delete([path])
    except Exception:
        pass


def schema_json(schema) -> dict:
    """An Arrow schema as a manifest records it (its ``schema``): each field's name, type and
    nullability, and the metadata as text."""
    metadata = {
        k.decode(errors="replace"): v.decode(errors="replace")
        for k, v in (schema.metadata or {}).items()
    }
    return {
        "fields": [{"name": f.name, "type": str(f.type), "nullable": f.nullable} for f in schema],
        "metadata": metadata,
    }
