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

import concurrent.futures
import io
import os
import threading

import numpy as np
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.io.localfilesystem import LocalFileSystem

ALIGN = 4096  # O_DIRECT needs offsets, sizes and memory aligned to the logical block size; 4 KiB suits all
WRITE_BUFFER_BYTES = 16 << 20  # two halves: one being filled, one being written
IO_THREADS = 4
_IO_LOCK = threading.Lock()
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
    """A write-only file that sends whole ``ALIGN``-sized blocks with O_DIRECT from two
    aligned buffers in turn: while one is being written (by the I/O threads, without the
    GIL) the caller fills the other, so computing and disk writes overlap. At most one
    write per file is in flight, so the file's bytes stay in order; its error is raised by
    the next ``write`` or ``close``. ``close`` writes the last partial block without O_DIRECT.
    Holds at most ``buffer_bytes`` of unwritten data."""

    def __init__(self, fd: int, buffer_bytes: int = WRITE_BUFFER_BYTES):
        super().__init__()
        half = max(ALIGN, buffer_bytes // 2 // ALIGN * ALIGN)
        self._fd = fd
        self._buffer, self._spare = aligned_array(half), aligned_array(half)
        self._views = [memoryview(self._buffer), memoryview(self._spare)]  # copying into a memoryview costs least per call
        self._filled = 0
        self._position = 0
        self._in_flight = None  # the write of the spare buffer, if one is going on

    def writable(self):
        return True

    def tell(self):
        return self._position

    def write(self, data):
        view = memoryview(data).cast("B")
        done = 0
        while done < len(view):
            take = min(len(view) - done, len(self._buffer) - self._filled)
            self._views[0][self._filled : self._filled + take] = view[done : done + take]
            self._filled += take
            done += take
            if self._filled == len(self._buffer):
                self._send_in_background()
        self._position += len(view)
        return len(view)

    def _send_in_background(self):
        self._wait()
        self._in_flight = _io_threads().submit(_write_all, self._fd, self._buffer)
        self._buffer, self._spare = self._spare, self._buffer
        self._views.reverse()
        self._filled = 0

    def _wait(self):
        in_flight, self._in_flight = self._in_flight, None
        if in_flight is not None:
            in_flight.result()

    def close(self):
        if self.closed:
            return
        try:
            self._wait()
            whole = self._filled - self._filled % ALIGN
            if whole:
                _write_all(self._fd, self._buffer[:whole])
            if self._filled > whole:
                import fcntl

                fcntl.fcntl(self._fd, fcntl.F_SETFL, fcntl.fcntl(self._fd, fcntl.F_GETFL) & ~_O_DIRECT)
                _write_all(self._fd, self._buffer[whole : self._filled])
        finally:
            try:
                self._wait()  # after an error: never close the file under a write in flight
            finally:
                os.close(self._fd)
                super().close()


def _write_all(fd: int, data: np.ndarray):
    sent = 0
    while sent < len(data):
        sent += os.write(fd, data[sent:])


def delete_soon(paths):
    """Delete files in the background, best effort (freeing an 8 MiB fragment took the
    file system about 2 ms). ``wait_for_deletions`` waits for every such deletion."""
    future = _io_threads().submit(_delete_quietly, list(paths))
    with _IO_LOCK:
        _DELETIONS.append(future)


def _delete_quietly(paths):
    try:
        FileSystems.delete(paths)
    except Exception:
        pass  # the run's work directory is removed as a whole at the end anyway


def wait_for_deletions():
    with _IO_LOCK:
        pending = list(_DELETIONS)
        _DELETIONS.clear()
    concurrent.futures.wait(pending)


def map_in_background(function, items) -> list:
    """``[function(item) for item in items]``, computed by the I/O threads at once
    (several reads in flight keep the disk busier than one)."""
    return list(_io_threads().map(function, items))


_IO_THREADS = []
_DELETIONS = []


def _io_threads() -> concurrent.futures.ThreadPoolExecutor:
    """The process's I/O threads (created on first use)."""
    if not _IO_THREADS:
        with _IO_LOCK:
            if not _IO_THREADS:
                _IO_THREADS.append(concurrent.futures.ThreadPoolExecutor(IO_THREADS, thread_name_prefix="pileshuffle-io"))
    return _IO_THREADS[0]


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
