"""WebDataset tar shards: a record is a *sample*, the consecutive members sharing a key.

A sample's key is WebDataset's: a member's name up to the first dot of its base name
(``train/000123.jpg`` -> key ``train/000123``, extension ``jpg``). A record travels as the
sample's raw tar bytes (column ``tar_sample``): each member's header blocks (PAX and GNU
long-name headers included), data and padding, in the input's order. A shard is those
samples copied back to back, then tar's end-of-archive marker (two zero blocks): no header
is rewritten, so the same input and seed give the same bytes, every member of a sample
moves with it, and nothing of the input is dropped but its end marker. Entries that are not
files but carry no data (directories, global PAX headers) travel with the sample after
them (the last sample: before them); links and devices are refused.

A large file is read in spans (``TarFormat._read_span``): a span boundary moves to a sample
start both sides find alike, found from the first block at or after it that passes a tar
header's checksum; the walk of the span before checks that it is one.
"""

import re

import numpy as np

from pileshuffle.errors import InputError
from pileshuffle.formats.base import (
    DEFAULT_CHUNK_BYTES,
    Payloads,
    binary_table,
    open_at,
    open_input,
    read_block,
)
from pileshuffle.formats.tar_members import BLOCK, FILES, Walk, header_name, is_header, number
from pileshuffle.formats.views import payload_views, raw_bytes
from pileshuffle.io import storage
from pileshuffle.io.storage import compression_of
from pileshuffle.names import TAR_SAMPLE_COLUMN
from pileshuffle.records.fingerprint import binary_column_parts

__all__ = ["TarFormat", "KEY_FIELD", "END_OF_ARCHIVE", "key_of", "sample_dict", "sample_keys"]

# tar's end-of-archive marker: two zero blocks (a shard ends with it)
END_OF_ARCHIVE = bytes(2 * BLOCK)
KEY_FIELD = "__key__"  # WebDataset's name for a sample's key in its dict
# WebDataset's base_plus_ext; refuses an empty key
_KEY = re.compile(r"^((?:.*/|)[^./]+)\.([^/]*)$")


def key_of(name: str):
    """``(key, extension)`` of a member name by WebDataset's rule, or None."""
    match = _KEY.match(name)
    return (match.group(1), match.group(2)) if match else None


def _sample_bounds(walk: Walk, keys_seen: set, complete: bool):
    """``(bounds, kept)``: sample boundaries (offsets into the walked bytes: first sample's
    start, then each next one's, then the last one's end) and the index of the first member
    not in them. The last sample is held back unless ``complete`` (a later read may extend
    it). A member without a key, or a key met again after other keys, is an InputError."""
    members = walk.members
    firsts, last_key = [], None
    for index, (begin, _, _, _, name) in enumerate(members):
        found = key_of(name)
        if found is None:
            raise InputError(
                walk.path,
                f"member {name!r} has no key: WebDataset names members KEY.EXTENSION",
                walk.base + begin,
            )
        if found[0] != last_key:
            if found[0] in keys_seen:
                raise InputError(
                    walk.path,
                    f"key {found[0]!r} appears twice (member {name!r}): a sample's members "
                    "are consecutive",
                    walk.base + begin,
                )
            keys_seen.add(found[0])
            firsts.append(index)
            last_key = found[0]
    kept = len(members)
    if firsts and not complete:
        kept = firsts.pop()
        keys_seen.discard(last_key)
    if not firsts:
        return [], kept
    end = walk.tail if kept == len(members) else members[kept][0]
    return [members[i][0] for i in firsts] + [end], kept


def _boundary(walk: Walk, stop: int) -> tuple:
    """``(first, moved)``: indexes into ``walk.members`` of the first member whose own header is
    at or after file offset ``stop`` (its name may come from entries before it), and of the
    member a span boundary at ``stop`` moves to: from the second member after ``first`` on, the
    first whose key differs from the member's before it. Each None when not in these members."""
    own_headers = [walk.base + data - BLOCK for _, data, _, _, _ in walk.members]
    first = next((i for i, at in enumerate(own_headers) if at >= stop), None)
    if first is None:
        return None, None
    keys = [_key(name) for _, _, _, _, name in walk.members]
    return first, next((i for i in range(first + 2, len(keys)) if keys[i] != keys[i - 1]), None)


def _key(name: str) -> str:
    return (key_of(name) or (name,))[0]


