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

from pileshuffle import storage
from pileshuffle.crc import (FOOTER_BYTES, HEADER_BYTES, length_crcs_ok, mask_crcs, masked_crc,
                             payloads_match_stored_crcs, stored_data_crcs, unmask_crcs)
from pileshuffle.errors import InputError
from pileshuffle.fingerprint import binary_column_parts
from pileshuffle.formats.base import (DEFAULT_CHUNK_BYTES, RECORD_COLUMN, RecordFormat, binary_table, open_input,
                                      read_block)
from pileshuffle.names import FRAME_COLUMN
from pileshuffle.storage import compression_of

NOT_TFRECORD = " (the file's first bytes are no TFRecord header: is it another format? give its --format)"


def frame(payload: bytes) -> bytes:
    header = struct.pack("<Q", len(payload))
    return b"".join((header, struct.pack("<I", masked_crc(header)), payload, struct.pack("<I", masked_crc(payload))))


def _walk(buf: bytes, size: int):
    """Frame starts found by following length fields (not yet verified), and the end."""
    unpack_from = struct.unpack_from
    starts = []
    pos = 0
    while pos + HEADER_BYTES <= size:
        (length,) = unpack_from("<Q", buf, pos)
        end = pos + HEADER_BYTES + length + FOOTER_BYTES
        if end > size:
            break
        starts.append(pos)
        pos = end
    return starts, pos


def scan_frames(buf: bytes, base_offset: int = 0):
    """Walk complete, valid frames from the start of ``buf``.

    Returns ``(starts, end, problem)``: frame start positions, the position after the
    last complete valid frame, and a description of the corruption found at ``end``
    (None if the walk stopped only because ``buf`` ends inside a frame). Both CRCs of
    every frame are checked: length CRCs vectorized, data CRCs all at once
    (``payloads_match_stored_crcs``), and one by one only to find the first bad frame.
    """
    size = len(buf)
    starts, pos = _walk(buf, size)
    raw = np.frombuffer(buf, dtype=np.uint8)
    begin = np.asarray(starts, dtype=np.int64)
    ends = np.append(begin[1:], pos) if len(starts) else begin
    headers = raw[begin[:, None] + np.arange(HEADER_BYTES)] if len(starts) else np.zeros((0, HEADER_BYTES), np.uint8)
    header_ok = length_crcs_ok(headers)
    stored = stored_data_crcs(raw, ends)
    if header_ok.all() and payloads_match_stored_crcs(raw, begin, ends, stored):
        bad = ()
    else:
        value = google_crc32c.value
        data_crcs = np.fromiter(
            (value(buf[a:b]) for a, b in zip((begin + HEADER_BYTES).tolist(), (ends - FOOTER_BYTES).tolist())),
            dtype=np.uint64, count=len(starts),
        )
        bad = np.flatnonzero(~(header_ok & (mask_crcs(data_crcs) == stored)))
    if len(bad):
        first = int(bad[0])
        if not header_ok[first]:
            return starts[:first], starts[first], "corrupt record: the length field fails its CRC"
        length = int(ends[first] - begin[first]) - HEADER_BYTES - FOOTER_BYTES
        return starts[:first], starts[first], f"corrupt record: the data ({length} bytes) fails its CRC"
    if pos + HEADER_BYTES <= size and masked_crc(buf[pos : pos + 8]) != struct.unpack_from("<I", buf, pos + 8)[0]:
        return starts, pos, "corrupt record: the length field fails its CRC"
    return starts, pos, None


def _size_of(path):
    try:
        return storage.size(path)
    except Exception:  # unknown size: the end of the file decides instead
        return None


def resync(buf: bytes, start: int):
    """First position after ``start`` where a frame with a valid length CRC begins whose
    data is valid or runs past the end of ``buf`` (read more to decide), or None.
    Candidates are positions whose length's high 32 bits are zero (records under 4 GiB),
    found with numpy; their length CRCs are checked vectorized, data CRCs one by one."""
    size = len(buf)
    last = size - HEADER_BYTES
    if last <= start:
        return None
    raw = np.frombuffer(buf, dtype=np.uint8)
    window = raw[start + 1 : last + 8]
    zero_high = np.ones(last - start, dtype=bool)
    for byte in range(4, 8):
        zero_high &= window[byte : byte + last - start] == 0
    candidates = np.flatnonzero(zero_high) + start + 1
    for batch in range(0, len(candidates), 1 << 20):
        at = candidates[batch : batch + (1 << 20)]
        headers = raw[at[:, None] + np.arange(HEADER_BYTES)]
        header_ok = length_crcs_ok(headers)
        for pos in at[header_ok].tolist():
            end = pos + HEADER_BYTES + int.from_bytes(buf[pos : pos + 4], "little") + FOOTER_BYTES
            if end > size or masked_crc(buf[pos + HEADER_BYTES : end - FOOTER_BYTES]) == struct.unpack_from("<I", buf, end - FOOTER_BYTES)[0]:
                return pos
    return None


