"""Direct I/O for the run's own large local files: pile fragments and shards.

A fragment is written once and read once; a shard is written once and not read again by
this process. Neither gains from the page cache, and filling it costs the kernel one copy
per byte plus a fresh page per 4 KiB (on a VM, each such page is also a fault in the
hypervisor), and at tens of GB it throttles writers on dirty pages. So local paths are
opened with ``O_DIRECT`` where the file system allows it (ext4, xfs; not tmpfs): data
goes between our aligned buffers and the disk without passing through the page cache.
Anything else (remote paths, file systems that refuse ``O_DIRECT``, platforms without
it) goes through Beam's ``FileSystems`` as before. The bytes on disk are the same either way.
"""

import io
import os

import numpy as np
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.io.localfilesystem import LocalFileSystem

ALIGN = 4096  # O_DIRECT needs offsets, sizes and memory aligned to the logical block size; 4 KiB suits all
WRITE_BUFFER_BYTES = 8 << 20
_O_DIRECT = getattr(os, "O_DIRECT", 0)


def aligned_array(nbytes: int) -> np.ndarray:
    """A uint8 array of ``nbytes`` whose memory starts on an ``ALIGN`` boundary (from the
    normal heap, so freed blocks are reused by the next call)."""
    raw = np.empty(nbytes + ALIGN, dtype=np.uint8)
    start = -raw.ctypes.data % ALIGN
    return raw[start : start + nbytes]


def _is_local(path: str) -> bool:
    return _O_DIRECT != 0 and isinstance(FileSystems.get_filesystem(path), LocalFileSystem)


def _open_direct(path: str, flags: int):
    """A file descriptor opened with O_DIRECT, or None where the file system refuses it."""
    try:
        return os.open(path, flags | _O_DIRECT, 0o644)
    except OSError as error:
        if error.errno == 22:  # EINVAL: this file system does not do O_DIRECT
            return None
        raise


class DirectWriter(io.RawIOBase):
    """A write-only file that sends whole ``ALIGN``-sized blocks from an aligned buffer
    with O_DIRECT; ``close`` writes the last partial block without O_DIRECT. Holds at most
    ``buffer_bytes`` of unwritten data."""

    def __init__(self, fd: int, buffer_bytes: int = WRITE_BUFFER_BYTES):
        super().__init__()
        self._fd = fd
        self._buffer = aligned_array(max(ALIGN, buffer_bytes // ALIGN * ALIGN))
        self._filled = 0
        self._position = 0

    def writable(self):
        return True

    def tell(self):
        return self._position

    def write(self, data):
        view = memoryview(data).cast("B")
        done = 0
        while done < len(view):
            take = min(len(view) - done, len(self._buffer) - self._filled)
            self._buffer[self._filled : self._filled + take] = np.frombuffer(view[done : done + take], dtype=np.uint8)
            self._filled += take
            done += take
            if self._filled == len(self._buffer):
                self._send(self._filled)
        self._position += len(view)
        return len(view)

    def _send(self, nbytes: int):
        """Write the buffer's first ``nbytes`` (a multiple of ALIGN unless O_DIRECT is off)."""
        sent = 0
        while sent < nbytes:
            sent += os.write(self._fd, self._buffer[sent:nbytes])
        self._filled = 0

    def close(self):
        if self.closed:
            return
        try:
            whole = self._filled - self._filled % ALIGN
            tail = self._buffer[whole : self._filled].copy()
            if whole:
                self._send(whole)
            if len(tail):
                import fcntl

                fcntl.fcntl(self._fd, fcntl.F_SETFL, fcntl.fcntl(self._fd, fcntl.F_GETFL) & ~_O_DIRECT)
                self._buffer[: len(tail)] = tail
                self._send(len(tail))
        finally:
            os.close(self._fd)
            super().close()


def create(path: str, compression_type: str = CompressionTypes.UNCOMPRESSED, buffer_bytes: int = WRITE_BUFFER_BYTES):
    """Open ``path`` for writing (replacing it): a DirectWriter for an uncompressed local
    file where the file system allows O_DIRECT, else ``FileSystems.create``."""
    if compression_type == CompressionTypes.UNCOMPRESSED and _is_local(path):
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        fd = _open_direct(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        if fd is not None:
            return DirectWriter(fd, buffer_bytes)
    return FileSystems.create(path, compression_type=compression_type)


def read_all(path: str):
    """The whole content of ``path`` as a read-only buffer: read with O_DIRECT into an
    aligned array for a local file where the file system allows it, else through
    ``FileSystems.open``."""
    fd = _open_direct(path, os.O_RDONLY) if _is_local(path) else None
    if fd is None:
        with FileSystems.open(path, compression_type="uncompressed") as handle:
            return handle.read()
    try:
        size = os.fstat(fd).st_size
        array = aligned_array(-(-size // ALIGN) * ALIGN)
        done = 0
        while done < size:
            got = os.readv(fd, [array[done:]])
            if got == 0:
                raise OSError(f"{path}: file ended at byte {done:,} of {size:,} while reading it")
            done += got
        return memoryview(array[:size])
    finally:
        os.close(fd)
