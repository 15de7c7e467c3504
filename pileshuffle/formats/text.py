"""JSONL and other newline-delimited text: one record per line, bytes kept as they are.

Reading keeps each line with its newline (column ``line``) so that a shard is written
by copying bytes. Lines are found with numpy, never parsed as JSON, but for one: a file's
last line without a newline is a record (and gets one) only when it is blank or a whole JSON
value (many writers omit the final newline); any other was cut short (a truncated file):
an ``InputError`` naming its byte offset, or under ``skip_corrupt`` a skipped record
(``_last_line_kept``). Every line must be UTF-8 text without NUL
bytes (checked per chunk in C: memchr and Arrow's UTF-8 validation, about 0.1 ms per MB),
so a binary file given as JSONL (a TFRecord, say) is refused, naming its first bad line.

What JSON readers skip is no record (``json_records``): a UTF-8 byte order mark at a file's
start is not part of its first line, and a blank line (spaces, tabs and CRs only) is none,
counted in ``ReadReport.blank_lines``. A line ending in CRLF keeps its ``\r``: JSON takes it
as whitespace, and the fingerprints prove the bytes as they are.
"""

import json

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
    read_up_to,
)
from pileshuffle.formats.views import payload_views, raw_bytes
from pileshuffle.io.storage import compression_of, is_remote
from pileshuffle.names import LINE_COLUMN
from pileshuffle.records.fingerprint import binary_column_parts

__all__ = [
    "JsonlFormat",
    "line_blocks",
    "line_views",
    "known_line_chunks",
    "check_text",
    "json_records",
]

_NEWLINE = 10
_BOM = b"\xef\xbb\xbf"  # UTF-8's byte order mark
_BLANK = b" \t\r\n"  # what a blank line holds
_BLANK_STARTS = np.frombuffer(_BLANK, dtype=np.uint8)


def _line_bounds(buf: bytes) -> np.ndarray:
    """Offsets of the complete lines in ``buf``: 0, then one past each newline."""
    newlines = np.flatnonzero(np.frombuffer(buf, dtype=np.uint8) == _NEWLINE)
    return np.concatenate(([0], newlines + 1))


def json_records(data, bounds: np.ndarray, base: int) -> tuple:
    """``(records, positions, blank)`` of the whole lines ``data[bounds[i]:bounds[i+1]]``,
    ``data[0]`` being at ``base`` in the file: a one-column ``line`` table of the lines that are
    JSONL records, a UTF-8 byte order mark at the file's start left out of the first, their places
    in the file, and how many blank lines were left out. Lines with no blank one among them stay
    views of ``data``."""
    offsets = np.asarray(bounds, dtype=np.int64)
    if base == 0 and len(offsets) > 1 and bytes(data[:3]) == _BOM:
        offsets = offsets.copy()
        offsets[0] = len(_BOM)
    records, positions = binary_table(LINE_COLUMN, data, offsets), base + offsets[:-1]
    blank = _blank_lines(data, offsets)
    if len(blank):
        keep = np.ones(len(positions), dtype=bool)
        keep[blank] = False
        records, positions = records.filter(pa.array(keep)), positions[keep]
    return records, positions, len(blank)


def _blank_lines(data, offsets: np.ndarray) -> np.ndarray:
    """The numbers of the lines that hold only spaces, tabs and CRs before their newline: looked
    at whole only where a line starts with one of those (a record never does, so this is one
    look-up per line)."""
    if len(offsets) < 2:
        return np.zeros(0, dtype=np.int64)
    first = np.frombuffer(data, dtype=np.uint8)[offsets[:-1]]
    maybe = np.flatnonzero(np.isin(first, _BLANK_STARTS))
    return np.array(
        [i for i in maybe.tolist() if not bytes(data[offsets[i] : offsets[i + 1]]).strip(_BLANK)],
        dtype=np.int64,
    )


