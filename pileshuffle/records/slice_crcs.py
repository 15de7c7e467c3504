"""The CRCs of many slices of one buffer (a column's values, a chunk's records): CRC32C for the
fingerprints' record hashes, zlib's CRC-32 for ``--dedup``'s contents; no copy of the buffer.

Equal to one ``google_crc32c.value`` (``zlib.crc32``) per slice whichever way runs: in Python
(short values all at once, ``_crc32c_across``; longer ones one call each) until this process has
spent what compiling costs, then the compiled loop (``compiled_crc``, numba: the pipeline extra's).
"""

import time
import zlib

import google_crc32c
import numpy as np

__all__ = ["expect_records", "crc32c_of_slices", "crc32_of_slices"]


def crc32c_of_slices(data, offsets: np.ndarray, trim_end: int = 0) -> np.ndarray:
    """CRC32C of ``data[offsets[i] : offsets[i+1] - trim_end]`` for every i: from the compiled
    loop (``compiled_crc``) once this process has spent ``_COMPILE_AFTER_SECONDS`` of CPU hashing
    in Python; before that values of at most ``_ACROSS_MAX_BYTES`` all at once
    (``_crc32c_across``), longer ones one call each (``_crc32c_each``). No copy of ``data`` either
    way."""
    global _python_seconds
    starts = np.asarray(offsets[:-1], dtype=np.int64)
    lengths = np.asarray(offsets[1:], dtype=np.int64) - starts - trim_end
    raw = np.frombuffer(data, dtype=np.uint8)
    compiled = _compiled_slice_crcs()
    crcs = compiled(raw, starts, lengths) if compiled else None
    if crcs is not None:
        return crcs
    began = time.thread_time()
    crcs = np.empty(len(starts), dtype=np.uint64)
    short = lengths <= _ACROSS_MAX_BYTES
    if short.any():
        crcs[short] = _crc32c_across_batches(raw, starts[short], lengths[short])
    if not short.all():
        crcs[~short] = _crc32c_each(raw, starts[~short], lengths[~short])
    _python_seconds += time.thread_time() - began
    return crcs


def crc32_of_slices(
    data, offsets: np.ndarray, trim_start: int = 0, trim_end: int = 0
) -> np.ndarray:
    """CRC-32 (zlib's) of ``data[offsets[i] + trim_start : offsets[i+1] - trim_end]`` for every
    i: from the compiled loop once this process has paid for compiling it (as
    ``crc32c_of_slices``), else one call each."""
    global _python_seconds
    starts = np.asarray(offsets[:-1], dtype=np.int64) + trim_start
    lengths = np.asarray(offsets[1:], dtype=np.int64) - starts - trim_end
    compiled = _compiled_slice_crcs()
    if compiled:
        crcs = compiled(np.frombuffer(data, dtype=np.uint8), starts, lengths, "crc32")
        if crcs is not None:
            return crcs
    began = time.thread_time()
    view = memoryview(data).cast("B")
    crcs = np.fromiter(
        (zlib.crc32(view[a : a + n]) for a, n in zip(starts.tolist(), lengths.tolist())),
        dtype=np.uint64,
        count=len(starts),
    )
    _python_seconds += time.thread_time() - began
    return crcs


# Compiling ``compiled_crc``'s loop costs a process 0.66-0.89 s of CPU (numba 0.68, in a
# process that has imported Beam; 0.48 s with numba's on-disk cache, not used), during which
# numba holds the GIL for 1.1-1.4 s: every other worker thread waits (2 threads: about 2.5
# thread-seconds). A process compiles it once it has spent that long hashing in Python (ski
# rental: a short run never pays for it, a long one pays at most about twice what the cheaper
# way would have cost). The meter is the hashing threads' CPU time, not wall time: on this loaded
# VM the wall-time meter read 1.7 and 2.5 s in two runs of the same 2 GB JSONL, so whether a run
# compiled was chance. 2 GB of ~500-byte JSONL lines hash in about 1.5 s of CPU here, 1 GB of
# 1 KB Parquet rows in 0.5 s.
_COMPILE_AFTER_SECONDS = 2.5
_python_seconds = 0.0
# A process told how many records it will hash (``expect_records``) compiles at once when
# hashing them in Python would cost more than compiling: about 0.37 us of CPU a record in Python
# (1.5 s for 4M JSONL lines, 0.48 s for 1M Parquet rows of two byte columns) against 0.7 s to
# compile. Measured on 2 GB of JSONL: 8.25 -> 7.57 s of user CPU compiling at once; 1 GB of
# Parquet would lose 0.25 s.
_PYTHON_SECONDS_PER_RECORD = 0.37e-6
_COMPILE_SECONDS = 0.7


def expect_records(records: int):
    """Tell this process it will hash about ``records`` records: compile the loop from the first
    hash when hashing that many in Python would cost more than compiling (else keep the meter)."""
    global _python_seconds
    if records * _PYTHON_SECONDS_PER_RECORD > _COMPILE_SECONDS:
        _python_seconds = max(_python_seconds, _COMPILE_AFTER_SECONDS)


def _compiled_slice_crcs():
    """``compiled_crc.slice_crcs`` once this process has spent ``_COMPILE_AFTER_SECONDS`` hashing
    in Python, else (or where numba is not installed) None."""
    if _python_seconds < _COMPILE_AFTER_SECONDS:
        return None
    try:
        from pileshuffle.records import compiled_crc
    except ImportError:
        # numba is the pipeline extra's; without it every value is hashed in Python
        return None
    return compiled_crc.slice_crcs


