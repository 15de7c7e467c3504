"""CRC32C (or zlib's CRC-32) of many slices of one buffer in one compiled loop (numba), no GIL.

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
import ctypes.util
import functools

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from pileshuffle.io import checksums

__all__ = ["slice_crcs"]


def _call_at(crc_bits: int, length_bits: int):
    """An intrinsic ``(address, crc, pointer, length) -> crc`` that calls the C function at
    ``address`` taking and returning a ``crc_bits``-bit CRC, with a ``length_bits``-bit byte
    count."""
    crc_type, length_type, numba_crc = (
        ir.IntType(crc_bits),
        ir.IntType(length_bits),
        getattr(types, f"uint{crc_bits}"),
    )

    @intrinsic
    def call(typingctx, address, crc, pointer, length):
        def codegen(context, builder, signature, args):
            byte_pointer = ir.IntType(8).as_pointer()
            signature_type = ir.FunctionType(crc_type, [crc_type, byte_pointer, length_type])
            function = builder.inttoptr(args[0], signature_type.as_pointer())
            count = args[3] if length_bits == 64 else builder.trunc(args[3], length_type)
            return builder.call(function, [args[1], builder.inttoptr(args[2], byte_pointer), count])

        return numba_crc(types.intp, numba_crc, types.intp, types.intp), codegen

    return call


# uint32_t crc32c_extend(uint32_t crc, const uint8_t *data, size_t count)
_extend_at = _call_at(32, 64)
_zlib_crc32_at = _call_at(64, 32)  # zlib's uLong crc32(uLong crc, const Bytef *buf, uInt len)


@numba.njit(nogil=True)
def _slice_crcs(address, zlib, raw, starts, lengths):
    crcs = np.empty(len(starts), np.uint64)
    base = raw.ctypes.data
    for i in range(len(starts)):
        if zlib:
            crcs[i] = _zlib_crc32_at(address, np.uint64(0), base + starts[i], lengths[i])
        else:
            crcs[i] = _extend_at(address, np.uint32(0), base + starts[i], lengths[i])
    return crcs


@functools.lru_cache(maxsize=None)
def _zlib_crc32_address():
    """The address of zlib's ``crc32`` (the library Python's ``zlib`` module uses), or None."""
    name = ctypes.util.find_library("z")
    return None if name is None else ctypes.cast(ctypes.CDLL(name).crc32, ctypes.c_void_p).value


def slice_crcs(raw: np.ndarray, starts: np.ndarray, lengths: np.ndarray, kind: str = "crc32c"):
    """CRC32C (``kind`` "crc32", zlib's CRC-32) of ``raw[starts[i] : starts[i] + lengths[i]]`` for
    every i (uint64), or None where the library is not found (``google_crc32c`` without its native
    part, no libz)."""
    if kind == "crc32":
        address = _zlib_crc32_address()
    else:
        library = checksums._native_library()
        address = (
            None if library is None else ctypes.cast(library.crc32c_extend, ctypes.c_void_p).value
        )
    if address is None:
        return None
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    starts, lengths = np.asarray(starts, dtype=np.int64), np.asarray(lengths, dtype=np.int64)
    if len(starts) and (
        starts.min() < 0 or lengths.min() < 0 or (starts + lengths).max() > raw.size
    ):
        # the loop reads memory unchecked
        raise ValueError(f"slices outside a buffer of {raw.size:,} bytes")
    if kind == "crc32" and len(lengths) and lengths.max() >= 2**32:
        return None  # zlib's length is 32 bits
    return _slice_crcs(address, kind == "crc32", raw, starts, lengths)
