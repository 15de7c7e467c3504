"""TFRecord's CRC arithmetic, vectorized with numpy; no Beam (the loader uses it too).

A frame is ``uint64 length | uint32 masked_crc32c(length) | data | uint32 masked_crc32c(data)``.
CRC32C of an 8-byte field is affine in its bytes, ``crc(x) = crc(0) ^ XOR_k T[k][x_k]``, so
the length CRCs of a whole chunk are eight table look-ups per frame; the tables come from
``google_crc32c`` itself.
"""

import google_crc32c
import numpy as np

HEADER_BYTES = 12
FOOTER_BYTES = 4
_MASK_DELTA = 0xA282EAD8
_U32 = 0xFFFFFFFF

# The 4 bytes that take a zeroed CRC32C register to 0xFFFFFFFF, the standard preset:
# the CRC32C of any payload is the raw CRC (register from 0, no final xor) of
# CRC_PRESET_BYTES + payload, xor 0xFFFFFFFF (tests derive it from google_crc32c).
CRC_PRESET_BYTES = bytes.fromhex("54641f64")
PRESET_HEADER = np.frombuffer(bytes(8) + CRC_PRESET_BYTES, dtype=np.uint8)


def masked_crc(data: bytes) -> int:
    crc = google_crc32c.value(data)
    return ((((crc >> 15) | (crc << 17)) & _U32) + _MASK_DELTA) & _U32


def mask_crcs(crcs: np.ndarray) -> np.ndarray:
    """Vectorized TFRecord CRC mask (uint64 out)."""
    crcs = crcs.astype(np.uint64)
    return ((((crcs >> np.uint64(15)) | (crcs << np.uint64(17))) & np.uint64(_U32)) + np.uint64(_MASK_DELTA)) & np.uint64(_U32)


def unmask_crcs(masked: np.ndarray) -> np.ndarray:
    """Vectorized inverse of the TFRecord CRC mask (uint32 in, uint64 out)."""
    rot = (masked.astype(np.uint64) - np.uint64(_MASK_DELTA)) & np.uint64(_U32)
    return ((rot >> np.uint64(17)) | (rot << np.uint64(15))) & np.uint64(_U32)


def _u64_field_crc_tables():
    zero = google_crc32c.value(bytes(8))
    tables = np.zeros((8, 256), dtype=np.uint32)
    for k in range(8):
        for v in range(256):
            field = bytearray(8)
            field[k] = v
            tables[k, v] = google_crc32c.value(bytes(field)) ^ zero
    return np.uint32(zero), tables


_ZERO_FIELD_CRC, _FIELD_CRC_TABLES = _u64_field_crc_tables()


def crc32c_of_u64_fields(fields: np.ndarray) -> np.ndarray:
    """CRC32C of each 8-byte row of an (n, 8) uint8 array."""
    out = np.full(len(fields), _ZERO_FIELD_CRC, dtype=np.uint32)
    for k in range(8):
        out ^= _FIELD_CRC_TABLES[k][fields[:, k]]
    return out
