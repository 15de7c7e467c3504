"""Local files made durable before they are published.

A published name must name bytes on disk, through a crash of the machine: at publication each
local file is synced (``settle``: ``fdatasync``, which also reports a write the disk failed late,
such as a full disk under delayed allocation, before anything is published) and the folder it was
renamed or linked into is synced (``settle_folder``). An object in an object store exists only
once its upload completed: there, both do nothing.
"""

import errno
import os

from pileshuffle.io.arrow_backend import is_remote

# what fsync says on a file or folder its file system does not sync (some FUSE and network file
# systems): their durability is theirs to give; an error of the disk (ENOSPC, EIO) is raised
_CANNOT_SYNC = (errno.EINVAL, errno.ENOTSUP, errno.EBADF)

__all__ = ["settle", "settle_all", "settle_folder"]

# files synced at once by ``settle_all``: a journaling file system commits concurrent syncs together
_SYNCS_IN_FLIGHT = 16


def settle(path: str):
    """Make a written local file's bytes durable (``fdatasync``); an error the disk deferred is
    raised here (``OSError``)."""
    if is_remote(path):
        return
    _sync(path, getattr(os, "fdatasync", None) or os.fsync)  # macOS has fsync only


def settle_all(paths):
    """``settle`` every one of ``paths``, ``_SYNCS_IN_FLIGHT`` at a time (one at a time, 4,096
    shards took 1.6-3.2 s more at publication); the first error is raised."""
    paths = [path for path in paths if not is_remote(path)]
    if len(paths) <= 1:
        for path in paths:
            settle(path)
        return
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(min(_SYNCS_IN_FLIGHT, len(paths))) as pool:
        for _ in pool.map(settle, paths):
            pass


def settle_folder(folder: str):
    """Make the names in a local folder durable (``fsync`` of the folder): renames and links into it
    survive a crash of the machine."""
    if is_remote(folder):
        return
    _sync(folder or ".", os.fsync)


def _sync(path: str, sync):
    """``sync`` an open descriptor of ``path``; nothing where its file system cannot."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        sync(descriptor)
    except OSError as error:
        if error.errno not in _CANNOT_SYNC:
            raise
    finally:
        os.close(descriptor)