def _crc32c_each(raw: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """CRC32C of each slice of ``raw``, one ``google_crc32c`` call per slice: on a numpy view of
    the slice (no copy) when the slices are long, on a ``bytes`` slice of one copy of ``raw``
    when they are short (``_VIEWS_FROM_MEAN_BYTES``)."""
    if lengths.mean() >= _VIEWS_FROM_MEAN_BYTES:
        pieces = raw
    else:
        # bytes given: no copy
        whole = isinstance(raw.base, bytes) and len(raw.base) == len(raw)
        pieces = raw.base if whole else raw.tobytes()
    value = google_crc32c.value
    return np.fromiter(
        (value(pieces[a:b]) for a, b in zip(starts.tolist(), (starts + lengths).tolist())),
        dtype=np.uint64,
        count=len(starts),
    )


# Making a numpy view costs more than slicing a bytes object (which copies the value), but the
# bytes need one copy of the whole buffer first. Per 16 MiB of values (google_crc32c 1.9, numpy
# 2.4, user CPU): 100-byte values 47 ms as views against 38 as bytes, 200 bytes 21 against 21,
# 500 bytes 10.2 against 11.3, 1 KB 5.4 against 6.8, 4 KB 2.0 against 4.0.
_VIEWS_FROM_MEAN_BYTES = 256


# A Python call per value costs about 200-400 ns whatever its length; CRC32C run across all
# values at once costs about 0.6 ns per value byte per pass (numpy, 4 bytes a step): it is the
# cheaper one up to about 50 bytes (125,000 values: 10 against 23 ms at 16 bytes, 14 against
# 23 at 32, 26 against 22 at 64). Short values are ids, names, labels and categories: a table
# with many such columns made one call per value per column.
_ACROSS_MAX_BYTES = 32
# ... in batches of this many slices: its working arrays then stay in the CPU's caches. All at
# once its cost per value grew with the count (24-byte values: 169 ns each for 16,000 of them,
# 294 ns for 700,000, against 223 ns one call each): a JSONL chunk of short lines has 700,000.
_ACROSS_BATCH = 16_384


def _crc32c_across_batches(raw: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """``_crc32c_across`` of ``_ACROSS_BATCH`` slices at a time."""
    if len(starts) <= _ACROSS_BATCH:
        return _crc32c_across(raw, starts, lengths)
    parts = [slice(at, at + _ACROSS_BATCH) for at in range(0, len(starts), _ACROSS_BATCH)]
    return np.concatenate([_crc32c_across(raw, starts[part], lengths[part]) for part in parts])


def _crc32c_tables() -> np.ndarray:
    """Slicing-by-4 tables of the reflected CRC32C polynomial: ``tables[k][b]`` is the
    register change of byte ``b`` followed by ``k`` zero bytes."""
    first = np.zeros(256, dtype=np.uint32)
    for byte in range(256):
        register = byte
        for _ in range(8):
            register = (register >> 1) ^ (0x82F63B78 if register & 1 else 0)
        first[byte] = register
    tables = [first]
    for _ in range(3):
        tables.append((tables[-1] >> np.uint32(8)) ^ first[tables[-1] & np.uint32(0xFF)])
    return np.stack(tables)


_CRC32C_TABLES = _crc32c_tables()


def _crc32c_across(raw: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """CRC32C of ``raw[starts[i] : starts[i] + lengths[i]]`` for every i, the table-driven
    algorithm run across all slices at once: longest first, so the slices that still have
    a byte at position ``k`` are a prefix; four bytes a step, then the shorter ones' last
    bytes one at a time. Equal to ``google_crc32c.value`` of each slice (tests check)."""
    order = np.argsort(-lengths, kind="stable")
    starts, lengths = starts[order], lengths[order]
    longest = int(lengths[0]) if len(lengths) else 0
    # having[k]: how many slices have a byte at position k (lengths are in decreasing order)
    having = len(lengths) - np.searchsorted(lengths[::-1], np.arange(longest + 4), side="right")
    table, t3, t2, t1, t0 = _CRC32C_TABLES[0], *_CRC32C_TABLES[::-1]
    register = np.full(len(starts), 0xFFFFFFFF, dtype=np.uint32)
    for k in range(0, longest, 4):
        whole = int(having[k + 3])  # slices with all four bytes k..k+3
        if whole:
            at = starts[:whole] + k
            word = register[:whole] ^ (
                raw[at].astype(np.uint32)
                | raw[at + 1].astype(np.uint32) << 8
                | raw[at + 2].astype(np.uint32) << 16
                | raw[at + 3].astype(np.uint32) << 24
            )
            register[:whole] = (
                t3[word & 0xFF] ^ t2[(word >> 8) & 0xFF] ^ t1[(word >> 16) & 0xFF] ^ t0[word >> 24]
            )
        for j in range(k, k + 3):  # slices ending inside this step: their bytes one at a time
            ending = register[whole : int(having[j])]
            ending[:] = table[(ending ^ raw[starts[whole : int(having[j])] + j]) & 0xFF] ^ (
                ending >> 8
            )
    crcs = np.empty(len(starts), dtype=np.uint64)
    crcs[order] = register ^ np.uint32(0xFFFFFFFF)
    return crcs