def _first_non_text(buf: bytes, end: int):
    """``(position, what)`` of the first byte of ``buf[:end]`` that text cannot hold (a NUL,
    or the start of invalid UTF-8), or None. ``end`` is a line boundary, so no UTF-8
    sequence is cut."""
    nul = buf.find(b"\0", 0, end)
    found = [] if nul < 0 else [(nul, "a NUL byte")]
    text = pa.Array.from_buffers(
        pa.utf8(), 1, [None, pa.py_buffer(np.array([0, end], np.int32)), pa.py_buffer(buf)]
    )
    try:
        text.validate(full=True)
    except pa.ArrowInvalid:  # rare: find where, by decoding (error path only)
        try:
            bytes(buf[:end]).decode("utf-8")
        except UnicodeDecodeError as error:
            found.append((error.start, "invalid UTF-8"))
    return min(found) if found else None


def check_text(path: str, buf: bytes, bounds: np.ndarray, lines_before, base: int = 0):
    """Refuse the complete lines ``buf[:bounds[-1]]`` unless they are text, naming the
    first bad line: counted from the start of the file, or (``lines_before`` None: a span's
    reader does not know it) by its byte offset, ``base`` being ``buf[0]``'s."""
    bad = _first_non_text(buf, int(bounds[-1]))
    if bad is None:
        return
    position, what = bad
    line = int(np.searchsorted(bounds, position, side="right")) - 1
    column = position - int(bounds[line])
    where = (
        f"the line at byte {base + int(bounds[line]):,}"
        if lines_before is None
        else f"line {lines_before + line + 1:,}"
    )
    raise InputError(
        path,
        f"{where} is not text ({what} at byte {column} of the line): JSONL "
        "is UTF-8 text; a binary file (TFRecord, Parquet) needs its own --format",
    )


def _cut_short(line, at_file_start: bool):
    """Why ``line``, a file's last line without its newline, is no whole record (None: it is
    blank, or a whole JSON value). ``json.loads`` of that one line: one per file. A cut that
    leaves a whole value (a bare number cut between digits) cannot be told from none."""
    text = bytes(line).decode("utf-8", "replace")  # bad UTF-8 is check_text's to name
    if at_file_start:
        text = text.removeprefix("\ufeff")
    if not text.strip(" \t\r"):
        return None
    try:
        _LENIENT_JSON.decode(text)
    except json.JSONDecodeError as error:
        return (
            f"truncated record: the file ends inside a line ({len(line):,} bytes without "
            f"a newline) that is not a whole JSON value ({error.msg}: character "
            f"{error.pos + 1:,})"
        )
    return None


_LENIENT_JSON = json.JSONDecoder(strict=False)  # control characters in strings pass


def _last_line_kept(path: str, line, base: int, skip_corrupt=False, report=None) -> bool:
    """Whether a file's last line without a newline (``line``, at byte ``base``) is read as a
    line: when it is whole (``_cut_short``). Else it is an ``InputError`` naming its offset, or
    under ``skip_corrupt`` one skipped record counted in ``report``."""
    problem = _cut_short(line, base == 0)
    if problem is None:
        return True
    if not skip_corrupt:
        raise InputError(path, problem, base)
    if report is not None:
        report.skip(path, base, problem, 1, len(line))
    return False


def line_blocks(path: str, chunk_bytes: int, span=None, skip_corrupt=False, report=None):
    """``(buf, end, base)`` for each block of about ``chunk_bytes`` of a text file's whole lines,
    in order: ``buf[:end]`` are complete lines (no line spans two blocks; a last line without a
    newline comes as one with it when ``_last_line_kept``), ``buf[end:]`` holds no newline,
    ``base`` is ``buf[0]``'s offset in the file. With ``span`` = ``(start, stop)`` (an
    uncompressed file) only the lines
    that start in ``[start, stop)``: a line belongs to the span where it starts, so spans that
    cover a file give each line once, whatever their bounds. A local uncompressed file's next
    block is read from the start of the line a block cut, not joined to the cut part (that
    copied every block: 2.6% of a JSONL run's user CPU)."""
    compressed, carry = compression_of(path) != "uncompressed", b""
    start, stop = span or (0, None)
    # from the byte before the span: a newline there starts a line at ``start``
    base, skipping = max(0, start - 1), start > 0
    # (seeking back costs an object store a request)
    rereads = not compressed and not is_remote(path)
    with open_at(path, base) if skipping or rereads else open_input(path) as handle:
        while stop is None or base < stop:
            block = read_block(handle, path, chunk_bytes, compressed)
            if not block:
                break
            buf = carry + block if carry else block
            if skipping:  # the line under way at ``start`` is the span before's
                buf, base, skipping = _past_first_newline(buf, base)
                carry = b""
                if skipping or not buf or (stop is not None and base >= stop):
                    # (the loop ends when the first line of ours would start at or past ``stop``)
                    continue
            end = buf.rfind(b"\n") + 1
            # the last line to read starts before ``stop``
            if stop is not None and base + end >= stop:
                yield buf, buf.find(b"\n", stop - 1 - base) + 1, base
                return
            if end:
                yield buf, end, base
            carry, base = buf[end:], base + end
            if end and carry and rereads:  # the cut line comes again at the next block's start
                handle.seek(base)
                carry = b""
    if (
        carry
        and not skipping
        and (stop is None or base < stop)
        and _last_line_kept(path, carry, base, skip_corrupt, report)
    ):
        yield carry + b"\n", len(carry) + 1, base


