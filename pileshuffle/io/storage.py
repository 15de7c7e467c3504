"""Every file operation, for local paths and object stores (gs://, s3://), behind one interface.

Callers pass paths; which library does the work is this module's business: in a process that
has imported Apache Beam, Beam's ``FileSystems`` (configured by the pipeline's options); elsewhere
(a training host's loader) ``pyarrow.fs`` (``arrow_backend``), or the ``FileSystem`` a caller
hands in (``beam_backend.in_use`` chooses; ``PILESHUFFLE_STORAGE=beam|arrow`` overrides, tests
of both); ranged reads of gs:// through google-cloud-storage. Local files mostly go straight to
the OS: a small shard pays for no file-system layer.

Invariants every backend keeps:
- a path is local unless it has a scheme (``gs://...``); ``join`` keeps that form;
- ``match`` takes a glob and returns ``(path, size)`` pairs, none (not an error) when nothing
  matches; a literal path with ``[ * ?`` in it matches through ``names.literal_pattern``;
- ``open_read`` decompresses what the name says (``.gz``) unless told otherwise; ``read_buffer``
  maps a local file, ``read_range`` preads it; either reads a remote one in a request, every byte;
  a file a caller holds whole (``held_bytes``) is read from memory;
- an object store has no folders and no atomic rename: ``delete_tree`` deletes the objects under
  a prefix; publication never relies on an atomic rename there (the manifest is the commit).
"""

import dataclasses
import errno
import json
import os
import posixpath

from pileshuffle.io import arrow_backend, beam_backend, cloud, cloud_requests, held_bytes
from pileshuffle.io.arrow_backend import arrow_filesystem, is_remote
from pileshuffle.io.durable import settle, settle_folder
from pileshuffle.names import literal_pattern, temp_name

# the compressions ``open_read`` and ``open_write`` take (Beam's names); AUTO: what the name says
GZIP, AUTO, UNCOMPRESSED = "gzip", "auto", "uncompressed"


@dataclasses.dataclass(frozen=True)
class FileInfo:
    """One file ``match`` found: its path (in the pattern's form) and size in bytes."""

    path: str
    size: int


def is_local(filesystem, path: str) -> bool:
    """Whether ``path`` on ``filesystem`` (a ``pyarrow.fs`` one, or None: by the path) is a local
    file."""
    return not is_remote(path) if filesystem is None else filesystem.type_name == "local"


# -- names and places ------------------------------------------------------------------------------


def join(base: str, *parts: str) -> str:
    """``base`` and ``parts`` joined in ``base``'s form: ``/`` for a remote path, the OS's
    separator for a local one."""
    if is_remote(base):
        return (
            posixpath.join(base, *parts)
            if not base.endswith("/")
            else base + posixpath.join(*parts)
        )
    return os.path.join(base, *parts)


def unexpanded_home(path: str):
    """For a local ``path`` starting with ``~`` (``~`` or ``~/...``): what to tell its user, that
    a shell expands ``~`` only outside quotes, and the home folder's path meant; else None. Here
    such a path names a folder called ``~`` below the current one."""
    if path == "~" or path.startswith("~/"):
        meant = os.path.expanduser(path)
        return f"~ is your home folder only where a shell expands it, outside quotes: give {meant}"
    return None


def split(path: str) -> tuple:
    """``(folder, name)``."""
    return path.rstrip("/").rpartition("/")[::2] if is_remote(path) else os.path.split(path)


def compression_of(path: str) -> str:
    """``gzip`` for a name ending in ``.gz`` (any case), else ``uncompressed``; with Beam, what
    Beam detects."""
    if beam_backend.in_use():
        return beam_backend.compression_of(path)
    return GZIP if path.lower().endswith(".gz") else UNCOMPRESSED


@cloud.refusals_explained
def match(pattern: str) -> list:
    """The files ``pattern`` (a glob) matches, as ``FileInfo``s; [] when none do."""
    backend = beam_backend if beam_backend.in_use() else arrow_backend
    return [FileInfo(path, size) for path, size in backend.match(pattern)]


def pattern_regex(pattern: str):
    """The compiled regular expression of the paths ``match(pattern)`` matches (Beam's glob
    rules: ``*`` within a name, ``**`` across folders, ``[...]`` a class)."""
    import re

    if beam_backend.in_use():
        return beam_backend.pattern_regex(pattern)
    import fnmatch

    return re.compile(fnmatch.translate(pattern))


@cloud.refusals_explained
def exists(path: str, filesystem=None) -> bool:
    """Whether a file (or folder) is at ``path``, on ``filesystem`` when one is given."""
    if filesystem is None and not is_remote(path):
        return os.path.exists(path)
    if filesystem is None and beam_backend.in_use():
        return beam_backend.file_systems(path).exists(path)
    return arrow_backend.exists(path, filesystem)


