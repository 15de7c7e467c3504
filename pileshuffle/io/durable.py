"""Local files made durable before they are published.

A published name must name bytes on disk, through a crash of the machine: at publication each
local file is synced (``settle``: ``fdatasync``, which also reports a write the disk failed late,
such as a full disk under delayed allocation, before anything is published) and the folder it was
renamed or linked into is synced (``settle_folder``). An object in an object store exists only
once its upload completed: there, both do nothing.
"""

import os

from pileshuffle.io.arrow_backend import is_remote

__all__ = ["settle", "settle_folder"]


def settle(path: str):
    """Make a written local file's bytes durable (``fdatasync``); an error the disk deferred is
    raised here (``OSError``)."""
    if is_remote(path):
        return
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fdatasync(descriptor)
    finally:
        os.close(descriptor)


def settle_folder(folder: str):
    """Make the names in a local folder durable (``fsync`` of the folder): renames and links into it
    survive a crash of the machine."""
    if is_remote(folder):
        return
    descriptor = os.open(folder or ".", os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