def _past_first_newline(buf: bytes, base: int) -> tuple:
    """``(rest, base, skipping)``: what follows ``buf``'s first newline and its offset (``buf[0]``
    being at ``base``), skipping done; or with no newline in ``buf``, nothing, still skipping."""
    newline = buf.find(b"\n")
    if newline < 0:
        return b"", base + len(buf), True
    return buf[newline + 1 :], base + newline + 1, False


def line_views(path: str, chunk_bytes: int, skip_corrupt=False, report=None):
    """``(lines, raw)`` for each block of about ``chunk_bytes`` of a text file's whole lines, in
    order, as ``line_blocks`` cuts them: ``lines`` a binary array of the lines with their
    newlines, ``raw`` their bytes. Both lie in ONE buffer that the next block overwrites (no
    allocation, no copy of a block's tail): keep nothing of them, only what is made from them.
    Lines are not checked to be text (``check_text``). A last line without a newline is read as
    ``line_blocks`` reads it. A compressed file goes through ``line_blocks``, which allocates
    each block."""
    if compression_of(path) != "uncompressed":
        for buf, end, _ in line_blocks(path, chunk_bytes, None, skip_corrupt, report):
            yield _lines_of(memoryview(buf)[:end])
        return
    with open_input(path) as handle:
        buf, held, base = bytearray(2 * chunk_bytes), 0, 0  # ``base``: buf[0]'s offset in the file
        while True:
            if len(buf) - held < chunk_bytes:  # a line longer than a block: a larger buffer
                buf = buf[:held] + bytearray(held + 2 * chunk_bytes)
            view = memoryview(buf)
            try:
                read = handle.readinto(view[held : held + chunk_bytes])
            except OSError as error:
                raise InputError(path, f"cannot be read: {error}") from error
            filled = held + (read or 0)
            if not read:
                if held and _last_line_kept(path, view[:held], base, skip_corrupt, report):
                    buf[held : held + 1] = b"\n"  # a last line without a newline gets one
                    yield _lines_of(view[: held + 1])
                return
            end = buf.rfind(b"\n", 0, filled) + 1
            if end:
                yield _lines_of(view[:end])
                buf[: filled - end] = buf[end:filled]
            held, base = filled - end, base + end


def known_line_chunks(path: str, next_lengths, chunk_bytes: int, skip_corrupt=False, report=None):
    """``JsonlFormat.read_placed``' ``(table, positions)`` of a file whose lines were found before
    (``--balance``'s counting pass keeps their lengths): ``next_lengths(max_bytes)`` gives the
    lengths, newline included, of the next lines that fit in ``max_bytes`` (at least one; none at
    the end). Each block is read at its size and not searched for newlines again (38 ms per 125 MB
    of 16 MiB blocks), only checked to be text with each line ending in a newline where it ended
    before and nothing after the last but the cut last line the counting pass skipped
    (``_last_line_kept``, counted in ``report`` here): a file that changed since is an
    ``InputError``. (A change that keeps every line's length is not seen, as pass 1 does not see it
    in the labels either.)"""
    compressed, lines, base = compression_of(path) != "uncompressed", 0, 0
    with open_input(path) as handle:
        while True:
            lengths = next_lengths(chunk_bytes)
            if not len(lengths):
                break
            bounds = np.concatenate(([0], np.cumsum(lengths, dtype=np.int64)))
            buf = read_up_to(handle, path, int(bounds[-1]), compressed)
            # a last line without its newline:
            if len(buf) == bounds[-1] - 1 and buf and buf[-1:] != b"\n":
                buf += b"\n"  # it gets one, as line_blocks gives it
            if (
                len(buf) != bounds[-1]
                or (np.frombuffer(buf, np.uint8)[bounds[1:] - 1] != _NEWLINE).any()
            ):
                raise InputError(path, _CHANGED)
            check_text(path, buf, bounds, lines, base)
            records, positions, blank = json_records(buf, bounds, base)
            _count_blank(report, blank)
            yield records, positions
            lines, base = lines + len(lengths), base + int(bounds[-1])
        tail = _up_to_a_newline(handle, path, chunk_bytes, compressed)
        if tail and (b"\n" in tail or _last_line_kept(path, tail, base, skip_corrupt, report)):
            raise InputError(path, _CHANGED)


