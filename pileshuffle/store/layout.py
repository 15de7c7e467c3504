"""Where a pile store's files live, and its manifests: read and publish (its lock: ``store.lock``).

A store at prefix ``P`` is the directory ``{P}-store/``:
``manifest-{version:08d}.json`` (one per published version, the highest is current) and
``g{generation:06d}/p{pile:05d}-w{writer:05d}.arrows`` (Arrow IPC streams of one pile's
records from one writer, with each record's key U and pass-1 hash).

Invariants:
- a data file is written under a temporary name and renamed; it is never rewritten once
  a published manifest lists it;
- a manifest version is written last (temporary name, then an exclusive rename) and
  never replaced: publishing version v fails if v already exists;
- every command that changes the store holds ``LOCK`` (created exclusively, naming its
  holder) from before it reads the current version until after it publishes;
- generation numbers are never reused: ``next_generation`` grows only by publishing, so
  the one directory an unpublished (killed) write can leave is ``g == next_generation``,
  and a generation below it that the current manifest does not list is expired.
"""

import datetime
import json
import os
import uuid

from pileshuffle.engine.balance import from_manifest_options, manifest_options
from pileshuffle.errors import InputError, OutputError
from pileshuffle.io import storage
from pileshuffle.io.copy_marks import hidden_rows
from pileshuffle.names import (
    GENERATION_DIR,
    LEGACY_STORE_FORMAT,
    STORE_KIND,
    STORE_MANIFEST_GLOB,
    STORE_SUFFIX,
    format_problem,
    generation_dir_name,
    manifest_header,
    store_dir,
)
from pileshuffle.names import STORE_MANIFEST_NAME as MANIFEST_NAME
from pileshuffle.names import store_manifest_name as manifest_name
from pileshuffle.version import __version__

__all__ = [
    "clean_prefix",
    "store_prefix",
    "existing_store",
    "is_store",
    "join",
    "now_iso",
    "parse_time",
    "list_names",
    "manifest_versions",
    "generation_dirs",
    "read_store_manifest",
    "VersionConflict",
    "publish_manifest",
    "new_manifest",
    "next_manifest",
    "visible_records",
    "store_balance",
    "store_dedup",
    "remove_unpublished",
]


def clean_prefix(prefix: str) -> str:
    """``prefix`` without trailing slashes (local paths only: a remote prefix is kept as given)."""
    return prefix.rstrip("/") if "://" not in prefix else prefix


def store_prefix(given: str) -> str:
    """The prefix P of the store that ``given`` names: ``P`` or its folder ``P-store``
    (the loader takes both), with or without a trailing slash."""
    prefix = clean_prefix(given)
    bare = prefix[: -len(STORE_SUFFIX)]
    if prefix.endswith(STORE_SUFFIX) and not is_store(prefix) and is_store(bare):
        return bare
    return prefix


def join(directory: str, relative: str) -> str:
    """``directory`` joined with a store-relative path (``g000000/p00000-w00000.arrows``:
    always ``/``)."""
    return storage.join(directory, *relative.split("/"))


def now_iso() -> str:
    """The time now in UTC as manifests and locks write it: ISO 8601 with microseconds and ``Z``."""
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(text: str) -> datetime.datetime:
    """An ISO 8601 time ('2026-11-23', '2026-11-23T20:00:00Z'); naive times are UTC."""
    value = datetime.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    return value if value.tzinfo else value.replace(tzinfo=datetime.timezone.utc)


def list_names(directory: str) -> list:
    """Base names of the entries directly under ``directory`` (files, and for local
    directories, sub-directories); empty if it does not exist."""
    if not storage.is_remote(directory):
        try:
            return sorted(os.listdir(directory))
        except (FileNotFoundError, NotADirectoryError):
            return []
    found = storage.match(storage.join(directory, "**"))
    base = directory.rstrip("/") + "/"
    return sorted({f.path[len(base) :].split("/", 1)[0] for f in found if f.path.startswith(base)})


def manifest_versions(prefix: str) -> list:
    """Published versions, ascending."""
    directory = store_dir(prefix)
    if not storage.is_remote(directory):
        names = list_names(directory)
    else:  # list the manifests only, not every data file
        names = [
            f.path.rsplit("/", 1)[-1]
            for f in storage.match(storage.join(directory, STORE_MANIFEST_GLOB))
        ]
    return sorted(int(m.group(1)) for m in map(MANIFEST_NAME.match, names) if m)


def generation_dirs(prefix: str) -> list:
    """Generation numbers that have a directory under the store, ascending."""
    return sorted(
        int(m.group(1)) for m in map(GENERATION_DIR.match, list_names(store_dir(prefix))) if m
    )


def read_store_manifest(prefix: str, version: int = None) -> dict:
    """The manifest of ``version`` (default: the current one); None if no version exists."""
    if version is None:
        versions = manifest_versions(prefix)
        if not versions:
            return None
        version = versions[-1]
    path = storage.join(store_dir(prefix), manifest_name(version))
    manifest = storage.read_json(path)
    if format_problem(manifest):
        raise InputError(path, format_problem(manifest))
    return manifest


