"""Opening a finished output for reading: what is at a path (a shard output's manifest, a
store's current or named manifest version), as an ``Output`` of ``PileRef``s, with the
identity a loader state must match. Reads through ``pileshuffle.io.storage``; never imports Beam.

- a shard output (``{P}-manifest.json``): pile i is shard i, in file order;
- a pile store (``{P}-store/manifest-*.json``, the highest version is current): pile i is
  its Arrow IPC files over the live generations, in (generation, writer) order; a pile
  whose files hold more than the store's ``max_pile_bytes`` opens as sub-piles.
"""

import dataclasses
import hashlib
import json
import math
import posixpath

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pileshuffle import names
from pileshuffle.errors import InputError
from pileshuffle.formats import FORMATS
from pileshuffle.io import storage
from pileshuffle.io.copy_marks import hidden_rows
from pileshuffle.io.unfinished import unfinished_run
from pileshuffle.loader.cache import FileFacts, caches, remote_name
from pileshuffle.loader.piles import (
    BYTES_SCHEMA,
    NoOutputError,
    PileRef,
    Source,
    file_exists,
    read_json,
    resolve,
    sub_pile_of,
)
from pileshuffle.names import HASH_COLUMN, KEY_COLUMN
from pileshuffle.records.fingerprint import Fingerprint, total

__all__ = ["Output", "open_output", "store_version_of"]

# the most sub-piles one store pile opens as, however small ``max_pile_bytes`` is
_MAX_SUB_PILES = 1024


@dataclasses.dataclass(frozen=True)
class Output:
    """A finished output: its piles, format, what it holds, and where it is."""

    location: str
    format: str
    piles: tuple
    schema: pa.Schema
    fingerprint: Fingerprint
    kind: str  # "shards" | "store"
    identity: dict  # what a loader state must match to be resumed here (``_identity_of``)

    @property
    def records(self) -> int:
        return sum(p.records for p in self.piles)

    @property
    def decoded(self) -> bool:
        """Piles load decoded into Arrow's pool (Parquet), which keeps freed pages: worth
        handing back (``release_unused``) once a pile is dropped."""
        return self.format == "parquet"


def _identity_of(kind: str, manifest: dict, fingerprint: Fingerprint) -> dict:
    """The identity of the records *and their order*: a re-run that writes the same bytes
    (same input, seed, piles) has the same identity; another seed or number of piles, or a
    store version with other generations, has another. The fingerprint alone is blind to
    order: a re-run with another seed has the same one."""
    if kind == "shards":
        layout = [[int(s["records"]), int(s.get("bytes") or 0)] for s in manifest["shards"]]
    else:
        layout = [[int(g["generation"]), g["fingerprint"]] for g in manifest["generations"]]
        layout.append(int(manifest.get("max_pile_bytes") or 0))
    seed = manifest.get("seed")
    basis = [
        kind,
        manifest.get("format"),
        seed,
        int(manifest["num_piles"]),
        layout,
        fingerprint.to_json(),
    ]
    digest = hashlib.sha256(json.dumps(basis, sort_keys=True).encode()).hexdigest()[:16]
    return {
        "kind": kind,
        "records": fingerprint.records,
        "piles": int(manifest["num_piles"]),
        "seed": seed,
        "digest": digest,
    }


def _prefix_and_kind(fs, path: str):
    """``(prefix, explicit store manifest or None)`` from a prefix or a manifest path."""
    path = path.rstrip("/")
    if names.prefix_of_manifest(path):
        return names.prefix_of_manifest(path), None
    folder = posixpath.dirname(path)
    if names.STORE_MANIFEST_NAME.match(posixpath.basename(path)) and folder.endswith(
        names.STORE_SUFFIX
    ):
        return folder[: -len(names.STORE_SUFFIX)], path
    if path.endswith(names.STORE_SUFFIX):
        return path[: -len(names.STORE_SUFFIX)], None
    return path, None


def open_output(path: str, filesystem=None, columns=None, cache=None) -> Output:
    """The finished output at ``path``: a prefix, ``{P}-manifest.json``, ``{P}-store`` or
    one of its ``manifest-*.json`` (that version). Refuses a path with no manifest. Its piles'
    files are read through ``cache`` (a ``loader.cache.PileCache``) when they are remote."""
    fs, fs_path = resolve(path, filesystem)
    prefix, store_manifest = _prefix_and_kind(fs, fs_path)
    columns = tuple(columns) if columns is not None else None
    cache = cache if cache is not None and caches(fs) else None  # a local output is read in place
    if store_manifest is None and file_exists(fs, names.manifest_path(prefix)):
        return _open_shards(fs, prefix, columns, cache)
    if store_manifest is None:
        store_manifest = _current_store_manifest(fs, names.store_dir(prefix))
    if store_manifest is None:
        shown = remote_name(fs, prefix)  # as the user wrote it: gs://...
        raise NoOutputError(
            path,
            unfinished_run(prefix, fs, shown)
            or f"no finished output: no {names.manifest_path(shown)} and no store manifest "
            f"({names.store_dir(shown)}/{names.STORE_MANIFEST_GLOB}); {_what_to_give(fs, fs_path)}",
        )
    return _open_store(fs, store_manifest, columns, cache)