def _up_to_a_newline(handle, path: str, chunk_bytes: int, compressed: bool) -> bytes:
    """The rest of an open file, or of it as much as holds its next newline."""
    rest = bytearray()
    while b"\n" not in rest:
        block = read_block(handle, path, chunk_bytes, compressed)
        if not block:
            break
        rest += block
    return bytes(rest)


def _count_blank(report, blank: int):
    if report is not None:
        report.blank_lines += blank


_CHANGED = "changed during the run: its lines are not where the first pass found them"


def _lines_of(data: memoryview) -> tuple:
    """``(lines, raw)`` of whole lines ``data``: a binary array over it (no copy) and its bytes."""
    return binary_table(LINE_COLUMN, data, _line_bounds(data)).column(0).chunk(0), np.frombuffer(
        data, np.uint8
    )


class JsonlFormat(Payloads):
    """JSON Lines: a record is a line; it travels with its newline (a last line without one
    gets one when written)."""

    name = "jsonl"
    extension = ".jsonl"
    record_column = LINE_COLUMN
    before, after = 0, 1  # the newline

    def payload_views(self, buffer, path, buffer_index):
        return _line_views(buffer, path, buffer_index)

    def can_split(self, path, skip_corrupt=False):
        return compression_of(path) == "uncompressed"  # a compressed stream is read from its start

    def read_placed(
        self, path, chunk_bytes=DEFAULT_CHUNK_BYTES, skip_corrupt=False, report=None, span=None
    ):
        """Lines with their byte offsets (``line_blocks``; a span's reader names a bad line by its
        offset); a cut last line is skipped and counted in ``report`` under ``skip_corrupt``."""
        lines = 0 if not span or not span[0] else None
        for buf, end, base in line_blocks(path, chunk_bytes, span, skip_corrupt, report):
            lines_only = memoryview(buf)[:end]
            bounds = _line_bounds(lines_only)
            check_text(path, buf, bounds, lines, base)
            records, positions, blank = json_records(lines_only, bounds, base)
            _count_blank(report, blank)
            yield records, positions
            lines = None if lines is None else lines + len(bounds) - 1

    def write_shard(self, handle, tables, compression, schema=None):
        written = 0
        for table in tables:
            if LINE_COLUMN in table.column_names:
                column = table.column(LINE_COLUMN)
            else:
                # bare payloads (a composed run's): rare, so the loader's start-up never imports
                # compute
                import pyarrow.compute as pc

                empty, newline = pa.scalar(b"", pa.binary()), pa.scalar(b"\n", pa.binary())
                column = pc.binary_join_element_wise(table.column(RECORD_COLUMN), empty, newline)
            data, _ = binary_column_parts(column)
            handle.write(memoryview(data))
            written += table.num_rows
        return written


def _line_views(buffer: pa.Buffer, path: str, buffer_index: int) -> np.ndarray:
    """Views of the lines of a buffer of text, without their newline (a last line
    without one is a record too)."""
    raw = raw_bytes(buffer, path)
    ends = np.flatnonzero(raw == _NEWLINE)
    starts = (
        np.concatenate(([0], ends[:-1] + 1)).astype(np.int64)
        if len(ends)
        else np.zeros(0, np.int64)
    )
    if len(raw) and (not len(ends) or ends[-1] != len(raw) - 1):
        starts = np.append(starts, ends[-1] + 1 if len(ends) else 0)
        ends = np.append(ends, len(raw))
    return payload_views(raw, starts, ends - starts, buffer_index)
