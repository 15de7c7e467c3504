"""A local cache of remote piles: one folder on a training host's disk that keeps the files of
loaded piles (shards, store data files) read from an object store (gs://, s3://), so a later
epoch reads them from local disk. Local outputs are never cached: they are read in place.

Invariants:
- An entry's name is a digest of the remote file's location and of what its manifest says of
  it (its size and a version: the shard manifest's digest, or the store file's entry), so
  another output written at the same path never hits an old entry.
- An entry appears whole or not at all: fetched into a temp file in the folder, checked (its
  size against the manifest and the object; its CRC32C against the one the object store lists,
  when it lists one), then ``os.replace``d onto its name. No reader sees a torn file; two
  processes fetching one file at once write equal bytes and one replace wins.
- A hit checks the entry's size (a truncated entry is dropped and fetched again) and refreshes
  its mtime; after a file is added, the least recently used entries are deleted until the total
  is within the limit, never the one just added. Processes sharing the folder (the DataLoader
  workers of a host) tolerate each other's deletions.
- A copy that cannot be read (evicted by another process before it was opened; or damaged in
  place, which the reader's own checks catch, e.g. TFRecord's CRCs) is dropped and the remote
  file read instead: the cache never turns a good remote file into an error.
- Only names this module makes are ever deleted, whatever else is in the folder.
"""

import base64
import dataclasses
import hashlib
import json
import numbers
import os
import posixpath
import re
import time
import uuid
import warnings

import google_crc32c
import pyarrow as pa
import pyarrow.fs as pafs

from pileshuffle.errors import InputError, PileshuffleError
from pileshuffle.io import cloud_requests, storage

__all__ = ["DEFAULT_LIMIT", "FileFacts", "PileCache", "parse_limit", "caches", "remote_name"]