@cloud.refusals_explained
def size(path: str) -> int:
    """The size in bytes of the file at ``path`` (whatever characters its name holds): through
    pyarrow one metadata request, where a match would list the file's folder."""
    if not is_remote(path):
        return os.path.getsize(path)
    if beam_backend.in_use():
        return match(literal_pattern(path))[0].size
    return arrow_backend.size(path)


@cloud.refusals_explained
def open_read(path: str, compression: str = AUTO):
    """``path``'s contents, decompressed as its name says (``AUTO``); by Beam 64 KiB at a time
    (tests/test_bounded_inflate)."""
    wanted = compression_of(path) if compression == AUTO else compression
    held = held_bytes.reader(path, wanted == GZIP)
    if held is not None:
        return held
    if beam_backend.in_use():
        return beam_backend.open_read(path, wanted)
    fs, where = arrow_filesystem(path)
    return fs.open_input_stream(where, compression=GZIP if wanted == GZIP else None)


@cloud.refusals_explained
def read_buffer(path: str, filesystem=None):
    """The whole file as a ``pyarrow.Buffer``, decompressed when its name ends in .gz: a local
    file is memory-mapped (the page cache itself: no copy); a remote one read in one request."""
    import pyarrow as pa

    if is_local(filesystem, path) and not path.endswith(".gz"):
        with pa.memory_map(path) as mapped:
            return mapped.read_buffer()
    if filesystem is None and beam_backend.in_use():
        with open_read(path) as handle:
            return pa.py_buffer(beam_backend.read_whole(handle, compression_of(path)))
    return arrow_backend.read_whole(path, filesystem)


@cloud.refusals_explained
def read_range(path: str, offset: int, length: int):
    """``length`` bytes of ``path`` from ``offset`` (an OSError if fewer), a ``pyarrow.Buffer``:
    locally one ``pread`` (a memory map cost 4x per read), on gs:// one ranged GET (no metadata
    read)."""
    import pyarrow as pa

    if path.startswith("gs://"):
        data = pa.py_buffer(cloud_requests.read_range(path, offset, length))
    elif not is_remote(path):
        with open(path, "rb", buffering=0) as handle:
            data = pa.py_buffer(os.pread(handle.fileno(), length, offset))
    else:  # another object store, through pyarrow.fs
        data = pa.py_buffer(open_random_access(path).read_at(length, offset))
    if data.size != length:
        raise OSError(
            errno.EIO, f"{path}: holds no {length:,} bytes at offset {offset:,} (cut short?)"
        )
    return data


def read_json(path: str, filesystem=None):
    """The JSON document in the file at ``path`` (read whole with ``read_buffer``)."""
    return json.loads(read_buffer(path, filesystem).to_pybytes())


@cloud.refusals_explained
def open_random_access(path: str, filesystem=None):
    """A seekable ``pyarrow`` file (what Parquet's reader needs), read in the reader's own
    requests (or from the bytes ``held_bytes`` holds for it)."""
    held = held_bytes.reader(path, decompressed=False) if filesystem is None else None
    if held is not None:
        return held
    fs, where = arrow_filesystem(path, filesystem)
    return cloud_requests.patiently_on(path, fs, lambda: fs.open_input_file(where))


@cloud.refusals_explained
def open_seekable(path: str):
    """``path``'s bytes as stored, in a file that seeks (Parquet's reader, a span of a file):
    Beam's handle where Beam reads (it seeks by ranged reads), else ``open_random_access``'s;
    no stream is opened only to be dropped (on gs:// each is a download begun)."""
    if held_bytes.reader(path, decompressed=False) is None and beam_backend.in_use():
        return beam_backend.open_read(path, UNCOMPRESSED)
    return open_random_access(path)


@cloud.refusals_explained
def open_mapped(path: str, filesystem=None):
    """A ``pyarrow`` input over the file: memory-mapped when local (only pages read are touched),
    else a stream."""
    import pyarrow as pa

    if is_local(filesystem, path):
        return pa.memory_map(path)
    fs, where = arrow_filesystem(path, filesystem)
    return cloud_requests.patiently_on(path, fs, lambda: fs.open_input_stream(where))


@cloud.refusals_explained
def list_folder(folder: str, filesystem=None) -> list:
    """The paths of the files directly in ``folder`` ([] when it does not exist)."""
    if filesystem is None and beam_backend.in_use():
        return [f.path for f in match(join(literal_pattern(folder), "*"))]
    return arrow_backend.list_folder(folder, filesystem)


@cloud.refusals_explained
def is_folder(path: str, filesystem=None) -> bool:
    """Whether ``path`` is a folder (remote: the file system says it is a directory)."""
    if filesystem is None and not is_remote(path):
        return os.path.isdir(path)
    return arrow_backend.is_folder(path, filesystem)


