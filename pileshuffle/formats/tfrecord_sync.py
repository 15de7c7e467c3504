"""Finding a TFRecord frame from the middle of a file: the first position at or after an offset
where a frame begins whose length and data pass their CRCs.

A span of a file read from its middle starts there (``synced``), and a reader under
``--skip_corrupt`` resumes there after a corrupt frame (``resync``). A candidate is never taken on
its length CRC alone: its data is read whole and checked too, so a payload that merely contains
bytes looking like a header is not taken for a frame unless its data also passes.
"""

import struct

import numpy as np

from pileshuffle.formats.base import open_at, read_block
from pileshuffle.records.crc import FOOTER_BYTES, HEADER_BYTES, length_crcs_ok, masked_crc

__all__ = ["synced", "header_at", "resync"]

# resync's first look; each next window is twice the last
RESYNC_WINDOW_BYTES = 64 << 10


def synced(handle, path: str, base: int, chunk_bytes: int, file_size):
    """``(bytes from the first valid frame at or after file offset base, its offset)``, reading
    ``handle`` (at ``base``) as far as needed; ``(None, None)`` when none is before the end. A
    candidate's length and its masked CRC must match, its frame fit in the file and its data pass
    its CRC (read whole to check)."""
    buf, looked = b"", -1  # looked: the last position known not to start a valid frame
    while True:
        block = read_block(handle, path, chunk_bytes, False)
        buf += block
        at = resync(buf, looked)
        # a length past the end of the file: no frame
        while at is not None and file_size is not None and base + _frame_end(buf, at) > file_size:
            at = resync(buf, at)
        if at is not None and _frame_end(buf, at) <= len(buf):
            return buf[at:], base + at  # whole in buf: resync checked its data
        if not block:
            return None, None
        if at is None:  # keep what may still start a frame: a header cut by the block end
            keep = min(len(buf), HEADER_BYTES - 1)
            base, buf, looked = base + len(buf) - keep, buf[len(buf) - keep :], -1
        else:
            looked = at - 1  # its data runs past what was read: read more, look at it again


def _frame_end(buf: bytes, at: int) -> int:
    """Where the frame whose header starts at ``at`` in ``buf`` ends, by its length field."""
    return at + HEADER_BYTES + struct.unpack_from("<Q", buf, at)[0] + FOOTER_BYTES


def header_at(path: str, offset: int) -> bool:
    """Whether a length and its valid CRC start at ``offset``: a walk that broke 4 bytes before
    one broke on a frame's footer, the walk of a span begun inside a payload that holds frames
    (damage never breaks a walk there: a frame is at least 16 bytes)."""
    with open_at(path, offset) as handle:
        header = handle.read(HEADER_BYTES)
    return (
        len(header) == HEADER_BYTES
        and masked_crc(header[:8]) == struct.unpack_from("<I", header, 8)[0]
    )


def resync(buf: bytes, start: int):
    """First position after ``start`` where a frame with a valid length CRC begins whose data is
    valid or runs past the end of ``buf`` (read more to decide), or None; looked for in windows, 64
    KiB then doubling (a whole 16 MiB block was scanned for every span's start)."""
    last, raw = len(buf) - HEADER_BYTES, np.frombuffer(buf, dtype=np.uint8)
    first, window = start + 1, RESYNC_WINDOW_BYTES
    while first <= last:
        stop = min(last + 1, first + window)
        found = _first_frame_in(buf, raw, first, stop)
        if found is not None:
            return found
        first, window = stop, window * 2
    return None


def _first_frame_in(buf: bytes, raw: np.ndarray, first: int, stop: int):
    """``resync``'s answer among ``first .. stop-1``: candidates (a length's high 32 bits zero,
    records under 4 GiB) found with numpy, length CRCs checked vectorized, data CRCs one by one."""
    size, zero_high = len(buf), np.ones(stop - first, dtype=bool)
    for byte in range(4, 8):
        zero_high &= raw[first + byte : stop + byte] == 0
    candidates = np.flatnonzero(zero_high) + first
    for batch in range(0, len(candidates), 1 << 20):
        at = candidates[batch : batch + (1 << 20)]
        header_ok = length_crcs_ok(raw[at[:, None] + np.arange(HEADER_BYTES)])
        for pos in at[header_ok].tolist():
            end = pos + HEADER_BYTES + int.from_bytes(buf[pos : pos + 4], "little") + FOOTER_BYTES
            if (
                end > size
                or masked_crc(buf[pos + HEADER_BYTES : end - FOOTER_BYTES])
                == struct.unpack_from("<I", buf, end - FOOTER_BYTES)[0]
            ):
                return pos
    return None