DEFAULT_LIMIT = "50GB"
# decimal units as disks are sold (1 GB = 10**9 bytes), and the binary ones by their own names
_UNITS = {
    "": 1,
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
    "TIB": 2**40,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([A-Za-z]*)\s*$")
# per remote read while fetching: an object store's cost is per request, so few and large ones,
# and the memory of one chunk (not of the whole file) while it goes to disk
_CHUNK_BYTES = 64 * 2**20
_DIGEST_CHARS = 32
# the names of entries; nothing else is deleted
_ENTRY = re.compile(r"^[0-9a-f]{%d}-" % _DIGEST_CHARS)
_NAME_TAIL = 80  # characters of the remote name kept after the digest (its extension says .gz)
_TEMP_SUFFIX = ".part"
# a temp file unwritten for this long was left by a killed process: a live fetch writes every chunk
_STALE_TEMP_SECONDS = 3600
_SCHEMES = {"gcs": "gs://", "s3": "s3://"}
_LOCAL = pafs.LocalFileSystem()


@dataclasses.dataclass(frozen=True)
class FileFacts:
    """What an output's manifest says of one of its files: ``size`` in bytes (None: it lists
    none), ``version``, a string that differs between outputs whose files may differ, and
    ``crc32c``."""

    size: int = None
    version: str = ""
    # the file's CRC32C as the manifest lists it (checksums), None when it lists none
    crc32c: str = None

    def check_size(self, name: str, size: int, then: str = ""):
        """Refuse (an InputError naming ``name``) a file of ``size`` bytes when the manifest lists
        another size; ``then``: what is not done because of it."""
        if self.size is not None and size != self.size:
            raise InputError(
                name,
                f"is {size:,} bytes where its manifest lists {self.size:,}: changed after it "
                f"was written (`pileshuffle verify` says how){then}",
            )


def parse_limit(value) -> int:
    """``cache_limit`` in bytes: a whole number of bytes, or a string such as ``"50GB"``,
    ``"500MB"``, ``"1.5TB"`` (decimal units: 1 GB = 10**9 bytes; ``KiB``, ``MiB``, ``GiB``,
    ``TiB`` are the binary ones). At least 1 byte; anything else is a ValueError naming it."""
    wanted = (
        "cache_limit must be a whole number of bytes or a size such as '50GB' or '500MB' "
        "(decimal units: 1 GB = 10**9 bytes; GiB = 2**30)"
    )
    if isinstance(value, bool) or not isinstance(value, (numbers.Integral, str)):
        raise ValueError(f"{wanted}, got {value!r}")
    if isinstance(value, str):
        found = _SIZE.match(value)
        if not found or found.group(2).upper() not in _UNITS:
            raise ValueError(f"{wanted}, got {value!r}")
        number = int(float(found.group(1)) * _UNITS[found.group(2).upper()])
    else:
        number = int(value)
    if number < 1:
        raise ValueError(f"cache_limit must be at least 1 byte, got {value!r}")
    return number


def caches(filesystem) -> bool:
    """Whether files on ``filesystem`` are worth caching: all but the local file system's
    (also under a ``SubTreeFileSystem``)."""
    return getattr(filesystem, "base_fs", filesystem).type_name != "local"


def _checked_directory(directory) -> str:
    """``cache_dir`` as an absolute local path, the folder made; a ValueError naming it
    otherwise."""
    if isinstance(directory, bool) or not isinstance(directory, (str, os.PathLike)):
        raise ValueError(
            f"cache_dir must be a local folder's path (str or os.PathLike), got {directory!r}"
        )
    directory = os.fspath(directory)
    if not isinstance(directory, str) or not directory or storage.is_remote(directory):
        raise ValueError(
            f"cache_dir must be a folder on this host's disk (it keeps remote piles locally), "
            f"got {directory!r}"
        )
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as error:
        raise ValueError(f"cache_dir {directory!r} cannot be used as a folder: {error}") from None
    return os.path.abspath(directory)


class _CannotKeep(Exception):
    """The cache folder refused a write (full, read-only, gone): the file is read remotely."""


def _local(operation, *args):
    """A local file operation of a fetch; its OSError is the folder's (``_CannotKeep``), not
    the remote's."""
    try:
        return operation(*args)
    except OSError as error:
        raise _CannotKeep(error) from error


def _remove_quietly(path: str):
    try:
        os.remove(path)
    except FileNotFoundError:  # another process removed it first
        pass


def remote_name(filesystem, path: str) -> str:
    """``path`` on ``filesystem`` as a user wrote it (``gs://bucket/...``), for messages."""
    return _SCHEMES.get(getattr(filesystem, "type_name", ""), "") + path


class PileCache:
    """The cache folder ``directory``, holding at most ``limit`` bytes of entries (see the
    module docstring). Picklable (a folder and a number): the DataLoader workers that unpickle
    a dataset share its folder."""

    def __init__(self, directory, limit=DEFAULT_LIMIT):
        self.limit = parse_limit(limit)
        self.directory = _checked_directory(directory)

    @classmethod
    def of(cls, directory, limit=DEFAULT_LIMIT):
        """The cache ``ShuffledDataset(cache_dir=directory, cache_limit=limit)`` asks for: None
        when ``directory`` is None (``limit`` is checked all the same)."""
        if directory is None:
            parse_limit(limit)
            return None
        return cls(directory, limit)

    def __repr__(self):
        return f"PileCache({self.directory!r}, limit={self.limit:,} bytes)"

    def entry_path(self, filesystem, path: str, facts: FileFacts) -> str:
        """Where the local copy of ``path`` (with these ``facts``) is kept."""
        basis = json.dumps([getattr(filesystem, "type_name", ""), path, facts.size, facts.version])
        digest = hashlib.sha256(basis.encode()).hexdigest()[:_DIGEST_CHARS]
        return os.path.join(self.directory, f"{digest}-{posixpath.basename(path)[-_NAME_TAIL:]}")

    def entries(self) -> list:
        """``(path, bytes)`` of every entry, least recently used first."""
        found = []
        for entry in _scan(self.directory):
            if _ENTRY.match(entry.name):
                stat = _stat(entry)
                if stat is not None:
                    found.append((stat.st_mtime_ns, entry.name, stat.st_size))
        return [(os.path.join(self.directory, name), size) for _, name, size in sorted(found)]

    def read(self, filesystem, path: str, facts: FileFacts, read):
        """``read(filesystem, path)`` of the file's local copy (fetched on a miss), or of the
        remote file itself when it is not kept (larger than the limit, or the folder refuses
        it) or its copy fails ``read`` (evicted by another process before it was opened, or
        damaged: it is dropped)."""
        local = self.local_copy(filesystem, path, facts)
        if local is None:
            return read(filesystem, path)
        try:
            return read(_LOCAL, local)
        except (OSError, pa.ArrowException, PileshuffleError) as error:
            _remove_quietly(local)
            # not just evicted meanwhile
            if not isinstance(error.__cause__ or error, FileNotFoundError):
                warnings.warn(
                    f"pileshuffle: the cached copy {local} of {remote_name(filesystem, path)} "
                    f"cannot be read ({error}); dropped, reading the remote file",
                    RuntimeWarning,
                    stacklevel=2,
                )
            return read(filesystem, path)

    def local_copy(self, filesystem, path: str, facts: FileFacts):
        """The path of the local copy of remote ``path`` (fetched now on a miss, then the cache
        evicted to its limit), or None when it is not kept."""
        local = self.entry_path(filesystem, path, facts)
        if self._hit(local, facts):
            return local
        if facts.size is not None and facts.size > self.limit:
            return None
        if not self._fetch(filesystem, path, facts, local):
            return None
        self.evict(keep=local)
        return local

    def _hit(self, local: str, facts: FileFacts) -> bool:
        """Whether ``local`` is there, of the listed size (else it is dropped); a hit is
        a use (mtime now)."""
        try:
            if facts.size is not None and os.stat(local).st_size != facts.size:
                _remove_quietly(local)  # truncated or damaged since it was kept: fetched again
                return False
            _touch(local)
            return True
        except FileNotFoundError:
            return False

    def _fetch(self, filesystem, path: str, facts: FileFacts, local: str) -> bool:
        """Fetch remote ``path`` onto ``local`` whole (temp file, checks, ``os.replace``);
        False when it is not kept. A file that fails its checks is an InputError, and not kept."""
        uri = remote_name(filesystem, path)
        temp = os.path.join(
            self.directory,
            f".{os.path.basename(local)}.{os.getpid()}-{uuid.uuid4().hex[:8]}{_TEMP_SUFFIX}",
        )
        try:
            # the folder may have been removed meanwhile
            _local(os.makedirs, self.directory, 0o777, True)
            if not cloud_requests.patiently_writing(
                uri, lambda: self._download(filesystem, path, facts, temp, uri)
            ):
                return False
            _local(_touch, temp)
            _local(os.replace, temp, local)
            return True
        except _CannotKeep as error:
            warnings.warn(
                f"pileshuffle: the cache {self.directory} cannot keep {uri} ({error.__cause__}); "
                "it is read from where it is",
                RuntimeWarning,
                stacklevel=2,
            )
            return False
        finally:
            _remove_quietly(temp)

    def _download(self, filesystem, path: str, facts: FileFacts, temp: str, uri: str) -> bool:
        """Copy remote ``path`` into ``temp``, checked; False (nothing written) when it is larger
        than the limit."""
        with storage.open_random_access(path, filesystem) as remote:
            size = remote.size()
            facts.check_size(uri, size, "; not cached")
            if size > self.limit:
                return False
            listed = _listed_crc32c(remote)
            received, crc = _copy(remote, temp)
        if received != size:
            raise InputError(
                uri, f"gave {received:,} of its {size:,} bytes: a broken transfer; not cached"
            )
        if listed is not None and crc != listed:
            raise InputError(
                uri,
                f"arrived with CRC32C {crc:08x} where the object store lists {listed:08x}: "
                "damaged in transfer; not cached",
            )
        return True

    def evict(self, keep: str = None):
        """Delete the least recently used entries until the total is within the limit (never
        ``keep``), and temp files left by killed processes."""
        now = time.time()
        for entry in _scan(self.directory):
            if entry.name.startswith(".") and entry.name.endswith(_TEMP_SUFFIX):
                stat = _stat(entry)
                if stat is not None and now - stat.st_mtime > _STALE_TEMP_SECONDS:
                    _remove_quietly(entry.path)
        entries = self.entries()
        total = sum(size for _, size in entries)
        for path, size in entries:
            if total <= self.limit:
                break
            if path != keep:
                _remove_quietly(path)
                total -= size


def _touch(path: str):
    """Mark ``path`` used now, to the nanosecond (the file system's own clock ticks every few
    ms: files used within one tick would tie in the least-recently-used order)."""
    now = time.time_ns()
    os.utime(path, ns=(now, now))


def _scan(directory: str) -> list:
    try:
        return list(os.scandir(directory))
    except FileNotFoundError:
        return []


def _stat(entry):
    """``entry``'s stat, or None when another process deleted it meanwhile."""
    try:
        return entry.stat()
    except FileNotFoundError:
        return None


def _listed_crc32c(remote):
    """The CRC32C the object store lists for the open object, or None: Cloud Storage lists one
    for every object (``crc32c``: base64 of 4 big-endian bytes), in the metadata pyarrow read
    when it opened the file (no request of its own)."""
    try:
        value = remote.metadata().get("crc32c")
    except (OSError, NotImplementedError):
        return None
    try:
        return int.from_bytes(base64.b64decode(value), "big") if value else None
    except ValueError:
        return None


def _copy(remote, temp: str):
    """``(bytes, CRC32C)`` of ``remote``'s contents written to ``temp``, in ``_CHUNK_BYTES``
    reads."""
    received, crc = 0, 0
    out = _local(open, temp, "wb")
    try:
        while True:
            chunk = remote.read_buffer(_CHUNK_BYTES)
            if not chunk.size:
                return received, crc
            crc = google_crc32c.extend(crc, chunk)
            received += chunk.size
            _local(out.write, chunk)
    finally:
        _local(out.close)
