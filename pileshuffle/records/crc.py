"""TFRecord's CRC arithmetic, vectorized with numpy; no Beam (the loader uses it too).

A frame is ``uint64 length | uint32 masked_crc32c(length) | data | uint32 masked_crc32c(data)``.
CRC32C of an 8-byte field is affine in its bytes, ``crc(x) = crc(0) ^ XOR_k T[k][x_k]``, so
the length CRCs of a whole chunk are eight table look-ups per frame; the tables come from
``google_crc32c`` itself.
"""

import google_crc32c
import numpy as np

__all__ = [
    "HEADER_BYTES",
    "FOOTER_BYTES",
    "CRC_PRESET_BYTES",
    "masked_crc",
    "mask_crcs",
    "unmask_crcs",
    "length_crcs_ok",
    "stored_data_crcs",
    "payloads_match_stored_crcs",
]

HEADER_BYTES = 12  # a frame's uint64 length and its uint32 masked CRC
FOOTER_BYTES = 4  # a frame's uint32 masked CRC of its data
_MASK_DELTA = 0xA282EAD8
_U32 = 0xFFFFFFFF

# The 4 bytes that take a zeroed CRC32C register to 0xFFFFFFFF, the standard preset:
# the CRC32C of any payload is the raw CRC (register from 0, no final xor) of
# CRC_PRESET_BYTES + payload, xor 0xFFFFFFFF (tests derive it from google_crc32c).
CRC_PRESET_BYTES = bytes.fromhex("54641f64")
_PRESET_HEADER = np.frombuffer(bytes(8) + CRC_PRESET_BYTES, dtype=np.uint8)


def masked_crc(data: bytes) -> int:
    """TFRecord's masked CRC32C of ``data`` (as stored after a frame's length and after its data);
    ``mask_crcs`` is the same on arrays."""
    crc = google_crc32c.value(data)
    return ((((crc >> 15) | (crc << 17)) & _U32) + _MASK_DELTA) & _U32


def mask_crcs(crcs: np.ndarray) -> np.ndarray:
    """Vectorized TFRecord CRC mask (uint64 out)."""
    crcs = crcs.astype(np.uint64)
    return (
        (((crcs >> np.uint64(15)) | (crcs << np.uint64(17))) & np.uint64(_U32))
        + np.uint64(_MASK_DELTA)
    ) & np.uint64(_U32)


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


def _crc32c_of_u64_fields(fields: np.ndarray) -> np.ndarray:
    """CRC32C of each 8-byte row of an (n, 8) uint8 array."""
    out = np.full(len(fields), _ZERO_FIELD_CRC, dtype=np.uint32)
    for k in range(8):
        out ^= _FIELD_CRC_TABLES[k][fields[:, k]]
    return out


def length_crcs_ok(headers: np.ndarray) -> np.ndarray:
    """Per frame, whether its length field matches its stored CRC (``headers``: (n, 12) bytes)."""
    return (
        mask_crcs(_crc32c_of_u64_fields(headers[:, :8]))
        == np.ascontiguousarray(headers[:, 8:]).view("<u4").ravel()
    )


def stored_data_crcs(raw: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """The masked data CRC stored in the last 4 bytes of each frame ending at ``ends`` (uint32)."""
    return raw[(ends - FOOTER_BYTES)[:, None] + np.arange(FOOTER_BYTES)].copy().view("<u4").ravel()


def payloads_match_stored_crcs(
    raw: np.ndarray, begin: np.ndarray, ends: np.ndarray, stored=None
) -> bool:
    """Whether every frame's data matches its stored CRC, with one CRC pass over the
    frames ``raw[begin[0] : ends[-1]]`` (consecutive) instead of one Python call per
    record (``stored``: ``stored_data_crcs(raw, ends)`` if the caller has it, else read
    from the copy, which is in cache).

    In a copy of the frames each header becomes 8 zero bytes + ``CRC_PRESET_BYTES`` and each
    footer the raw register its payload should leave. A frame whose data matches its CRC is
    then a codeword (its raw CRC is 0), zeros add nothing, and the raw CRC of the copy is 0.
    One bad frame always makes it nonzero (CRC shifts are invertible); several bad frames
    cancel out with probability 2**-32, the chance a single corrupt record has of passing
    its own CRC."""
    if not len(begin):
        return True
    lo = int(begin[0])
    copy = raw[lo : int(ends[-1])].copy()
    copy[(begin - lo)[:, None] + np.arange(HEADER_BYTES)] = _PRESET_HEADER
    footers = (ends - lo - FOOTER_BYTES)[:, None] + np.arange(FOOTER_BYTES)
    if stored is None:
        stored = copy[footers].copy().view("<u4").ravel()
    registers = (unmask_crcs(stored) ^ np.uint64(_U32)).astype("<u4")
    copy[footers] = registers.view(np.uint8).reshape(-1, FOOTER_BYTES)
    copy.flags.writeable = False  # google_crc32c takes read-only buffers only
    # extend from 0xFFFFFFFF: a raw CRC, xor 0xFFFFFFFF
    return google_crc32c.extend(_U32, copy) == _U32