def _what_to_give(fs, path: str) -> str:
    """A hint for a path that names no output: the prefix is wanted, not a folder or a shard."""
    shard = names.SHARD_NAME.match(posixpath.basename(path.rstrip("/")))
    if shard:
        return (
            "give the output's prefix "
            f"({posixpath.join(posixpath.dirname(path), shard.group(1))}), not a shard"
        )
    try:
        is_folder = storage.is_folder(path, fs)
    except (OSError, pa.ArrowException):
        is_folder = False
    if is_folder:
        return (
            "this is a folder: give the output's prefix, the --output of the run (e.g. "
            f"{posixpath.join(path.rstrip('/'), 'train')} for "
            f"{posixpath.join(path.rstrip('/'), 'train')}-manifest.json)"
        )
    return "an unfinished run, or a path that is not the run's --output?"


def store_version_of(output: "Output", identity: dict):
    """The manifest path of the version of ``output``'s store whose identity is ``identity``
    (an older version a loader state was saved on), or None."""
    fs, directory = output.piles[0].source.filesystem, posixpath.dirname(output.location)
    for path in reversed(_store_manifests(fs, directory)):
        try:
            manifest = read_json(fs, path)
            fingerprint = total(
                Fingerprint.from_json(g["fingerprint"]) for g in manifest["generations"]
            )
        except (InputError, KeyError, ValueError):
            continue
        if _identity_of("store", manifest, fingerprint) == identity:
            return path
    return None


def _store_manifests(fs, directory: str) -> list:
    """The paths of the store's manifest versions in ``directory``, oldest first."""
    try:
        paths = storage.list_folder(directory, fs)
    except (OSError, pa.ArrowException):
        return []
    versions = sorted(
        (m.group(1), p)
        for p in paths
        if (m := names.STORE_MANIFEST_NAME.match(posixpath.basename(p)))
    )
    return [path for _, path in versions]


def _current_store_manifest(fs, directory: str):
    versions = _store_manifests(fs, directory)
    return versions[-1] if versions else None


def _check_format(manifest: dict, where: str) -> str:
    """The record format of a manifest this loader can read (its format_version, its format)."""
    if names.format_problem(manifest):
        raise InputError(where, names.format_problem(manifest))
    name = manifest.get("format")
    if name not in FORMATS:
        raise InputError(where, f"names format {name!r}; the loader reads {', '.join(FORMATS)}")
    return name


def _listed_size(entry: dict):
    """A file's size as its manifest entry lists it (``bytes``), or None when it lists none."""
    return None if entry.get("bytes") is None else int(entry["bytes"])


def _digest(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:32]


def _open_shards(fs, prefix: str, columns, cache) -> Output:
    where = names.manifest_path(prefix)
    manifest = read_json(fs, where)
    name = _check_format(manifest, where)
    directory = posixpath.dirname(prefix)
    paths = [
        posixpath.join(directory, posixpath.basename(shard["path"])) for shard in manifest["shards"]
    ]
    _check_not_renamed(fs, prefix, paths)
    version = _digest(manifest)  # the whole manifest: any other run written here is another version
    facts = {
        path: FileFacts(_listed_size(shard), version, shard.get("crc32c"))
        for path, shard in zip(paths, manifest["shards"])
    }
    source = Source(name, fs, columns, int(manifest["num_piles"]), cache, facts)
    piles = tuple(
        PileRef(i, int(shard["records"]), (path,), False, source)
        for i, (path, shard) in enumerate(zip(paths, manifest["shards"]))
    )
    schema = _schema(source, piles)
    fingerprint = Fingerprint.from_json(manifest["output_fingerprint"])
    return Output(
        prefix,
        name,
        piles,
        schema,
        fingerprint,
        "shards",
        _identity_of("shards", manifest, fingerprint),
    )


def _check_not_renamed(fs, prefix: str, paths: list):
    """Refuse a shard output whose files were renamed after the run: its manifest names the shards
    as they were written (``P-00000-of-M``), so another prefix means they are not where it says."""
    written = posixpath.basename(paths[0]).rsplit("-", 3)[0] if paths else None
    if written is not None and written != posixpath.basename(prefix):
        shown = remote_name(fs, prefix)
        raise InputError(
            names.manifest_path(shown),
            f"lists shards named {posixpath.basename(paths[0])}, ..., as the "
            f"run wrote them, not {posixpath.basename(shown)}-...: the output "
            f"was renamed after it was written; rename its files back to "
            f"{written}-*",
        )


