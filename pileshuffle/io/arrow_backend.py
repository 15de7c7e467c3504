"""``storage``'s file operations through ``pyarrow.fs``: in a process that has not imported Apache
Beam (a training host's loader), and on a ``FileSystem`` a caller hands in.

Paths go in and come out in the caller's form: a remote path keeps its ``scheme://`` (pyarrow
drops it), a glob matches by ``fnmatch`` over its folder's listing. Every call to an object store
goes through ``cloud_requests.patiently_on`` (its retries); nothing here decides between Beam and
pyarrow.
"""

import errno
import os
import posixpath

from pileshuffle.io import cloud, cloud_requests

__all__ = [
    "is_remote",
    "arrow_filesystem",
    "match",
    "exists",
    "size",
    "read_whole",
    "list_folder",
    "is_folder",
    "rename",
    "delete",
]


def is_remote(path: str) -> bool:
    """Whether ``path`` is on an object store or other remote file system (it has a
    ``scheme://``); ``storage.is_remote`` is this function."""
    return "://" in path


def arrow_filesystem(path: str, filesystem=None):
    """``(pyarrow FileSystem, path on it)``: ``filesystem`` as given, else from the URI (local: the
    local file system). A reader that hands paths to pyarrow itself resolves once with this."""
    import pyarrow.fs as pafs

    if filesystem is not None:
        return filesystem, path
    if path.startswith("gs://"):
        cloud_requests.first_contact(path)
        return cloud.arrow_gcs(), path[len("gs://") :]
    if is_remote(path):
        return pafs.FileSystem.from_uri(path)
    return pafs.LocalFileSystem(), path


def match(pattern: str) -> list:
    """``(path, size)`` of the files the glob ``pattern`` matches in its folder; [] when none do
    (a local folder that cannot be listed: none; a remote one: the error)."""
    import fnmatch

    import pyarrow.fs as pafs

    fs, where = arrow_filesystem(pattern)
    folder = posixpath.dirname(where) if is_remote(pattern) else os.path.dirname(where)
    try:
        infos = cloud_requests.patiently_on(
            pattern,
            fs,
            lambda: fs.get_file_info(pafs.FileSelector(folder or ".", allow_not_found=True)),
        )
    except OSError:
        if is_remote(pattern):
            raise
        return []
    scheme = pattern.split("://", 1)[0] + "://" if is_remote(pattern) else ""
    return [
        (scheme + i.path if scheme else i.path, i.size)
        for i in infos
        if i.type == pafs.FileType.File and fnmatch.fnmatchcase(i.path, where)
    ]


def exists(path: str, filesystem=None) -> bool:
    """Whether ``path`` names a file or folder (``storage.exists`` without Beam)."""
    import pyarrow.fs as pafs

    return _file_info(path, filesystem).type != pafs.FileType.NotFound


def size(path: str) -> int:
    """The bytes of the file at ``path`` (``storage.size`` without Beam): its metadata alone."""
    import pyarrow.fs as pafs

    info = _file_info(path)
    if info.type != pafs.FileType.File:
        raise FileNotFoundError(f"{path}: no such file")
    return info.size


def _file_info(path: str, filesystem=None):
    """``path``'s ``pyarrow.fs.FileInfo``: one metadata request on an object store."""
    fs, where = arrow_filesystem(path, filesystem)
    return cloud_requests.patiently_on(path, fs, lambda: fs.get_file_info(where))


def read_whole(path: str, filesystem=None):
    """The whole file as a ``pyarrow.Buffer`` (gunzipped when its name ends in .gz)."""
    fs, where = arrow_filesystem(path, filesystem)
    return cloud_requests.patiently_on(path, fs, lambda: _read_whole(fs, where))


def _read_whole(fs, where: str):
    if where.endswith(".gz"):
        with fs.open_input_stream(where, compression="gzip") as stream:
            return stream.read_buffer()  # no size: pyarrow reads a stream to its end
    with fs.open_input_file(where) as handle:
        data = handle.read_buffer(handle.size())  # one read of known size: 10x a stream's speed
        if data.size != handle.size():
            raise OSError(errno.EIO, f"{where}: read {data.size:,} of {handle.size():,} bytes")
    return data


def list_folder(folder: str, filesystem=None) -> list:
    """The paths of the files directly in ``folder`` ([] when it does not exist)."""
    import pyarrow.fs as pafs

    fs, where = arrow_filesystem(folder, filesystem)
    infos = cloud_requests.patiently_on(
        folder, fs, lambda: fs.get_file_info(pafs.FileSelector(where, allow_not_found=True))
    )
    scheme = folder.split("://", 1)[0] + "://" if is_remote(folder) and filesystem is None else ""
    return [scheme + i.path for i in infos if i.type == pafs.FileType.File]


def is_folder(path: str, filesystem=None) -> bool:
    """Whether ``path`` names a folder (``storage.is_folder`` without Beam)."""
    import pyarrow.fs as pafs

    fs, where = arrow_filesystem(path.rstrip("/"), filesystem)
    return fs.get_file_info(where.rstrip("/")).type == pafs.FileType.Directory


def rename(sources: list, destinations: list):
    """Move each source to its destination: on an object store a copy and a delete."""
    fs = arrow_filesystem(sources[0])[0]
    for source, destination in zip(sources, destinations):
        fs.move(arrow_filesystem(source)[1], arrow_filesystem(destination)[1])


def delete(paths: list):
    """Delete files (a folder with its contents); a missing path is an error."""
    import pyarrow.fs as pafs

    for path in paths:
        fs, where = arrow_filesystem(path)
        directory = fs.get_file_info(where).type == pafs.FileType.Directory
        (fs.delete_dir if directory else fs.delete_file)(where)
