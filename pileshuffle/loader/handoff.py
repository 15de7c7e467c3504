"""Batches from a DataLoader worker to the main process through shared memory, not the pipe.

A torch DataLoader worker sends each batch pickled through one ``multiprocessing`` pipe, whose
64 KiB buffer makes a 256 KB batch several writes and wake-ups on each side. On the 2-core bench
machine 3,908 batches of 256 x 1,000 bytes from 2 workers that only hand out a ready batch took
1.4-1.6 s through the pipe, 0.7-0.9 s this way, and 0.5 s with nothing in them (the
DataLoader's own cost); torch's shared-memory tensors cost a socket round trip each (3.1 s).
Here each worker process keeps one ring of shared memory (a ``memfd``, not /dev/shm, whose size
containers limit); a batch's buffers are copied into it and only their place crosses the pipe.
The main process maps the ring once (its file descriptor crosses once, by ``multiprocessing``'s
own fd passing), rebuilds the batch from the mapped bytes, and marks them released.

Invariants:
- A batch is pickled as ``reduced(buffers, rebuild, args)``: the unpickling process gets
  ``rebuild(views, *args)``, ``views`` being memoryviews of ``buffers`` valid only during the
  call (the region is reused after it: ``rebuild`` copies what it keeps).
- Only where the main process unpickles (``ring=True``: a DataLoader worker) and only if the
  ring has room do the buffers go through it; otherwise (no ``memfd_create``, a batch over
  1/8 of the largest ring, more batches in flight than the ring holds) they travel inside the
  pickle, as before. Nobody ever waits for room.
- The worker reuses a region only after the main process released it: the ring's header holds
  the released position (written by the main process only); regions are handed out in order
  and released in order (one worker's batches reach the main process in the order sent).
- The main process maps a worker's ring while the worker lives: it drops a ring when the same
  worker attaches a newer one (batches arrive in order) and, at each attach, the rings of
  workers that are gone. ``RING_BYTES`` per worker of the last loader (more for big batches)
  stays mapped after it ends, until the next loader's workers attach.
"""

import itertools
import mmap
import os
import struct
import threading
from multiprocessing import reduction

import numpy as np
import pyarrow as pa

__all__ = ["BytesOnArrival", "ArrowOnArrival", "arrow_batch", "reduced", "RING_BYTES"]

# per worker: 16 batches of 256 KB; a DataLoader has 2 (prefetch_factor) per worker in flight
RING_BYTES = 4 << 20
# a batch goes through a ring only if it is at most 1/_SHARE of it (a bigger batch gets a bigger
# ring)
_SHARE = 8
_MAX_RING = 1 << 30  # above this a batch travels inside the pickle
_HEADER = 64  # [0:8] released position (main process), [8:16] 1 once the main process has mapped it
_ALIGN = 64  # every buffer starts 64-byte aligned (Arrow's alignment; int64 offsets need 8)
_WORD = struct.Struct("<Q")

_own = {}  # in a worker: "ring" -> its _Ring
_mapped = {}  # in the main process: ring token (pid, serial) -> mmap
# feeder threads pickle, pin threads unpickle
_locks = {"own": threading.Lock(), "mapped": threading.Lock()}
_serials = itertools.count()


def _forked():
    """A forked child (a DataLoader worker) starts with no ring, no maps and unheld locks."""
    _own.clear()
    _mapped.clear()
    _locks.update(own=threading.Lock(), mapped=threading.Lock())


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)


def reduced(buffers, rebuild, args, *, ring):
    """The ``__reduce__`` value of a batch of ``buffers`` (bytes-like) that the unpickling
    process rebuilds as ``rebuild(views, *args)`` (see the module docstring)."""
    if ring and hasattr(os, "memfd_create"):
        with _locks["own"]:
            placed = _place([memoryview(b).cast("B") for b in buffers])
        if placed is not None:
            return _arrive, (*placed, rebuild, args)
    return _arrive_inside, ([bytes(memoryview(b).cast("B")) for b in buffers], rebuild, args)


class BytesOnArrival:
    """A DataLoader worker's batch of bytes records (TFRecord, JSONL) held as one Arrow
    ``large_binary`` array (one values buffer and int64 offsets), which the main process
    unpickles as the ``list`` of ``bytes`` the in-process batch is (``ring``: through the
    worker's shared memory). In the worker it reads like that list (``len``, indexing,
    iteration: for a ``collate_fn`` of one's own) but is no ``Sequence``, which the DataLoader's
    ``default_convert`` would walk record by record (0.7 s per million records)."""

    __slots__ = ("array", "ring", "format", "_records")

    def __init__(self, array, *, ring=False, format=None):
        self.array, self.ring, self.format, self._records = array, ring, format, None

    def records(self) -> list:
        """The records as the in-process batch holds them (made on first use)."""
        if self._records is None:
            self._records = _as_records(self.array.to_pylist(), self.format)
        return self._records

    def __len__(self):
        return len(self.array)

    def __getitem__(self, index):
        return self.records()[index]

    def __iter__(self):
        return iter(self.records())

    def __reduce__(self):
        count = len(self.array)
        if not count:
            return list, ()
        _, offsets, values = self.array.buffers()
        bounds = np.frombuffer(offsets, np.int64)[self.array.offset : self.array.offset + count + 1]
        first, last = int(bounds[0]), int(bounds[-1])
        values = b"" if values is None else values.slice(first, last - first)
        return reduced(
            [bounds - first if first else bounds, values],
            _bytes_list,
            (count, self.format),
            ring=self.ring,
        )