def _open_store(fs, manifest_path: str, columns, cache) -> Output:
    manifest = read_json(fs, manifest_path)
    if manifest.get("kind") != names.STORE_KIND:
        raise InputError(
            manifest_path,
            f"is not a pileshuffle store manifest (its kind is not {names.STORE_KIND!r})",
        )
    name = _check_format(manifest, manifest_path)
    num_piles = int(manifest["num_piles"])
    directory = posixpath.dirname(manifest_path)
    files, facts, copies = {p: [] for p in range(num_piles)}, {}, {}
    live = frozenset(g["generation"] for g in manifest["generations"])
    for generation in sorted(manifest["generations"], key=lambda g: g["generation"]):
        for entry in sorted(generation["files"], key=lambda f: f["writer"]):
            path = posixpath.join(directory, entry["path"])
            hidden = hidden_rows(entry, live)
            files[int(entry["pile"])].append(
                (path, int(entry["records"]) - hidden, int(entry.get("bytes") or 0))
            )
            facts[path] = FileFacts(
                _listed_size(entry),
                _store_file_version(manifest, generation, entry),
                entry.get("crc32c"),
            )
            if hidden:
                copies[path] = (
                    posixpath.join(directory, entry["copies"]["path"]),
                    entry["copies"].get("crc32c"),
                    live,
                )
    source = Source(name, fs, columns, num_piles, cache, facts, copies)
    limit = int(manifest.get("max_pile_bytes") or 0)
    piles = tuple(ref for p in range(num_piles) for ref in _store_pile(source, p, files[p], limit))
    fingerprint = total(Fingerprint.from_json(g["fingerprint"]) for g in manifest["generations"])
    return Output(
        manifest_path,
        name,
        piles,
        _schema(source, piles),
        fingerprint,
        "store",
        _identity_of("store", manifest, fingerprint),
    )


def _store_file_version(manifest: dict, generation: dict, entry: dict) -> str:
    """A store data file's version: its manifest entry, its generation's number and creation
    time, and the store's seed, piles and format. Appending leaves the versions of the files
    already there as they were; a store written again at the same path has new ones."""
    return _digest(
        [
            manifest.get("seed"),
            manifest.get("num_piles"),
            manifest.get("format"),
            manifest.get("compression"),
            generation.get("generation"),
            generation.get("created"),
            entry,
        ]
    )


def _store_pile(source: Source, pile: int, files: list, limit: int) -> list:
    """The pile's refs: the whole pile, or, when its files hold more than ``limit`` bytes
    (the store's ``max_pile_bytes``; appended generations make piles grow), its sub-piles
    in order, counted from the files' keys."""
    paths = tuple(path for path, _, _ in files)
    size = sum(nbytes for _, _, nbytes in files)
    if not limit or size <= limit:
        return [PileRef(pile, sum(records for _, records, _ in files), paths, True, source)]
    ways = min(_MAX_SUB_PILES, math.ceil(size / limit))
    counts = np.zeros(ways, np.int64)
    for path in paths:
        counts += np.bincount(
            sub_pile_of(source.read_store_keys(path), source.num_piles, ways), minlength=ways
        )
    return [PileRef(pile, int(counts[s]), paths, True, source, (s, ways)) for s in range(ways)]


def _schema(source: Source, piles) -> pa.Schema:
    """What batches hold: ``record`` (binary) for bytes formats, the chosen columns for Parquet."""
    if source.format != "parquet":
        return BYTES_SCHEMA
    path = next((p.files[0] for p in piles if p.files and (p.records or p is piles[-1])), None)
    if path is None:
        return pa.schema([])
    if piles[0].keyed:
        with storage.open_mapped(path, source.filesystem) as stream:
            schema = pa.ipc.open_stream(stream).schema
        schema = pa.schema(
            [f for f in schema if f.name not in (KEY_COLUMN, HASH_COLUMN)], schema.metadata
        )
    else:
        try:
            with storage.open_random_access(path, source.filesystem) as handle:
                schema = pq.ParquetFile(handle).schema_arrow
        except (OSError, pa.ArrowException) as error:
            raise InputError(
                remote_name(source.filesystem, path),
                f"cannot be read as Parquet ({error}); `pileshuffle verify` says how it is damaged",
            ) from error
    if source.columns is None:
        return schema
    missing = [c for c in source.columns if c not in schema.names]
    if missing:
        raise InputError(path, f"has no column(s) {missing}; it has {schema.names}")
    return pa.schema([schema.field(c) for c in source.columns], schema.metadata)