# -- writing ---------------------------------------------------------------------------------------
@cloud.refusals_explained
def open_write(
    path: str, compression: str = UNCOMPRESSED, mime_type: str = "application/octet-stream"
):
    """A new binary file at ``path`` (its local folder made), compressed as asked."""
    if not is_remote(path):
        # no file-system layer: a small pile's shard pays for its open only
        if compression == UNCOMPRESSED:
            try:
                return open(path, "wb")
            except FileNotFoundError:
                # the folder first (asked only then: 2 system calls a shard)
                os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
                return open(path, "wb")
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    if beam_backend.in_use():
        return beam_backend.file_systems(path).create(
            path, mime_type=mime_type, compression_type=compression
        )
    fs, where = arrow_filesystem(path)
    return fs.open_output_stream(where, compression=GZIP if compression == GZIP else None)


@cloud.refusals_explained
def write_whole(path: str, data: bytes):
    """Write ``data`` to ``path`` so that it appears whole or not at all: locally a temp file
    renamed over it; on an object store one upload (an object exists only once complete)."""
    temp = path if is_remote(path) else f"{path}.tmp-{os.getpid()}"
    try:
        with open_write(temp) as handle:  # makes the local folder
            handle.write(data)
        if temp != path:
            settle(temp)
            os.replace(temp, path)
            settle_folder(os.path.dirname(path))
    finally:
        if os.path.exists(temp):
            os.remove(temp)


@cloud.refusals_explained
def create_exclusive(path: str, data: bytes, temp: str):
    """Write ``data`` to ``path`` whole (first to ``temp``), failing with ``FileExistsError`` if
    ``path`` exists. Of two writers one wins: on a local disk by an atomic hard link, on Cloud
    Storage by an upload on the precondition that no object is there (``ifGenerationMatch=0``).
    On another object store the check comes just before the rename: callers exclude each other
    by a lock. One step that Ctrl-C does not cut (``interrupt.not_cut``): ``temp`` never outlives
    it."""
    from pileshuffle import interrupt

    with interrupt.not_cut():
        if path.startswith("gs://"):
            # one conditional upload: no temp, no rename
            cloud_requests.create_if_absent(path, data)
            return
        makedirs(split(path)[0] or ".")
        with open_write(temp, UNCOMPRESSED) as handle:
            handle.write(data)
        try:
            if not is_remote(path):
                settle(temp)
                os.link(temp, path)  # FileExistsError when it exists
                settle_folder(os.path.dirname(path))
                return
            if exists(path):
                raise FileExistsError(errno.EEXIST, f"{path} exists")
            rename([temp], [path])
        finally:
            if exists(temp):
                delete([temp])


def writing_name(final: str, token: str) -> str:
    """Where to write a file that must appear at ``final`` whole: locally a temporary name beside
    it (``put_in_place`` renames it); on an object store ``final`` itself, since an object appears
    only when its upload completes and a rename there is a copy and a delete."""
    return final if is_remote(final) else temp_name(final, token)


def put_in_place(written: list, finals: list):
    """Move each file written under ``writing_name`` onto its final name (those written there
    stay)."""
    moves = [(w, f) for w, f in zip(written, finals) if w != f]
    if moves:
        rename([w for w, _ in moves], [f for _, f in moves])


@cloud.refusals_explained
def rename(sources: list, destinations: list):
    """Move each source to its destination (replacing it). Atomic per file locally; on an object
    store a copy, a delete."""
    if not sources or not is_remote(sources[0]):
        for source, destination in zip(sources, destinations):  # the OS's own rename
            os.replace(source, destination)
    elif beam_backend.in_use():
        beam_backend.file_systems(*sources[:1], *destinations[:1]).rename(
            list(sources), list(destinations)
        )
    else:
        arrow_backend.rename(sources, destinations)


@cloud.refusals_explained
def delete(paths: list):
    """Delete files (a local folder with its contents); a missing path is an error."""
    if beam_backend.in_use():
        return beam_backend.file_systems(*paths[:1]).delete(list(paths))
    arrow_backend.delete(paths)


@cloud.refusals_explained
def delete_tree(folder: str) -> bool:
    """Delete a folder and everything in it; whether there was anything. On an object store a
    folder is the objects under its prefix, which ``exists`` and ``delete`` of the bare name do
    not see: they are listed (``**``: at any depth) and deleted."""
    if not is_remote(folder):
        found = [folder] if os.path.exists(folder) else []
    else:
        found = [f.path for f in match(join(literal_pattern(folder), "**"))]
    if found:
        delete(found)
    return bool(found)


def makedirs(folder: str):
    """Make a local folder and its parents (object stores have none to make)."""
    if not is_remote(folder):
        os.makedirs(folder, exist_ok=True)


__all__ = [
    "AUTO",
    "GZIP",
    "UNCOMPRESSED",
    "FileInfo",
    "compression_of",
    "delete",
    "create_exclusive",
    "delete_tree",
    "exists",
    "is_folder",
    "is_local",
    "is_remote",
    "unexpanded_home",
    "join",
    "list_folder",
    "makedirs",
    "match",
    "pattern_regex",
    "open_mapped",
    "open_random_access",
    "open_read",
    "open_seekable",
    "open_write",
    "read_buffer",
    "read_json",
    "read_range",
    "rename",
    "size",
    "split",
    "write_whole",
    "writing_name",
    "put_in_place",
]
