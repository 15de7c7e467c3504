"""A file's checksum as its manifest lists it: CRC32C (Castagnoli), 8 lowercase hex digits.

The checksum is of the bytes a reader gets: a file's bytes as stored, and for a ``.gz`` shard
its decompressed bytes (gzip's own CRC32 covers the stored stream; decompression checks it).
For a file that is not ``.gz`` it is the CRC32C that Cloud Storage keeps for every object
(``gcloud storage objects describe``'s ``crc32c_hash`` is the same four bytes, base64).

Google's crc32c library (the one ``google_crc32c`` wraps) computes it at about 8 GB/s here. Its
Python binding holds the GIL for anything but ``bytes``, so a loader thread checking a shard
stopped the thread handing out batches (an epoch of 1 GB TFRecord: 0.81x with the binding, 0.91x
calling the same library through ``ctypes``, which lets go of the GIL: check on against off in one
process, medians of 5, 2026-11-27). Large buffers go through ``ctypes`` where that library is found.
"""

import ctypes
import ctypes.util
import functools
import glob
import os

import google_crc32c
import numpy as np

from pileshuffle.errors import InputError

__all__ = ["Crc32cWriter", "crc32c_hex", "crc32c_mismatch", "check_crc32c", "unreadable_bytes"]


# from this size on a CRC lets go of the GIL (as google_crc32c does for bytes)
_UNLOCKED_BYTES = 1 << 20


def crc32c_hex(data) -> str:
    """CRC32C of a bytes-like ``data`` (a ``pyarrow.Buffer`` too), as the manifest writes it."""
    return f"{_extend(0, data):08x}"


def _extend(crc: int, data) -> int:
    """``crc`` extended by ``data``'s bytes, without the GIL when they are many."""
    native = _native_library()
    if (
        native is None
        or isinstance(data, bytes)
        or len(memoryview(data).cast("B")) < _UNLOCKED_BYTES
    ):
        return google_crc32c.extend(crc, _read_only(data))
    array = np.frombuffer(data, dtype=np.uint8)
    return native.crc32c_extend(crc, array.ctypes.data, array.size)


@functools.lru_cache(maxsize=None)
def _native_library():
    """Google's crc32c library as ``google_crc32c``'s wheel ships it (or the system's) through
    ``ctypes``, whose calls let go of the GIL; None where it is not found (the binding does
    then)."""
    beside = os.path.join(
        os.path.dirname(os.path.dirname(google_crc32c.__file__)), "google_crc32c.libs"
    )
    for path in sorted(glob.glob(os.path.join(beside, "libcrc32c*"))) + [
        ctypes.util.find_library("crc32c")
    ]:
        try:
            library = ctypes.CDLL(path) if path else None
        except OSError:
            continue
        if library is not None and hasattr(library, "crc32c_extend"):
            library.crc32c_extend.restype = ctypes.c_uint32
            library.crc32c_extend.argtypes = [ctypes.c_uint32, ctypes.c_void_p, ctypes.c_size_t]
            return library
    return None


def _read_only(data):
    """``data`` as google_crc32c takes it: bytes, or a read-only array over the same memory (no
    copy; it refuses memoryviews and writable buffers)."""
    if isinstance(data, bytes):
        return data
    array = np.frombuffer(data, dtype=np.uint8)
    array.flags.writeable = False
    return array


class Crc32cWriter:
    """A binary file handle that keeps the CRC32C of every byte written through it
    (``hex()``) and their count (``written``); every other attribute is the wrapped handle's."""

    def __init__(self, handle):
        self._handle, self._crc, self.written = handle, 0, 0

    def write(self, data):
        self._crc = _extend(self._crc, data)
        self.written += len(data) if isinstance(data, bytes) else memoryview(data).nbytes
        return self._handle.write(data)

    def hex(self) -> str:
        return f"{self._crc:08x}"

    def __getattr__(self, name):
        return getattr(self._handle, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return self._handle.__exit__(*exc)


def crc32c_mismatch(data, listed: str):
    """What is wrong with bytes whose CRC32C is not the ``listed`` one, else None (also when
    ``listed`` is None: the manifest lists none)."""
    if listed is None:
        return None
    found = crc32c_hex(data)
    return None if found == listed else f"its CRC32C is {found} where its manifest lists {listed}"


def check_crc32c(name: str, data, listed: str, then: str = ""):
    """Refuse (an InputError naming ``name``) bytes whose CRC32C is not the ``listed`` one
    (None: nothing to check); ``then``: what is not done because of it."""
    mismatch = crc32c_mismatch(data, listed)
    if mismatch is not None:
        raise InputError(
            name,
            f"is damaged: {mismatch} (changed after it was written; `pileshuffle verify` "
            f"names every damaged file){then}",
        )


def unreadable_bytes(path: str, error: Exception) -> str:
    """Why a file's bytes cannot be read: a ``.gz`` stream that does not decompress whole is damaged
    (gzip's CRC32 or its framing), anything else is what the reader says."""
    if path.endswith(".gz") and not isinstance(error, FileNotFoundError):
        return f"is damaged: its gzip stream does not decompress whole ({error})"
    return f"cannot be read: {error}"
