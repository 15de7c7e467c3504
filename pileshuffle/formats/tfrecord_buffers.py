"""A buffer of whole TFRecord frames read at once (the loader's whole reads): where its frames
start, both CRCs of every frame checked, and views of their payloads.

The buffer must end on a frame: a file cut inside its last frame is refused, never read short.
"""

import struct

import numpy as np
import pyarrow as pa

from pileshuffle.errors import InputError
from pileshuffle.formats.views import payload_views, raw_bytes
from pileshuffle.records.crc import (
    FOOTER_BYTES,
    HEADER_BYTES,
    length_crcs_ok,
    masked_crc,
    payloads_match_stored_crcs,
    stored_data_crcs,
)

__all__ = ["frame_payload_views"]

_CRC_WINDOW_BYTES = 2 << 20


def _frame_starts(raw: np.ndarray, path: str) -> np.ndarray:
    """Start offsets of the frames of a whole TFRecord file (plus its size at the end).

    Equal-length records (the common case) are found vectorized; otherwise the length
    fields are followed one by one. A file that does not end on a frame is refused."""
    size = len(raw)
    if size == 0:
        return np.zeros(1, np.int64)
    if size < HEADER_BYTES:
        raise InputError(path, f"truncated record: {size} bytes, too short for a header", 0)
    first = int(raw[:8].view("<u8")[0])
    step = first + HEADER_BYTES + FOOTER_BYTES
    if size % step == 0:
        starts = np.arange(0, size + 1, step, dtype=np.int64)
        lengths = np.ascontiguousarray(raw.reshape(-1, step)[:, :8]).view("<u8").ravel()
        if (lengths == first).all():
            return starts
    starts, pos, data = [], 0, raw.data
    unpack_from = struct.unpack_from
    while pos + HEADER_BYTES <= size:
        starts.append(pos)
        pos += HEADER_BYTES + unpack_from("<Q", data, pos)[0] + FOOTER_BYTES
    starts.append(pos)
    starts = np.asarray(starts, dtype=np.int64)
    if pos != size:
        _check_headers(raw, starts[:-1], path)  # a bad length field explains it better
        raise InputError(
            path,
            f"truncated record: the frame at this offset needs {pos - starts[-2]:,} bytes "
            f"but only {size - starts[-2]:,} remain in the file",
            int(starts[-2]),
        )
    return starts


def _headers(raw: np.ndarray, begin: np.ndarray) -> np.ndarray:
    """The (n, 12) header bytes of frames starting at ``begin`` (a view when equally spaced)."""
    step = int(begin[1] - begin[0]) if len(begin) > 1 else 0
    if (
        step >= HEADER_BYTES
        and int(begin[0]) + step * len(begin) <= len(raw)
        and (np.diff(begin) == step).all()
    ):
        return raw[int(begin[0]) : int(begin[0]) + step * len(begin)].reshape(len(begin), step)[
            :, :HEADER_BYTES
        ]
    return raw[begin[:, None] + np.arange(HEADER_BYTES)]


def _check_headers(raw: np.ndarray, begin: np.ndarray, path: str):
    if not len(begin):
        return
    ok = length_crcs_ok(_headers(raw, begin))
    if not ok.all():
        raise InputError(
            path, "corrupt record: the length field fails its CRC", int(begin[np.argmin(ok)])
        )


def _check_frames(raw: np.ndarray, starts: np.ndarray, path: str):
    """Both CRCs of every frame; raises ``InputError`` at the first bad one."""
    begin, ends = starts[:-1], starts[1:]
    _check_headers(raw, begin, path)
    cuts = np.searchsorted(begin, np.arange(0, int(starts[-1]), _CRC_WINDOW_BYTES)[1:])
    for window in np.split(np.arange(len(begin)), cuts):
        if len(window) and not payloads_match_stored_crcs(raw, begin[window], ends[window]):
            stored = stored_data_crcs(raw, ends[window]).tolist()
            for a, b, crc in zip(begin[window].tolist(), ends[window].tolist(), stored):
                if masked_crc(raw[a + HEADER_BYTES : b - FOOTER_BYTES]) != crc:
                    raise InputError(
                        path,
                        f"corrupt record: the data ({b - a - HEADER_BYTES - FOOTER_BYTES} bytes) "
                        "fails its CRC",
                        a,
                    )


def frame_payload_views(buffer: pa.Buffer, path: str, buffer_index: int) -> np.ndarray:
    """Views of the payloads of a buffer of whole TFRecord frames, all CRCs checked."""
    raw = raw_bytes(buffer, path)
    starts = _frame_starts(raw, path)
    _check_frames(raw, starts, path)
    return payload_views(
        raw, starts[:-1] + HEADER_BYTES, np.diff(starts) - HEADER_BYTES - FOOTER_BYTES, buffer_index
    )
