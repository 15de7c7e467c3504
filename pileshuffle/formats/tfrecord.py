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
from pileshuffle.formats.base import (
    DEFAULT_CHUNK_BYTES,
    RECORD_COLUMN,
    Payloads,
    binary_table,
    open_at,
    open_input,
    read_block,
)
from pileshuffle.formats.tfrecord_buffers import frame_payload_views
from pileshuffle.formats.tfrecord_sync import header_at, resync, synced
from pileshuffle.io import storage
from pileshuffle.io.storage import compression_of
from pileshuffle.names import FRAME_COLUMN
from pileshuffle.records.crc import (
    FOOTER_BYTES,
    HEADER_BYTES,
    length_crcs_ok,
    mask_crcs,
    masked_crc,
    payloads_match_stored_crcs,
    stored_data_crcs,
    unmask_crcs,
)
from pileshuffle.records.fingerprint import binary_column_parts, payload_hashes

__all__ = ["TFRecordFormat", "frame", "scan_frames"]

_IN_SPANS = (
    " where a record of the file read from its middle ends: a record's payload holds TFRecord "
    "records, and such a file cannot be read in spans (give it compressed, .gz is read whole, "
    "or as smaller files)"
)
_NOT_TFRECORD = (
    " (the file's first bytes are no TFRecord header: is it another format? give its --format)"
)
_GZIP_MAGIC = b"\x1f\x8b"


def _not_tfrecord(first_bytes) -> str:
    """The hint for a file whose first frame's header fails: gzip's magic (a compressed TFRecord
    named without .gz, as tf.data's compression_type="GZIP" allows), else another format."""
    if bytes(first_bytes[:2]) == _GZIP_MAGIC:
        return (
            " (the file starts with gzip's magic bytes: it is compressed; name it .tfrecord.gz, "
            "which pileshuffle reads as gzip)"
        )
    return _NOT_TFRECORD


def frame(payload: bytes) -> bytes:
    """``payload`` as one TFRecord frame: length, its masked CRC32C, payload, its masked CRC32C."""
    header = struct.pack("<Q", len(payload))
    return b"".join(
        (
            header,
            struct.pack("<I", masked_crc(header)),
            payload,
            struct.pack("<I", masked_crc(payload)),
        )
    )


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
    headers = (
        raw[begin[:, None] + np.arange(HEADER_BYTES)]
        if len(starts)
        else np.zeros((0, HEADER_BYTES), np.uint8)
    )
    header_ok = length_crcs_ok(headers)
    stored = stored_data_crcs(raw, ends)
    if header_ok.all() and payloads_match_stored_crcs(raw, begin, ends, stored):
        bad = ()
    else:
        value = google_crc32c.value
        data_crcs = np.fromiter(
            (
                value(buf[a:b])
                for a, b in zip((begin + HEADER_BYTES).tolist(), (ends - FOOTER_BYTES).tolist())
            ),
            dtype=np.uint64,
            count=len(starts),
        )
        bad = np.flatnonzero(~(header_ok & (mask_crcs(data_crcs) == stored)))
    if len(bad):
        first = int(bad[0])
        if not header_ok[first]:
            return starts[:first], starts[first], "corrupt record: the length field fails its CRC"
        length = int(ends[first] - begin[first]) - HEADER_BYTES - FOOTER_BYTES
        return (
            starts[:first],
            starts[first],
            f"corrupt record: the data ({length} bytes) fails its CRC",
        )
    if (
        pos + HEADER_BYTES <= size
        and masked_crc(buf[pos : pos + 8]) != struct.unpack_from("<I", buf, pos + 8)[0]
    ):
        return starts, pos, "corrupt record: the length field fails its CRC"
    return starts, pos, None


def _size_of(path):
    try:
        return storage.size(path)
    except Exception:  # unknown size: the end of the file decides instead
        return None


# A span's first read, when the span is smaller than a chunk: enough to find its first frame
# (``synced`` reads on when a frame is longer), not a chunk's 16 MiB for a span of a few MB.
_SPAN_FIRST_READ_BYTES = 64 << 10