class TFRecordFormat(RecordFormat):
    name = "tfrecord"

    extension = ".tfrecord"

    def read_chunks(self, path, chunk_bytes=DEFAULT_CHUNK_BYTES, skip_corrupt=False, report=None):
        compressed = compression_of(path) != "uncompressed"
        file_size = None if compressed else _size_of(path)
        buf, base, eof = b"", 0, False
        with open_input(path) as handle:
            while not eof:
                block = read_block(handle, path, chunk_bytes, compressed)
                eof = not block
                buf = buf + block if buf else block
                buf, base = yield from self._drain(path, buf, base, eof, skip_corrupt, report, chunk_bytes, file_size)
                if buf and not eof:  # finish the frame cut by the block end, so the next block starts on a frame
                    buf = self._complete_frame(handle, path, buf, chunk_bytes, compressed)
                    buf, base = yield from self._drain(path, buf, base, False, skip_corrupt, report, chunk_bytes, file_size)
        if buf:
            self._truncated(path, buf, base, skip_corrupt, report)

    @staticmethod
    def _complete_frame(handle, path, buf, chunk_bytes, compressed):
        """``buf`` (the start of one frame) plus just the bytes that frame still needs.

        Reading them separately keeps every block aligned on a frame, so blocks are never
        copied onto a leftover. A length that fails its CRC or is implausibly large is
        left to ``_drain`` and the next block, as without this step."""
        if len(buf) < HEADER_BYTES:
            buf += read_block(handle, path, HEADER_BYTES - len(buf), compressed)
            if len(buf) < HEADER_BYTES:
                return buf
        length, length_crc = struct.unpack_from("<QI", buf, 0)
        need = HEADER_BYTES + length + FOOTER_BYTES - len(buf)
        if 0 < need <= 4 * chunk_bytes and masked_crc(buf[:8]) == length_crc:
            buf += read_block(handle, path, need, compressed)
        return buf

    @staticmethod
    def _drain(path, buf, base, eof, skip_corrupt, report, chunk_bytes, file_size=None):
        """Yield every complete frame of ``buf``; return the unread tail and its file offset.

        Under ``skip_corrupt`` a corrupt frame is skipped up to the next valid frame
        (searched over at most 4 chunks, or to the end of the file). A length field that
        reaches past the end of the file (when its size is known) is corrupt at once:
        the reader never buffers the rest of a file for a record that cannot be there."""
        while True:
            starts, end, problem = scan_frames(buf, base)
            if starts:
                yield binary_table(FRAME_COLUMN, buf, np.append(starts, end))
            if problem is None and file_size is not None and len(buf) - end >= HEADER_BYTES:
                need = HEADER_BYTES + struct.unpack_from("<Q", buf, end)[0] + FOOTER_BYTES
                if base + end + need > file_size:
                    problem = (f"truncated record: its header says {need} bytes but only "
                               f"{file_size - base - end} remain in the file")
            if problem is None:
                return buf[end:], base + end
            if not skip_corrupt:
                raise InputError(path, problem + (NOT_TFRECORD if base + end == 0 and "length" in problem else ""),
                                 base + end)
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
    """(payload CRC32Cs, payload lengths) of a ``tfrecord_frame`` column, read from the
    frames' stored CRCs chunk by chunk, without copying record data."""
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    crcs, lengths = [np.zeros(0, np.uint64)], [np.zeros(0, np.int64)]
    for chunk in chunks:
        if len(chunk) == 0:
            continue
        _, offsets_buffer, data_buffer = chunk.buffers()
        offsets = np.frombuffer(offsets_buffer, dtype=np.int32)[chunk.offset : chunk.offset + len(chunk) + 1].astype(np.int64)
        raw = np.frombuffer(data_buffer, dtype=np.uint8)
        crcs.append(unmask_crcs(stored_data_crcs(raw, offsets[1:])))
        lengths.append(np.diff(offsets) - HEADER_BYTES - FOOTER_BYTES)
    return np.concatenate(crcs), np.concatenate(lengths)