def is_store(prefix: str) -> bool:
    """Whether a store exists at ``prefix``: it has at least one published manifest version."""
    return bool(manifest_versions(clean_prefix(prefix)))


def _write_exclusive(path: str, data: bytes):
    """Write ``data`` to ``path`` (temporary name, then rename), failing if ``path``
    exists. Local: an atomic hard link, so two writers cannot both succeed. Elsewhere
    (gs://): checked just before the rename, and the store lock is what excludes."""
    directory, name = path.rsplit("/", 1) if "/" in path else (".", path)
    try:
        storage.create_exclusive(
            path, data, storage.join(directory, f".{name}.tmp-{uuid.uuid4().hex[:12]}")
        )
    except FileExistsError:
        raise VersionConflict(path) from None


class VersionConflict(OutputError):
    """The manifest version being published exists already: another command published first,
    nothing was published."""

    def __init__(self, path):
        super().__init__(
            f"{path} appeared while this command ran (another append or expire published it); "
            f"nothing was published: run the command again"
        )


def publish_manifest(prefix: str, manifest: dict):
    """Publish ``manifest`` as its version; refuses if that version exists."""
    data = json.dumps(manifest, indent=1).encode()
    _write_exclusive(storage.join(store_dir(prefix), manifest_name(manifest["version"])), data)


def new_manifest(
    format_name, compression, num_piles, seed, max_pile_bytes, schema=None, balance=None, dedup=None
) -> dict:
    """Version 0: the empty store a first generation is published onto; ``balance``
    (``(label field, balance.Policy, keep_unlabeled)``, recorded as ``balance.manifest_options``)
    balances every generation it will hold; ``dedup`` (a ``dedup.Dedup``) keeps each distinct
    record of the live window once (``store.copies``)."""
    manifest = {
        **manifest_header(STORE_KIND),
        "store_format": LEGACY_STORE_FORMAT,
        "version": 0,
        "pileshuffle_version": __version__,
        "format": format_name,
        "compression": compression,
        "num_piles": int(num_piles),
        "seed": int(seed),
        "max_pile_bytes": int(max_pile_bytes),
        "next_generation": 0,
        "generations": [],
        "totals": {"records": 0, "payload_bytes": 0},
    }
    if schema is not None:
        manifest["schema"] = schema
    if balance is not None:
        manifest["options"] = manifest_options(*balance)
    if dedup is not None:
        manifest["options"] = dedup.options()
    return manifest


def store_balance(manifest: dict):
    """``(label field, balance.Policy, keep_unlabeled)`` that balances each of the store's
    generations on its own class counts, or None (a store created without ``--balance``)."""
    return from_manifest_options(manifest.get("options") or {})


def store_dedup(manifest: dict):
    """The ``dedup.Dedup`` of a store created with ``--dedup`` (every generation keyed by content,
    each distinct record of the window visible once), or None."""
    from pileshuffle.engine.dedup import Dedup

    return Dedup.from_options(manifest.get("options"))


def next_manifest(base: dict, generations: list, next_generation: int = None) -> dict:
    """The version after ``base`` with ``generations`` live (ascending by number)."""
    generations = sorted(generations, key=lambda g: g["generation"])
    manifest = {
        **base,
        **manifest_header(STORE_KIND),
        "version": base["version"] + 1,
        "pileshuffle_version": __version__,
        "published": now_iso(),
        "generations": generations,
        "next_generation": max(base.get("next_generation", 0), next_generation or 0),
    }
    manifest["totals"] = {
        "records": sum(g["records"] for g in generations),
        "payload_bytes": sum(g["payload_bytes"] for g in generations),
    }
    # the rows a reader gets: each distinct record of the window once
    if store_dedup(base) is not None:
        manifest["totals"]["distinct"] = visible_records(generations)
    return manifest


def visible_records(generations: list) -> int:
    """The rows readers get of a dedup store whose live generations are ``generations``: every row
    but those hidden by a live earlier copy (``copy_marks``)."""
    live = {g["generation"] for g in generations}
    return sum(f["records"] - hidden_rows(f, live) for g in generations for f in g["files"])


def remove_unpublished(prefix: str):
    """Delete what a command that never published left: the directory of generation
    ``next_generation`` (the only number an unpublished write uses, since it grows only by
    publishing). Only under the lock. Returns whether there was one."""
    generation = (read_store_manifest(prefix) or {}).get("next_generation", 0)
    path = storage.join(store_dir(prefix), generation_dir_name(generation))
    return storage.delete_tree(path)


def existing_store(given: str) -> str:
    """The prefix of the store ``given`` names; refuses, before anything is created or
    locked, when there is none (so a refused command leaves no empty ``-store`` folder)."""
    prefix = store_prefix(given)
    if not is_store(prefix):
        remedy = storage.unexpanded_home(given) or (
            f"create one with `pileshuffle run --layout store --output {prefix} --input ...`"
        )
        raise OutputError(f"no store at {store_dir(prefix)}: {remedy}")
    return prefix