class TFRecordFormat(Payloads):
    """TFRecord: length, masked CRC32C of the length, data, masked CRC32C of the data; its
    records travel as whole frames, hashed from their stored CRCs (vectorized)."""

    name = "tfrecord"
    extension = ".tfrecord"
    record_column = FRAME_COLUMN
    # each frame's length and data under their CRCs: the loader's CRC32C would repeat them
    checks_every_byte = True
    before, after = HEADER_BYTES, FOOTER_BYTES

    def record_hashes(self, table):
        return payload_hashes(*_frame_payload_stats(table.column(0)))

    def payload_views(self, buffer, path, buffer_index):
        return frame_payload_views(buffer, path, buffer_index)

    def can_split(self, path, skip_corrupt=False):
        # a damaged file under --skip_corrupt is read whole: where a skip resumes is the walk's
        # from the start
        return compression_of(path) == "uncompressed" and not skip_corrupt

    def read_placed(
        self, path, chunk_bytes=DEFAULT_CHUNK_BYTES, skip_corrupt=False, report=None, span=None
    ):
        if span is not None:
            yield from self._read_span(path, chunk_bytes, span, report)
            return
        compressed = compression_of(path) != "uncompressed"
        file_size = None if compressed else _size_of(path)
        with open_input(path) as handle:
            yield from self._frames(
                handle, path, b"", 0, compressed, skip_corrupt, report, chunk_bytes, file_size
            )

    def _read_span(self, path, chunk_bytes, span, report):
        """The frames that start in ``span`` = ``(start, stop)`` (strict reading): from the file's
        start, or from the first frame at or after ``start`` whose length and data pass their CRCs,
        through the last that starts before ``stop``, read whole. ``report.reached`` = ``(where
        the first starts, where the walk goes on)``, or ``(None, None)``:
        ``sources.stats_by_file`` checks that a file's spans chain, so a payload that reads as a
        frame across a boundary fails the run, never silently."""
        start, stop = span
        file_size = _size_of(path)
        report.reached = (None, None)
        with open_at(path, start) as handle:
            # the first: walked
            block = min(chunk_bytes, max(_SPAN_FIRST_READ_BYTES, stop - start))
            buf, first = (b"", 0) if not start else synced(handle, path, start, block, file_size)
            if buf is None or first >= stop:
                return
            try:
                for table, places in self._frames(
                    handle, path, buf, first, False, False, report, chunk_bytes, file_size, stop
                ):
                    owned = int(np.searchsorted(places, stop))
                    if owned:
                        yield table.slice(0, owned), places[:owned]
                    # the walk goes on past the span (that frame checked whole)
                    if owned < len(places):
                        report.reached = (first, int(places[owned]))
                        return
            except InputError as error:
                # damage, or a walk begun inside a payload that holds frames
                if error.offset is None or not header_at(path, error.offset + FOOTER_BYTES):
                    raise
                raise InputError(path, error.problem + _IN_SPANS, error.offset) from None
            report.reached = (first, file_size)

    def _frames(
        self,
        handle,
        path,
        buf,
        base,
        compressed,
        skip_corrupt,
        report,
        chunk_bytes,
        file_size,
        stop=None,
    ):
        """``(table, places)`` of every frame from file offset ``base`` (``buf``: bytes read there)
        to the end. With ``stop`` (a span's end), blocks end there, and past it the walk reads one
        frame at a time: a span smaller than a chunk is read once, not a chunk's worth."""
        eof = False
        while not eof:
            size = chunk_bytes if stop is None else min(chunk_bytes, stop - base - len(buf))
            block = read_block(handle, path, max(HEADER_BYTES, size), compressed)
            eof = not block
            buf = buf + block if buf else block
            buf, base = yield from self._drain(
                path, buf, base, eof, skip_corrupt, report, chunk_bytes, file_size
            )
            # finish the frame cut by the block end, so the next block starts on a frame
            if buf and not eof:
                buf = self._complete_frame(handle, path, buf, chunk_bytes, compressed)
                buf, base = yield from self._drain(
                    path, buf, base, False, skip_corrupt, report, chunk_bytes, file_size
                )
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
        """Yield every complete frame of ``buf`` (``(table, positions)``); return the unread tail
        and its file offset.

        Under ``skip_corrupt`` a corrupt frame is skipped up to the next valid frame
        (searched over at most 4 chunks, or to the end of the file). A length field that
        reaches past the end of the file (when its size is known) is corrupt at once:
        the reader never buffers the rest of a file for a record that cannot be there."""
        while True:
            starts, end, problem = scan_frames(buf, base)
            if starts:
                yield (
                    binary_table(FRAME_COLUMN, buf, np.append(starts, end)),
                    base + np.asarray(starts, np.int64),
                )
            if problem is None and file_size is not None and len(buf) - end >= HEADER_BYTES:
                need = HEADER_BYTES + struct.unpack_from("<Q", buf, end)[0] + FOOTER_BYTES
                if base + end + need > file_size:
                    problem = (
                        f"truncated record: its header says {need} bytes but only "
                        f"{file_size - base - end} remain in the file"
                    )
            if problem is None:
                return buf[end:], base + end
            if not skip_corrupt:
                raise InputError(
                    path,
                    problem
                    + (_not_tfrecord(buf) if base + end == 0 and "length" in problem else ""),
                    base + end,
                )
            good = resync(buf, end)
            if good is None and not eof and len(buf) - end < 4 * chunk_bytes:
                return buf[end:], base + end  # read more before deciding where to resume
            resume = len(buf) if good is None else good
            report.skip(path, base + end, problem, 1, resume - end)
            buf, base = buf[resume:], base + resume

    @staticmethod
    def _truncated(path, buf, base, skip_corrupt, report):
        if len(buf) < HEADER_BYTES:
            problem = (
                f"truncated record: {len(buf)} bytes at the end of the file, too short for a header"
            )
        else:
            (length,) = struct.unpack_from("<Q", buf, 0)
            need = HEADER_BYTES + length + FOOTER_BYTES
            problem = (
                f"truncated record: its header says {need} bytes but only {len(buf)} remain in "
                "the file"
            )
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


def _frame_payload_stats(column) -> tuple:
    """(payload CRC32Cs, payload lengths) of a ``tfrecord_frame`` column, read from the
    frames' stored CRCs chunk by chunk, without copying record data."""
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    crcs, lengths = [np.zeros(0, np.uint64)], [np.zeros(0, np.int64)]
    for chunk in chunks:
        if len(chunk) == 0:
            continue
        _, offsets_buffer, data_buffer = chunk.buffers()
        offsets = np.frombuffer(offsets_buffer, dtype=np.int32)[
            chunk.offset : chunk.offset + len(chunk) + 1
        ].astype(np.int64)
        raw = np.frombuffer(data_buffer, dtype=np.uint8)
        crcs.append(unmask_crcs(stored_data_crcs(raw, offsets[1:])))
        lengths.append(np.diff(offsets) - HEADER_BYTES - FOOTER_BYTES)
    return np.concatenate(crcs), np.concatenate(lengths)