def _bytes_list(views, count, format=None):
    """The records of ``count`` payloads from their int64 offsets and values (Arrow's
    ``to_pylist``: 18 us per 256 records, 2.5x faster than slicing in Python)."""
    offsets, values = (pa.py_buffer(view) for view in views)
    return _as_records(
        pa.Array.from_buffers(pa.large_binary(), count, [None, offsets, values]).to_pylist(), format
    )


def _as_records(payloads: list, format) -> list:
    """``payloads`` as the loader hands records of ``format`` out (``bytes`` unless it says)."""
    if format is None:
        return payloads
    from pileshuffle.formats import get_format

    return get_format(format).records_of(payloads)


class ArrowOnArrival:
    """A DataLoader worker's ``pyarrow.RecordBatch`` sent as its Arrow IPC message (``ring``:
    through the worker's shared memory): pickle would send the whole buffers a sliced batch
    points into (a loaded pile per batch)."""

    __slots__ = ("batch", "ring")

    def __init__(self, batch, *, ring=False):
        self.batch, self.ring = batch, ring

    def __reduce__(self):
        return reduced([self.batch.serialize()], arrow_batch, (self.batch.schema,), ring=self.ring)


def arrow_batch(views, schema):
    """The ``RecordBatch`` of the IPC message in ``views[0]``, copied out (64-byte aligned)."""
    message = pa.allocate_buffer(views[0].nbytes)
    memoryview(message).cast("B")[:] = views[0].cast("B")
    return pa.ipc.read_record_batch(message, schema)


class _Ring:
    """A worker's ring: ``size`` bytes after the header, handed out in order by position
    (bytes handed out since creation, counting the gap skipped at each wrap)."""

    def __init__(self, size):
        self.fd = os.memfd_create("pileshuffle-batches", os.MFD_CLOEXEC)
        try:
            os.ftruncate(self.fd, _HEADER + size)
            self.map = mmap.mmap(self.fd, _HEADER + size)
        except OSError:
            os.close(self.fd)
            raise
        self.size, self.head = size, 0
        self.token = (os.getpid(), next(_serials))

    def reserve(self, total):
        """The position of ``total`` free bytes that do not wrap, or None when the main
        process has not yet released enough."""
        offset = self.head % self.size
        start = self.head if offset + total <= self.size else self.head + self.size - offset
        if start + total - _WORD.unpack_from(self.map, 0)[0] > self.size:
            return None
        self.head = start + total
        return start

    def handle(self):
        """The fd for the main process while it has not mapped the ring (a dup of it, taken
        by the main process over ``multiprocessing``'s resource sharer), else None."""
        return None if _WORD.unpack_from(self.map, 8)[0] else reduction.DupFd(self.fd)

    def close(self):
        self.map.close()
        os.close(self.fd)


def _aligned(n):
    return -(-n // _ALIGN) * _ALIGN


def _place(views):
    """Copy ``views`` into this worker's ring: (token, fd handle, ring size, spans, end), or
    None."""
    total = sum(_aligned(v.nbytes) for v in views) or _ALIGN
    ring = _ring_for(total)
    start = None if ring is None else ring.reserve(total)
    if start is None:
        return None
    spans, at = [], start % ring.size
    for view in views:
        ring.map[_HEADER + at : _HEADER + at + view.nbytes] = view
        spans.append((at, view.nbytes))
        at += _aligned(view.nbytes)
    return ring.token, ring.handle(), ring.size, spans, start + total


def _ring_for(total):
    """This process's ring, replaced by a bigger one when ``total`` is more than its share;
    None when that would be too big or shared memory cannot be had here (then never again)."""
    ring = _own.get("ring")
    if ring is None or total * _SHARE > ring.size:
        size = max(RING_BYTES, _aligned(total * _SHARE))
        if size > _MAX_RING or _own.get("refused"):
            return None
        if ring is not None:
            ring.close()  # the main process keeps its own mapping of it until it maps the new one
            _own.pop("ring")
        try:
            ring = _own["ring"] = _Ring(size)
        except OSError:
            # memfd_create refused (a sandbox) or no memory: batches go inside the pickle
            _own["refused"] = True
            return None
    return ring


def _arrive(token, handle, size, spans, end, rebuild, args):
    """In the main process: ``rebuild`` from the worker's ring, then release the region."""
    ring = _attach(token, handle, size)
    whole = memoryview(ring)
    try:
        return rebuild([whole[_HEADER + at : _HEADER + at + n] for at, n in spans], *args)
    finally:
        _WORD.pack_into(ring, 0, end)


def _arrive_inside(buffers, rebuild, args):
    return rebuild([memoryview(b) for b in buffers], *args)


def _attach(token, handle, size):
    """The main process's mapping of ring ``token``, made from ``handle`` the first time."""
    with _locks["mapped"]:
        ring = _mapped.get(token)
        if handle is not None:
            fd = handle.detach()  # also when already mapped: the worker holds the dup until taken
            try:
                if ring is None:
                    ring = mmap.mmap(fd, _HEADER + size)
                    _forget_rings_before(token)
                    _mapped[token] = ring
                    _WORD.pack_into(ring, 8, 1)
            finally:
                os.close(fd)
        if ring is None:
            raise RuntimeError(
                f"a batch names shared memory {token} that this process never mapped"
            )
        return ring


def _forget_rings_before(token):
    """Drop the mappings of the same worker's older rings and of workers that are gone (an
    mmap is unmapped once no view of it is left)."""
    pid, serial = token
    for old in list(_mapped):
        if (old[0] == pid and old[1] < serial) or (old[0] != pid and not _alive(old[0])):
            del _mapped[old]


def _alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except OSError:  # no such process, or by now another user's
        return False
