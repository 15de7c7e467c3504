"""CRC32C of many slices of one buffer from one compiled loop (numba), without the GIL.

Record fingerprints need a CRC32C per value. Google's crc32c library computes one at about
7 GB/s here, but a Python call per value costs about 1.4 us whatever its length: a 16 MB chunk
takes 24 ms as 1 KB values and 257 ms as 40-byte ones, one call each, against 3.3 and 13 ms from
this loop, which calls the same library (as ``checksums._native_library`` finds it) from code numba
compiles (``python bench/value_crc_cost.py``). Compiling costs a process 1.1-1.4 s and 122 MiB
(numba's import and first dispatch; its on-disk cache saves little of it), with the GIL held, so
``fingerprint`` hashes in Python until that has cost a process as long (ski rental: never more than
twice the cheaper way).
"""

import ctypes

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from pileshuffle import checksums

__all__ = ["slice_crcs"]


@intrinsic
def _extend_at(typingctx, address, crc, pointer, length):
    """Call ``uint32_t crc32c_extend(uint32_t crc, const uint8_t *data, size_t count)`` at ``address``."""
    def codegen(context, builder, signature, args):
        byte_pointer = ir.IntType(8).as_pointer()
        function_type = ir.FunctionType(ir.IntType(32), [ir.IntType(32), byte_pointer, ir.IntType(64)])
        function = builder.inttoptr(args[0], function_type.as_pointer())
        return builder.call(function, [args[1], builder.inttoptr(args[2], byte_pointer), args[3]])
    return types.uint32(types.intp, types.uint32, types.intp, types.intp), codegen


@numba.njit(nogil=True)
def _slice_crcs(address, raw, starts, lengths):
    crcs = np.empty(len(starts), np.uint64)
    base = raw.ctypes.data
    for i in range(len(starts)):
        crcs[i] = _extend_at(address, np.uint32(0), base + starts[i], lengths[i])
    return crcs


def slice_crcs(raw: np.ndarray, starts: np.ndarray, lengths: np.ndarray):
    """CRC32C of ``raw[starts[i] : starts[i] + lengths[i]]`` for every i (uint64), or None where
    Google's library is not found (``google_crc32c`` without its native part)."""
    library = checksums._native_library()
    if library is None:
        return None
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    starts, lengths = np.asarray(starts, dtype=np.int64), np.asarray(lengths, dtype=np.int64)
    if len(starts) and (starts.min() < 0 or lengths.min() < 0 or (starts + lengths).max() > raw.size):
        raise ValueError(f"slices outside a buffer of {raw.size:,} bytes")  # the loop reads memory unchecked
    return _slice_crcs(ctypes.cast(library.crc32c_extend, ctypes.c_void_p).value, raw, starts, lengths)