def _moved(path: str, offset: int, chunk_bytes: int):
    """Where a span boundary at file ``offset`` moves to (``_past_boundary``): a sample's start,
    or None."""
    aligned = -(-offset // BLOCK) * BLOCK
    with open_at(path, aligned) as handle:
        return _past_boundary(handle, path, aligned, chunk_bytes)[1]


def _cut_at(walk: Walk, limit: int, at_end: bool) -> bool:
    """Keep the members of ``walk`` before relative offset ``limit``, which must be where one
    begins (or the archive's end); whether the walk reached it."""
    begins = [begin for begin, _, _, _, _ in walk.members]
    if limit in begins:
        index = begins.index(limit)
        walk.members, walk.tail, walk.problem = walk.members[:index], limit, None
        return True
    if (
        any(b > limit for b in begins)
        or (walk.ended and walk.tail < limit)
        or (at_end and walk.problem is None)
    ):
        raise InputError(
            walk.path,
            "a tar member's data holds what reads as tar headers here: such a file cannot "
            "be read in spans (give it compressed, .gz is read whole, or as smaller files)",
            walk.base + limit,
        )
    return False


def _past_boundary(handle, path: str, base: int, chunk_bytes: int) -> tuple:
    """``(bytes from the first sample of a span, its file offset)``: from the first block at or
    after ``base`` (aligned) that passes a tar header's checksum, past the boundary
    (``_boundary``); ``(None, None)`` when the archive ends first."""
    buf = b""
    while True:  # the first header
        block = read_block(handle, path, chunk_bytes, False)
        if not block:
            return None, None
        buf += block
        whole = len(buf) // BLOCK * BLOCK
        at = next((p for p in range(0, whole, BLOCK) if is_header(bytes(buf[p : p + BLOCK]))), None)
        if at is not None:
            buf, base = buf[at:], base + at
            break
        buf, base = buf[whole:], base + whole
    while True:  # then the boundary
        walk = Walk(buf, path, base)
        _, boundary = _boundary(walk, base)
        if boundary is not None:
            cut = walk.members[boundary][0]
            return buf[cut:], base + cut
        if walk.problem is not None:
            raise walk.problem
        if walk.ended:
            return None, None
        block = read_block(handle, path, chunk_bytes, False)
        if not block:
            return None, None
        buf += block


def sample_dict(payload) -> dict:
    """A sample's raw tar bytes (as a shard holds them: checked when it was read) as
    WebDataset's dict: ``{"__key__": key, extension: data, ...}``. Plain ustar members are
    read straight from their header fields; a sample with any other entry is walked."""
    payload = bytes(payload)
    sample, pos, end = {}, 0, len(payload)
    while pos < end:
        # extended, carried, prefixed
        if payload[pos + 156 : pos + 157] not in FILES or payload[pos + 345] != 0:
            return _walked_sample(payload)
        size = number(payload[pos + 124 : pos + 136])
        name = payload[pos : pos + 100].split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
        cut = name.rfind("/") + 1
        dot = name.find(".", cut)
        if dot <= cut:
            return _walked_sample(payload)
        sample[KEY_FIELD] = name[:dot]
        sample[name[dot + 1 :]] = payload[pos + BLOCK : pos + BLOCK + size]
        pos += BLOCK + -(-size // BLOCK) * BLOCK
    return sample


def _walked_sample(payload: bytes) -> dict:
    sample = {}
    for _, data, size, _, name in Walk(payload, "a tar sample").members:
        key, extension = key_of(name)
        sample[KEY_FIELD] = key
        sample[extension] = payload[data : data + size]
    return sample


def sample_keys(data, offsets: np.ndarray) -> list:
    """The key of each sample ``data[offsets[i]:offsets[i+1]]`` (raw tar bytes): from its first
    header's name fields when that header is a file's, else by walking the sample."""
    keys = []
    for start, end in zip(np.asarray(offsets[:-1]).tolist(), np.asarray(offsets[1:]).tolist()):
        head = bytes(data[start : start + BLOCK])
        name = (
            header_name(head)
            if head[156:157] in FILES
            else Walk(data[start:end], "a tar sample").members[0][4]
        )
        keys.append(key_of(name)[0])
    return keys


def _check_unique(keys: list, seen: set):
    """Add ``keys`` to ``seen``; a key already there is an InputError naming it."""
    for key in keys:
        if key in seen:
            raise InputError(
                "the input",
                f"WebDataset key {key!r} names two samples that were shuffled into one "
                "shard, where they would read back as one: give every sample of the "
                "data set its own key (two input files, or two appends to a store, "
                "used the same keys)",
            )
        seen.add(key)


class TarFormat(Payloads):
    """WebDataset tar shards: a record is one sample, held as its raw tar bytes."""

    name = "tar"
    extension = ".tar"
    record_column = TAR_SAMPLE_COLUMN

    def can_split(self, path, skip_corrupt=False):
        # under --skip_corrupt a damage ends the file's read: where is known only walking from
        # the start
        return compression_of(path) == "uncompressed" and not skip_corrupt

    def read_placed(
        self, path, chunk_bytes=DEFAULT_CHUNK_BYTES, skip_corrupt=False, report=None, span=None
    ):
        """Samples in file order, each at the offset of its first entry. With ``skip_corrupt`` a
        damaged header or a truncated end stops the file's read there: the samples before it are
        kept, the rest is reported skipped (a tar has no marks to find the next header by). With
        ``span`` (strict reading): the samples ``_read_span`` gives it."""
        if span is not None:
            yield from self._read_span(path, chunk_bytes, span, report)
            return
        try:
            with open_input(path) as handle:
                yield from self._samples(
                    handle, path, b"", 0, chunk_bytes, compression_of(path) != "uncompressed"
                )
        except InputError as error:
            if not skip_corrupt or report is None or error.offset is None or error.path != path:
                raise
            report.skip(
                path, error.offset, error.problem, 0, max(0, self._size(path) - error.offset)
            )

    def _read_span(self, path, chunk_bytes, span, report):
        """The samples of ``span`` = ``(start, stop)``: from the one its start moves to
        (``_moved``) up to the one its stop moves to (the walk checks it is a sample start: a
        member's data may hold what reads as tar headers). ``report.reached``: ``(first, the next
        span's first or the file's size)`` for ``sources.check_spans_chain``; ``(None, None)``:
        none here."""
        start, stop = span
        report.reached = (None, None)
        size = self._size(path)
        first = 0 if not start else _moved(path, start, chunk_bytes)
        limit = None if stop >= size else _moved(path, stop, chunk_bytes)
        if first is None or (limit is not None and first >= limit):
            return
        with open_at(path, first) as handle:
            yield from self._samples(handle, path, b"", first, chunk_bytes, False, limit)
        report.reached = (first, size if limit is None else limit)

    def _samples(self, handle, path, buf, base, chunk_bytes, compressed, limit=None):
        """``(table, places)`` of the samples from file offset ``base`` (``buf``: bytes read
        there) to the archive's end, or to the one that starts at offset ``limit`` (``_cut_at``)."""
        keys_seen = set()
        while True:
            block = read_block(handle, path, chunk_bytes, compressed)
            buf = buf + block if buf else block
            walk = Walk(buf, path, base)
            at_end = walk.ended or not block or walk.problem is not None
            if not block and not walk.ended and walk.problem is None and walk.stop < len(buf):
                raise InputError(
                    path,
                    f"is truncated: the entry at this offset runs past the end of the file "
                    f"({len(buf) - walk.stop:,} bytes left)",
                    base + walk.stop,
                )
            if limit is not None:
                at_end = _cut_at(walk, limit - base, at_end) or at_end
            bounds, kept = _sample_bounds(walk, keys_seen, complete=at_end)
            if bounds:
                bounds = np.asarray(bounds, dtype=np.int64)
                yield binary_table(TAR_SAMPLE_COLUMN, buf, bounds), base + bounds[:-1]
            if walk.problem is not None:
                raise walk.problem
            if at_end:
                return
            cut = walk.members[kept][0] if kept < len(walk.members) else walk.stop
            base, buf = base + cut, buf[cut:]

    @staticmethod
    def _size(path) -> int:
        try:
            return storage.size(path)
        except Exception:  # a compressed or vanished file: the skipped bytes are not known
            return 0

    def write_shard(self, handle, tables, compression, schema=None):
        """Samples back to back, then the end-of-archive marker. Two samples with one key
        would read back as one (WebDataset groups members by key): refused, naming the key."""
        written, keys = 0, set()
        for table in tables:
            data, offsets = binary_column_parts(table.column(0))
            _check_unique(sample_keys(memoryview(data), offsets), keys)
            handle.write(memoryview(data))
            written += table.num_rows
        handle.write(END_OF_ARCHIVE)
        return written

    def payload_views(self, buffer, path, buffer_index):
        raw = raw_bytes(buffer, path)
        walk = Walk(memoryview(buffer), path)
        if walk.problem is not None:
            raise walk.problem
        if not walk.ended and walk.stop < len(raw):
            raise InputError(
                path,
                "is truncated: the entry at this offset runs past the end of the file",
                walk.stop,
            )
        bounds, _ = _sample_bounds(walk, set(), complete=True)
        bounds = np.asarray(bounds or [0], dtype=np.int64)
        return payload_views(raw, bounds[:-1], np.diff(bounds), buffer_index)

    def records_of(self, payloads: list) -> list:
        return [sample_dict(payload) for payload in payloads]
