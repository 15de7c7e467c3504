"""Record bytes -> Arrow, without Beam: TFRecord frames and JSONL lines as payload views.

A pile of a bytes format is held as the files' bytes as read (``pyarrow.Buffer``) plus
one 16-byte Arrow *binary view* per record (length, 4-byte prefix, buffer index,
offset) pointing at its payload: no payload is copied until a batch turns into Python
``bytes``. Taking a permutation moves views (numpy rows), never data.

TFRecord frames are checked as they are read: every length CRC (vectorized) and every
data CRC (one CRC pass over a patched copy of at most ``_CRC_WINDOW_BYTES`` of frames);
a bad frame raises ``InputError`` naming the file and the frame's byte offset.
"""

import struct

import numpy as np
import pyarrow as pa

from pileshuffle.crc import (FOOTER_BYTES, HEADER_BYTES, length_crcs_ok, masked_crc, payloads_match_stored_crcs,
                             stored_data_crcs)
from pileshuffle.errors import InputError

__all__ = ["frame_starts", "tfrecord_views", "line_views", "value_views", "view_array"]

_CRC_WINDOW_BYTES = 2 << 20
_NEWLINE = 10
_MAX_BUFFER_BYTES = 2**31 - 1  # a view's offset is an int32


def frame_starts(raw: np.ndarray, path: str) -> np.ndarray:
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
        raise InputError(path, f"truncated record: the frame at this offset needs {pos - starts[-2]:,} bytes "
                               f"but only {size - starts[-2]:,} remain in the file", int(starts[-2]))
    return starts


def _headers(raw: np.ndarray, begin: np.ndarray) -> np.ndarray:
    """The (n, 12) header bytes of frames starting at ``begin`` (a view when equally spaced)."""
    step = int(begin[1] - begin[0]) if len(begin) > 1 else 0
    if step >= HEADER_BYTES and int(begin[0]) + step * len(begin) <= len(raw) and (np.diff(begin) == step).all():
        return raw[int(begin[0]) : int(begin[0]) + step * len(begin)].reshape(len(begin), step)[:, :HEADER_BYTES]
    return raw[begin[:, None] + np.arange(HEADER_BYTES)]


def _check_headers(raw: np.ndarray, begin: np.ndarray, path: str):
    if not len(begin):
        return
    ok = length_crcs_ok(_headers(raw, begin))
    if not ok.all():
        raise InputError(path, "corrupt record: the length field fails its CRC", int(begin[np.argmin(ok)]))


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
                    raise InputError(path, f"corrupt record: the data ({b - a - HEADER_BYTES - FOOTER_BYTES} bytes) "
                                           "fails its CRC", a)


def _payload_views(raw: np.ndarray, starts: np.ndarray, lengths: np.ndarray, buffer_index: int) -> np.ndarray:
    """Arrow binary-view rows (n, 16 uint8) for payloads ``raw[starts[i] : starts[i] + lengths[i]]``
    of data buffer ``buffer_index``: payloads of at most 12 bytes inline, others by
    (length, 4-byte prefix, buffer index, offset). Temporaries are a few words per record."""
    n = len(starts)
    views = np.zeros((n, 4), dtype="<i4")
    if n == 0:
        return views.view(np.uint8)
    views[:, 0] = lengths
    last = len(raw) - 1
    prefix = np.zeros(n, dtype=np.uint32)
    for k in range(4):
        byte = raw[np.minimum(starts + k, last)].astype(np.uint32)
        prefix |= np.where(lengths > k, byte, 0).astype(np.uint32) << np.uint32(8 * k)
    views[:, 1] = prefix.view("<i4")
    views[:, 2] = buffer_index
    views[:, 3] = starts
    short = np.flatnonzero(lengths <= 12)
    if len(short):  # inline: bytes 4..15 hold the payload, zero-padded
        span = np.arange(12)
        inline = raw[np.minimum(starts[short, None] + span, last)]
        inline[span >= lengths[short, None]] = 0
        views.view(np.uint8)[short, 4:16] = inline
    return views.view(np.uint8)


def _raw(buffer: pa.Buffer, path: str) -> np.ndarray:
    if buffer.size > _MAX_BUFFER_BYTES:
        raise InputError(path, f"is {buffer.size:,} bytes: the loader reads files of at most 2 GiB (use more piles)")
    return np.frombuffer(buffer, dtype=np.uint8)


def tfrecord_views(buffer: pa.Buffer, path: str, buffer_index: int) -> np.ndarray:
    """Views of the payloads of a buffer of whole TFRecord frames, all CRCs checked."""
    raw = _raw(buffer, path)
    starts = frame_starts(raw, path)
    _check_frames(raw, starts, path)
    return _payload_views(raw, starts[:-1] + HEADER_BYTES, np.diff(starts) - HEADER_BYTES - FOOTER_BYTES, buffer_index)


def line_views(buffer: pa.Buffer, path: str, buffer_index: int) -> np.ndarray:
    """Views of the lines of a buffer of text, without their newline (a last line
    without one is a record too)."""
    raw = _raw(buffer, path)
    ends = np.flatnonzero(raw == _NEWLINE)
    starts = np.concatenate(([0], ends[:-1] + 1)).astype(np.int64) if len(ends) else np.zeros(0, np.int64)
    if len(raw) and (not len(ends) or ends[-1] != len(raw) - 1):
        starts = np.append(starts, ends[-1] + 1 if len(ends) else 0)
        ends = np.append(ends, len(raw))
    return _payload_views(raw, starts, ends - starts, buffer_index)


def value_views(values: pa.Buffer, offsets: np.ndarray) -> np.ndarray:
    """Views of the values of a binary Arrow array, from ``fingerprint.binary_column_parts``:
    its value bytes and its offsets rebased to 0."""
    raw = _raw(values, "a pile store column")
    return _payload_views(raw, offsets[:-1], np.diff(offsets), 0)


def view_array(views: np.ndarray, buffers) -> pa.Array:
    """A ``binary_view`` Arrow array over ``buffers`` from view rows (no data copied)."""
    return pa.Array.from_buffers(pa.binary_view(), len(views), [None, pa.py_buffer(np.ascontiguousarray(views)), *buffers])
