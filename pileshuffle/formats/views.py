"""Payload views: how the loader holds the records of a bytes format without copying them.

A pile of a bytes format is held as the files' bytes as read (``pyarrow.Buffer``) plus
one 16-byte Arrow *binary view* per record (length, 4-byte prefix, buffer index,
offset) pointing at its payload: no payload is copied until a batch turns into Python
``bytes``. Taking a permutation moves views (numpy rows), never data. Each bytes format
finds its payloads in a buffer (``RecordFormat.payload_views``); this module makes the views.
"""

import numpy as np
import pyarrow as pa

from pileshuffle.errors import InputError

__all__ = ["VIEW_ITEM", "payload_views", "raw_bytes", "shift_buffers", "value_views", "view_array"]

_MAX_BUFFER_BYTES = 2**31 - 1  # a view's offset is an int32
# one view as one numpy item: 8x faster to gather or scatter than (n, 16) uint8
VIEW_ITEM = np.dtype((np.void, 16))


def payload_views(
    raw: np.ndarray, starts: np.ndarray, lengths: np.ndarray, buffer_index: int
) -> np.ndarray:
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


def raw_bytes(buffer: pa.Buffer, path: str) -> np.ndarray:
    """``buffer`` as uint8 (no copy); refuses one over 2 GiB, which a view's int32 offset cannot
    reach."""
    if buffer.size > _MAX_BUFFER_BYTES:
        raise InputError(
            path,
            f"is {buffer.size:,} bytes: the loader reads files of at most 2 GiB (use more piles)",
        )
    return np.frombuffer(buffer, dtype=np.uint8)


def value_views(values: pa.Buffer, offsets: np.ndarray) -> np.ndarray:
    """Views of the values of a binary Arrow array, from ``fingerprint.binary_column_parts``:
    its value bytes and its offsets rebased to 0."""
    raw = raw_bytes(values, "a pile store column")
    return payload_views(raw, offsets[:-1], np.diff(offsets), 0)


def view_array(views: np.ndarray, buffers) -> pa.Array:
    """A ``binary_view`` Arrow array over ``buffers`` from view rows (no data copied)."""
    return pa.Array.from_buffers(
        pa.binary_view(), len(views), [None, pa.py_buffer(np.ascontiguousarray(views)), *buffers]
    )


def shift_buffers(views: np.ndarray, by: int) -> np.ndarray:
    """``views`` pointing ``by`` buffers further (a copy; inline views stay as they are),
    or ``views`` themselves when ``by`` is 0: the callers copy them anyway."""
    if not by:
        return views
    shifted = views.copy()
    out_of_line = shifted[:, :4].view("<i4").ravel() > 12
    shifted[out_of_line, 8:12] = (shifted[out_of_line, 8:12].view("<i4") + by).view(np.uint8)
    return shifted
