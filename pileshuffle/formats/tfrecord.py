"""TFRecord: ``uint64 length | uint32 masked_crc32c(length) | data | uint32 masked_crc32c(data)``.

Reading verifies both CRCs of every record and keeps each record as its whole frame
(column ``tfrecord_frame``): a frame does not depend on its position, so a shard is
written by copying frames, with no CRC to compute again. Records given as payloads
(column ``record``) are framed at write time.
"""

import struct

import google_crc32c
import numpy as np
import pyarrow as pa

from pileshuffle.errors import InputError
from pileshuffle.fingerprint import binary_column_parts
from pileshuffle.formats.base import (
    DEFAULT_CHUNK_BYTES,
    RECORD_COLUMN,
    RecordFormat,
    binary_table,
    compression_of,
    open_input,
    read_block,
)

FRAME_COLUMN = "tfrecord_frame"
HEADER_BYTES = 12
FOOTER_BYTES = 4
_MASK_DELTA = 0xA282EAD8
_U32 = 0xFFFFFFFF


def masked_crc(data: bytes) -> int:
    crc = google_crc32c.value(data)
    return ((((crc >> 15) | (crc << 17)) & _U32) + _MASK_DELTA) & _U32


def unmask_crcs(masked: np.ndarray) -> np.ndarray:
    """Vectorized inverse of the TFRecord CRC mask (uint32 in, uint64 out)."""
    rot = (masked.astype(np.uint64) - np.uint64(_MASK_DELTA)) & np.uint64(_U32)
    return ((rot >> np.uint64(17)) | (rot << np.uint64(15))) & np.uint64(_U32)


def frame(payload: bytes) -> bytes:
    header = struct.pack("<Q", len(payload))
    return b"".join((header, struct.pack("<I", masked_crc(header)), payload, struct.pack("<I", masked_crc(payload))))


def scan_frames(buf: bytes, base_offset: int):
    """Walk complete, valid frames from the start of ``buf``.

    Returns ``(starts, end, problem)``: frame start positions, the position after the
    last complete valid frame, and a description of the corruption found at ``end``
    (None if the walk stopped only because ``buf`` ends inside a frame).
    """
    unpack_from = struct.unpack_from
    crc = masked_crc
    size = len(buf)
    starts = []
    pos = 0
    while pos + HEADER_BYTES <= size:
        length, length_crc = unpack_from("<QI", buf, pos)
        if crc(buf[pos : pos + 8]) != length_crc:
            return starts, pos, "corrupt record: the length field fails its CRC"
        end = pos + HEADER_BYTES + length + FOOTER_BYTES
        if end > size:
            return starts, pos, None
        (data_crc,) = unpack_from("<I", buf, end - FOOTER_BYTES)
        if crc(buf[pos + HEADER_BYTES : end - FOOTER_BYTES]) != data_crc:
            return starts, pos, f"corrupt record: the data ({length} bytes) fails its CRC"
        starts.append(pos)
        pos = end
    return starts, pos, None


def resync(buf: bytes, start: int):
    """First position after ``start`` where a whole frame with a valid length CRC and
    data CRC begins, or None. Candidates are positions whose length's high 32 bits are
    zero (records under 4 GiB), found with numpy before any CRC is computed."""
    raw = np.frombuffer(buf, dtype=np.uint8)
    last = len(buf) - HEADER_BYTES - FOOTER_BYTES
    if last <= start:
        return None
    window = raw[start + 1 : last + 8]
    zero_high = np.ones(last - start, dtype=bool)
    for byte in range(4, 8):
        zero_high &= window[byte : byte + last - start] == 0
    for pos in (np.flatnonzero(zero_high) + start + 1).tolist():
        starts, _, _ = scan_frames(buf[pos : pos + HEADER_BYTES + int.from_bytes(buf[pos : pos + 4], "little") + FOOTER_BYTES], 0)
        if starts:
            return pos
    return None


class TFRecordFormat(RecordFormat):
    name = "tfrecord"

    def suffix(self, compression):
        return ".tfrecord.gz" if compression == "gzip" else ".tfrecord"

    def read_chunks(self, path, chunk_bytes=DEFAULT_CHUNK_BYTES, skip_corrupt=False, report=None):
        compressed = compression_of(path) != "uncompressed"
        buf, base, eof = b"", 0, False
        with open_input(path) as handle:
            while not eof:
                block = read_block(handle, path, chunk_bytes, compressed)
                eof = not block
                buf = buf + block if buf else block
                buf, base = yield from self._drain(path, buf, base, eof, skip_corrupt, report, chunk_bytes)
        if buf:
            self._truncated(path, buf, base, skip_corrupt, report)

    @staticmethod
    def _drain(path, buf, base, eof, skip_corrupt, report, chunk_bytes):
        """Yield every complete frame of ``buf``; return the unread tail and its file offset.

        Under ``skip_corrupt`` a corrupt frame is skipped up to the next valid frame
        (searched over at most 4 chunks, or to the end of the file)."""
        while True:
            starts, end, problem = scan_frames(buf, base)
            if starts:
                yield binary_table(FRAME_COLUMN, buf, np.append(starts, end))
            if problem is None:
                return buf[end:], base + end
            if not skip_corrupt:
                raise InputError(path, problem, base + end)
            good = resync(buf, end)
            if good is None and not eof and len(buf) - end < 4 * chunk_bytes:
                return buf[end:], base + end  # read more before deciding where to resume
            resume = len(buf) if good is None else good
            report.skip(path, base + end, problem, 1, resume - end)
            buf, base = buf[resume:], base + resume

    @staticmethod
    def _truncated(path, buf, base, skip_corrupt, report):
        if len(buf) < HEADER_BYTES:
            problem = f"truncated record: {len(buf)} bytes at the end of the file, too short for a header"
        else:
            (length,) = struct.unpack_from("<Q", buf, 0)
            need = HEADER_BYTES + length + FOOTER_BYTES
            problem = f"truncated record: its header says {need} bytes but only {len(buf)} remain in the file"
        if not skip_corrupt:
            raise InputError(path, problem, base)
        report.skip(path, base, problem, 1, len(buf))

    def write_shard(self, handle, tables, compression, schema=None):
        written = 0
        for table in tables:
            if FRAME_COLUMN in table.column_names:
                data, _ = binary_column_parts(table.column(FRAME_COLUMN))
                handle.write(memoryview(data))
            else:
                column = table.column(RECORD_COLUMN)
                data, offsets = binary_column_parts(column)
                data, bounds = data.to_pybytes(), offsets.tolist()
                handle.write(b"".join(frame(data[a:b]) for a, b in zip(bounds[:-1], bounds[1:])))
            written += table.num_rows
        return written


def frame_payload_stats(column) -> tuple:
    """(payload CRC32Cs, payload lengths) of a ``tfrecord_frame`` column, read from the frames."""
    data, offsets = binary_column_parts(column)
    if len(offsets) == 1:
        return np.zeros(0, np.uint64), np.zeros(0, np.int64)
    raw = np.frombuffer(data, dtype=np.uint8)
    ends = offsets[1:]
    crc_bytes = raw[(ends - FOOTER_BYTES)[:, None] + np.arange(4)]
    masked = crc_bytes.copy().view("<u4").ravel()
    lengths = np.diff(offsets) - HEADER_BYTES - FOOTER_BYTES
    return unmask_crcs(masked), lengths


def is_frames(table: pa.Table) -> bool:
    return FRAME_COLUMN in table.column_names
