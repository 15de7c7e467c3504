"""Pass-1 runs: a writer's pile parts gathered up to a run size, written in pile order.

A pass-1 writer (one group of input files in the template, one bundle of ``ShuffleToPiles``)
keys each chunk it reads and sorts the chunk by pile (one ``take``). It holds the sorted chunks
until they reach ``budget`` bytes (``--run_bytes``, or its input ends), then *flushes* them as one
**run**: for every pile the chunks reach, one **segment** holding that pile's records from all of
them. So a pile's part grows with the run, not with the input chunk: at M piles a run of B bytes
gives parts of about B / M bytes, however the input is cut into files and chunks.

A run larger than memory may hold (``MAX_HELD_BYTES``, 1 GiB) waits on the local disk: each time
the writer holds that much it writes it as one **spill** (``_Spills``: an Arrow IPC stream of the
held records in pile order), and the flush reads its spills back memory-mapped and merges them as
it would merge held chunks. The run is the one a flush of all its chunks from memory would write:
the same records in the same order (Spark's sort-based shuffle spills and merges the same way).

With ``group`` G > 1 (the template's small piles, ``pile_groups``) a segment holds the parts of
G neighbouring piles, ``g*G .. g*G+G-1``, one after another in pile order, and is one element
``(g, GroupSegment)`` that says which rows are whose: a run gives one segment per group it
reaches instead of one per pile (1 GB in 4,096 piles: 62 elements a run, not 4,096).

A segment is one Arrow IPC stream (schema, one record batch, end marker) of the pile's (or
group's) records in the writer's order, with two more columns: ``KEY_COLUMN`` (U, uint64) and ``HASH_COLUMN``
(the pass-1 fingerprint hash, uint64). It is self-contained: ``pa.ipc.open_stream`` reads it
alone. Its overhead is the schema, the batch header and the end marker, whatever it holds:
560 bytes for a bytes format's three columns, 1,070 for a 5-column Parquet table's seven.

Where a run goes:

- ``files`` mode: one object ``{writer}-r{n:05d}.run`` under the work folder, laid out like
  Spark's sort-shuffle output (one data file and its index), the index kept at the end::

      segment(p0) | segment(p1) | ... | index | uint64 index bytes | uint64 G | b"PSRUN002"

  ``p0 < p1 < ...`` are the first piles of the segments (piles, or groups of G piles, that the
  run reaches). The index is little-endian int64 rows of ``(first pile, offset, length,
  records)``, one per segment. Pass 2 needs none of it (each element names its segment's byte
  range); it makes a run self-describing.
  Objects: one per run, not one per (file, pile).
- ``shuffle`` mode: each segment is the payload of one element.

Runs have deterministic names (the writer's name and a counter), so a re-run writer replaces
its runs; they are removed when the whole output is published.
"""

import dataclasses
import os
import shutil
import tempfile
import uuid
import weakref

import numpy as np
import pyarrow as pa

from pileshuffle import interrupt, keys as keymath, memory_runs, storage
from pileshuffle.fingerprint import Fingerprint
from pileshuffle.fragments import (END_OF_STREAM, Fragment, GroupSegment, has_dictionaries, segment_encoder,
                                   write_failure)
from pileshuffle.names import HASH_COLUMN, KEY_COLUMN, run_name

__all__ = ["DEFAULT_RUN_BYTES", "MAX_HELD_BYTES", "RUN_MAGIC", "SEGMENT_OVERHEAD", "auto_run_bytes", "run_bytes_for",
           "PileRuns", "read_run_index"]

DEFAULT_RUN_BYTES = 256 << 20  # a writer's budget where no pile count is known (ShuffleToPiles' default)
MAX_HELD_BYTES = 1 << 30  # a writer holds at most this in memory; a larger run is spilled to local disk and merged
_PART_BYTES = 64 << 10  # auto: a run gives each pile a part of about this much...
_MIN_RUN_BYTES, _MAX_RUN_BYTES = 64 << 20, 1 << 30  # ...within these bounds, all held in memory
_REMOTE_PART_BYTES, _MAX_REMOTE_RUN_BYTES = 256 << 10, 32 << 30  # auto for runs on an object store (spilled)
_SPILLED_PART_BYTES = 128 << 10  # auto where a writer spills to a disk of its own (Dataflow, shuffle)
_MAX_MERGED_PART = 64 << 20  # a spilled run stops growing at this much per pile: the merge holds one part 3 times
RUN_MAGIC = b"PSRUN002"  # 002: segments of groups of piles, G in the footer
SEGMENT_OVERHEAD = 1000  # bytes of a segment beside its records: schema, batch header, end marker (measured:
# 560 for a bytes format's 3 columns, 1,070 for a 5-column Parquet table's 7)
_WINDOW_BYTES = 32 << 20  # a flush gathers about this many bytes of neighbouring piles at a time
_LENGTH_COLUMN = "_pileshuffle_length"  # a spill's column of each record's payload bytes


def auto_run_bytes(num_piles: int, remote: bool = False, room: int = 0) -> int:
    """``--run_bytes=auto``: ``num_piles`` parts of 64 KiB (about 64 records of 1 KB per element),
    at least 64 MiB and at most 1 GiB, all held in memory: at 100,000 piles a part is then about
    10 KiB. With ``remote`` (files mode on an object store, where pass 2 pays a request per part)
    parts of 256 KiB, up to 32 GiB: beyond ``MAX_HELD_BYTES`` the run is spilled to local disk.
    With ``room`` (shuffle mode on workers with a disk of their own, ``job_model``) parts of 128 KiB
    (a segment's ~1,000 bytes of framing under 1% of each element) up to ``room`` bytes, spilled
    beyond ``MAX_HELD_BYTES``."""
    if remote:
        return int(min(_MAX_REMOTE_RUN_BYTES, max(_MIN_RUN_BYTES, num_piles * _REMOTE_PART_BYTES)))
    if room:
        most = min(_MAX_REMOTE_RUN_BYTES, max(_MAX_RUN_BYTES, room))
        return int(min(most, max(_MIN_RUN_BYTES, num_piles * _SPILLED_PART_BYTES)))
    return int(min(_MAX_RUN_BYTES, max(_MIN_RUN_BYTES, num_piles * _PART_BYTES)))


def run_bytes_for(value, num_piles: int, remote: bool = False, room: int = 0) -> int:
    """The run size pass 1 uses for ``--run_bytes`` ``value`` (``"auto"``, None or bytes;
    ``remote`` and ``room``: ``auto_run_bytes``): a run larger than memory holds is cut where its
    parts would pass 64 MiB, which the merge holds."""
    run_bytes = auto_run_bytes(num_piles, remote, room) if value in (None, "auto") else int(value)
    return int(min(run_bytes, max(MAX_HELD_BYTES, num_piles * _MAX_MERGED_PART)))


@dataclasses.dataclass
class _Held:
    """One keyed chunk, sorted by pile: ``bounds[p]:bounds[p+1]`` are pile p's rows."""

    table: pa.Table  # the records with KEY_COLUMN and HASH_COLUMN, in pile order
    bounds: np.ndarray
    lengths: np.ndarray  # each row's payload bytes (the fingerprint's byte count)


class PileRuns:
    """Gathers a writer's keyed chunks into runs of ``budget`` bytes (as Arrow holds them).

    ``add`` and ``flush`` return the ``(pile, Fragment)`` elements of the runs they make (none
    while a run is filling); with ``group`` > 1, ``(pile // group, GroupSegment)`` elements. ``directory`` given: files mode, runs are objects there named
    ``run_name(writer, n)``; None: shuffle mode, segments are element payloads, made as they are
    taken. Memory: the held chunks (at most ``MAX_HELD_BYTES`` or ``budget``, plus one chunk) and one
    window of about 32 MiB at a flush; a larger run is spilled to local disk and merged
    (``_Spills``). With ``memory`` (files mode), a run that fits in it is kept in this process's
    memory instead of written (``memory_runs``).
    """

    def __init__(self, num_piles: int, budget: int, writer: str, directory: str = None, order: tuple = (),
                 memory: int = 0, group: int = 1):
        self._num_piles, self._budget, self._writer, self._directory = num_piles, int(budget), writer, directory
        self._group = int(group)
        self._memory = int(memory)  # files mode: runs kept in this process's memory up to this (memory_runs)
        self._order, self._held, self._held_bytes, self._runs = tuple(order), [], 0, 0
        self._hold, self._spills = min(self._budget, MAX_HELD_BYTES), _Spills()

    @property
    def runs(self) -> int:
        """How many runs this writer has flushed."""
        return self._runs

    def add(self, table: pa.Table, keys: np.ndarray, hashes: np.ndarray, lengths: np.ndarray, rows=None):
        """Hold one chunk (``rows``: the records with their copies are ``table.take(rows)``)."""
        if len(keys) == 0:
            return ()
        order, bounds = keymath.group_by_pile(keymath.pile_of(keys, self._num_piles), self._num_piles)
        taken = table.take(order if rows is None else rows[order])
        taken = taken.append_column(KEY_COLUMN, pa.array(keys[order], type=pa.uint64()))
        taken = taken.append_column(HASH_COLUMN, pa.array(hashes[order], type=pa.uint64()))
        self._held.append(_Held(taken, bounds, lengths[order]))
        self._held_bytes += taken.nbytes
        if self._held_bytes < self._hold:
            return ()
        if self._spills.bytes + self._held_bytes < self._budget:
            self._spill()
            return ()
        return self.flush()

    def flush(self):
        """Make what is held (and spilled) one run; its ``(pile, Fragment)`` elements (none if
        nothing is held). Files mode: a list, once the run is in place; shuffle mode: an iterator."""
        if not self._held and not self._spills:
            return ()
        if self._spills and self._held:
            self._spill()  # the rest too: the merge reads spills only
        size = self._spills.bytes or self._held_bytes
        held, done = self._spills.take() if self._spills else (self._held, None)
        self._held, self._held_bytes = [], 0
        order = (*self._order, self._runs)
        self._runs += 1
        if self._directory is None:
            encoded = _Encoded()
            return ((key, _element(order, facts, payload=encoded(part)))
                    for key, part, facts in _segments(held, done, self._group))
        return self._write_run(held, done, size, order)

    def _spill(self):
        held, self._held, self._held_bytes = self._held, [], 0
        self._spills.write(held)

    @interrupt.writes  # Ctrl-C's clean-up waits for it; none starts after Ctrl-C
    def _write_run(self, held, done, size: int, order) -> list:
        """The run's elements, once it is in place: kept in memory if it fits what is left of
        ``memory`` (``memory_runs``), else written to ``directory``."""
        final = storage.join(self._directory, run_name(self._writer, self._runs - 1))
        encoded = _Encoded()
        if self._memory and size <= memory_runs.room(self._directory, self._memory):
            kept = {}
            segments = _sliced(held, done) if self._group == 1 else list(_segments(held, done, self._group))

            def keep(offset, part):  # the records themselves, no IPC between the passes of one process
                kept[offset] = part
                return encoded.size(part)

            elements, index = _placed(segments, order, final, self._group, keep)
            if memory_runs.keep(self._directory, self._memory, final, kept, sum(row[2] for row in index)):
                return elements
            segments = _segments_of(segments)
        else:
            segments = _segments(held, done, self._group)
        temp = storage.writing_name(final, uuid.uuid4().hex[:12])  # an attempt's own: two never share one
        try:
            with storage.open_write(temp) as handle:
                elements, index = _placed(segments, order, final, self._group, lambda _, part: encoded.write(handle, part))
                table = np.asarray(index, dtype="<i8").reshape(-1, 4).tobytes()
                handle.write(table + len(table).to_bytes(8, "little") + self._group.to_bytes(8, "little") + RUN_MAGIC)
            storage.put_in_place([temp], [final])
        except OSError as error:  # a buffered writer reports a full disk when it is closed
            raise write_failure(self._directory, error, size) from error
        return elements


def _placed(segments, order, path: str, group: int, put) -> tuple:
    """``(elements, index rows)`` of ``segments`` laid one after another in the run at ``path``,
    each record batch handed to ``put(offset, batch)`` as it is placed, which returns its
    segment's length in bytes."""
    elements, index, offset = [], [], 0
    for key, part, facts in segments:
        length = put(offset, part)
        element = _element(order, facts, path=path, offset=offset, length=length)
        elements.append((key, element))
        records = element.records if isinstance(element, Fragment) else element.fragment.records
        index.append((key * group, offset, length, records))
        offset += length
    return elements, index


class _Encoded:
    """A run's segments: ``encoded(batch)`` is a batch's (``segment_encoder``), ``encoded.size(batch)``
    its length without encoding it (a run kept in memory keeps its batches, ``memory_runs``)."""

    def __init__(self):
        self._schema, self._encode, self._head = None, None, 0

    def __call__(self, batch: pa.RecordBatch) -> bytes:
        self._for(batch.schema)
        return self._encode(batch)

    def write(self, handle, batch: pa.RecordBatch) -> int:
        """Write ``batch``'s segment to ``handle``; its length."""
        segment = self(batch)
        handle.write(segment)
        return len(segment)

    def size(self, part) -> int:
        """The length of ``part``'s segment (a record batch's, exact; a table's: its batches' sum,
        which is what a run kept in memory counts, ``_sliced``)."""
        self._for(part.schema)
        batches = [part] if isinstance(part, pa.RecordBatch) else part.to_batches()
        if self._head is None:  # dictionaries: the stream writer's bytes, known by writing them
            return len(self._encode(_one_record_batch(part)))
        return self._head + sum(pa.ipc.get_record_batch_size(b) for b in batches) + len(END_OF_STREAM)

    def _for(self, schema: pa.Schema):
        if self._schema is None or not schema.equals(self._schema, check_metadata=True):
            self._schema, self._encode = schema, segment_encoder(schema)
            self._head = None if has_dictionaries(schema) else schema.serialize().size


def _element(order, facts, **where):
    """A segment's element value: a ``Fragment`` of one pile (``facts``: ``(records, nbytes,
    fingerprint)``) or a ``GroupSegment`` (``facts``: its rows per pile); ``where`` locates it."""
    if isinstance(facts, tuple):
        return Fragment(order, *facts, **where)
    with np.errstate(over="ignore"):
        summed = facts.sum(axis=0, dtype=np.uint64).tolist()
    fingerprint = Fingerprint(summed[2], summed[4], summed[5], int(np.bitwise_xor.reduce(facts[:, 6])))
    return GroupSegment(Fragment(order, summed[2], summed[3], fingerprint, **where), facts)


def _segments(held, done=None, group: int = 1):
    """``(key, record batch, facts)`` for every pile (``group`` 1: key the pile, facts ``(records,
    nbytes, fingerprint)``) or group of piles (key ``pile // group``, facts ``GroupSegment.piles``)
    the held chunks reach, in pile order; each pile's records in held order (chunk by chunk), a
    window of neighbouring piles at a time (``_windows``, ``_gather``). ``done`` is called at the end."""
    try:
        for gathered in _gathered(held, group):
            yield from _window_segments(*gathered, group)
    finally:
        if done is not None:
            done()


def _windows(held, group: int = 1):
    """``(start, stop)``: the piles in ranges of about ``_WINDOW_BYTES`` of held records each,
    cut only between groups of ``group`` piles."""
    num_piles = len(held[0].bounds) - 1
    counts = sum(np.diff(h.bounds) for h in held)
    mean = sum(h.table.nbytes for h in held) / max(1, int(counts.sum()))
    reached = np.cumsum(counts) * mean  # about the bytes of piles 0..p
    start = 0
    while start < num_piles:
        before = reached[start - 1] if start else 0.0
        stop = max(start + 1, int(np.searchsorted(reached, before + _WINDOW_BYTES, side="right")))
        stop = min(num_piles, -(-stop // group) * group)
        yield start, stop
        start = stop


def _gathered(held, group: int = 1):
    """Every window's ``_gather`` that some chunk reaches, in pile order."""
    for start, stop in _windows(held, group):
        gathered = _gather(held, start, stop)
        if gathered is not None:
            yield gathered


def _gather(held, start: int, stop: int):
    """``(table, piles, lengths)`` of piles ``start .. stop-1``: each chunk's slice of them, put
    in pile order (one take; chunk order kept within a pile); None if no chunk reaches them."""
    slices, piles, lengths = [], [], []
    for h in held:
        first, last = int(h.bounds[start]), int(h.bounds[stop])
        if last > first:
            slices.append(h.table.slice(first, last - first))
            piles.append(np.repeat(np.arange(start, stop), np.diff(h.bounds[start : stop + 1])))
            lengths.append(np.asarray(h.lengths[first:last]))
    if not slices:
        return None
    piles = np.concatenate(piles)
    order = np.argsort(piles, kind="stable")
    return pa.concat_tables(slices).combine_chunks().take(order), piles[order], np.concatenate(lengths)[order]


def _sliced(held, done=None) -> list:
    """``_segments`` of ``held`` for a run kept in memory (one pile a segment): each pile's records
    as a table of zero-copy slices of the held chunks, in held order (the rows and order
    ``_gather`` would copy into one batch), with the same facts. ``done`` is called at the end."""
    try:
        bounds = np.stack([h.bounds for h in held])  # (chunk, pile + 1)
        counts = np.diff(bounds, axis=1)
        payloads = sum(_per_pile(np.cumsum(np.asarray(h.lengths), dtype=np.int64), h.bounds) for h in held)
        with np.errstate(over="ignore"):
            sums = sum(_per_pile(np.cumsum(_hashes(h), dtype=np.uint64), h.bounds) for h in held)
        xors = np.bitwise_xor.reduce([_per_pile(np.bitwise_xor.accumulate(_hashes(h)), h.bounds, np.bitwise_xor)
                                      for h in held], axis=0)
        segments = []
        for pile in np.flatnonzero(counts.sum(axis=0)).tolist():
            parts = [h.table.slice(int(b[pile]), int(n[pile])) for h, b, n in zip(held, bounds, counts) if n[pile]]
            part = pa.concat_tables(parts) if len(parts) > 1 else parts[0]
            records = int(counts[:, pile].sum())
            fingerprint = Fingerprint(records, int(payloads[pile]), int(sums[pile]), int(xors[pile]))
            segments.append((pile, part, (records, part.nbytes, fingerprint)))
        return segments
    finally:
        if done is not None:
            done()


def _hashes(held: _Held) -> np.ndarray:
    return held.table.column(HASH_COLUMN).to_numpy()


def _per_pile(prefix: np.ndarray, bounds: np.ndarray, minus=np.subtract) -> np.ndarray:
    """Each pile's total from the ``prefix`` sums (or xors, ``minus`` their inverse) of one chunk's
    rows in pile order, whose pile p is rows ``bounds[p]:bounds[p+1]``."""
    with np.errstate(over="ignore"):
        prefix = np.concatenate([np.zeros(1, dtype=prefix.dtype), prefix])
        return minus(prefix[bounds[1:]], prefix[bounds[:-1]])


def _segments_of(sliced) -> list:
    """``_sliced``'s segments with each pile's records as one record batch (what a run on disk holds)."""
    return [(pile, _one_record_batch(part), facts) for pile, part, facts in sliced]


def _one_record_batch(part) -> pa.RecordBatch:
    """``part`` (a record batch, or a table of any chunks) as one record batch."""
    if isinstance(part, pa.RecordBatch):
        return part
    combined = part.combine_chunks()
    return combined.to_batches()[0] if combined.num_rows else pa.RecordBatch.from_pylist([], schema=part.schema)


def _window_segments(window: pa.Table, piles: np.ndarray, lengths: np.ndarray, group: int = 1):
    """The segments of a gathered window (``_gather``), one per pile or group of piles (``_segments``)."""
    batch = window.to_batches()[0] if window.num_rows else None
    firsts = np.concatenate([[0], np.flatnonzero(np.diff(piles)) + 1])
    counts = np.diff(np.append(firsts, len(piles)))
    hashes = window.column(HASH_COLUMN).to_numpy()
    with np.errstate(over="ignore"):
        sums = np.add.reduceat(hashes, firsts)
    xors, payloads = np.bitwise_xor.reduceat(hashes, firsts), np.add.reduceat(lengths, firsts)
    if group > 1:
        yield from _group_segments(batch, piles[firsts], firsts, counts, payloads, sums, xors, group)
        return
    for pile, first, count, total, xor, payload in zip(piles[firsts].tolist(), firsts.tolist(), counts.tolist(),
                                                       sums.tolist(), xors.tolist(), payloads.tolist()):
        part = batch.slice(first, count)
        yield pile, part, (count, part.nbytes, Fingerprint(count, payload, total, xor))


def _group_segments(batch, piles, firsts, counts, payloads, sums, xors, group: int):
    """``(pile // group, record batch, GroupSegment.piles)`` of a window's piles (first rows ``firsts``
    of ``batch``), one segment a group."""
    keys = piles // group
    starts = np.concatenate([[0], np.flatnonzero(np.diff(keys)) + 1, [len(piles)]])
    # a pile's Arrow bytes: its payload and its share of the window's per-row bytes beside payloads
    # (one nbytes per window; a slice's own nbytes cost 16 us a pile, 3 s of 1 GB in 4,096 piles)
    per_row = max(0.0, (batch.nbytes - float(payloads.sum())) / max(1, batch.num_rows))
    nbytes = payloads + np.rint(counts * per_row).astype(np.int64)
    facts = np.column_stack([np.asarray(c).astype(np.uint64) for c in (piles, firsts, counts, nbytes, payloads, sums, xors)])
    for a, b in zip(starts[:-1].tolist(), starts[1:].tolist()):
        first, last = int(firsts[a]), int(firsts[b - 1] + counts[b - 1])
        rows = facts[a:b].copy()
        rows[:, 1] -= np.uint64(first)
        yield int(keys[a]), batch.slice(first, last - first), rows


class _Spills:
    """A run's spills on the local disk (``tempfile``'s folder): each one Arrow IPC stream of held
    chunks gathered in pile order a window at a time (``_gather``), with each record's payload
    length as one more column, and the spill's pile bounds kept in memory (8 bytes a pile). Read
    back memory-mapped as held chunks, a spill is merged like any: the merge is a flush."""

    def __init__(self):
        self._folder, self._spilled, self.bytes = None, [], 0

    def __bool__(self) -> bool:
        return bool(self._spilled)

    def write(self, held):
        """Write ``held`` (chunks in pile order each) as one spill."""
        if self._folder is None:
            self._folder = tempfile.mkdtemp(prefix="pileshuffle-spill-")
            self._remove = weakref.finalize(self, shutil.rmtree, self._folder, True)  # also at exit
        path, held_bytes = os.path.join(self._folder, f"{len(self._spilled):05d}.spill"), sum(h.table.nbytes for h in held)
        try:
            with pa.OSFile(path, "wb") as sink:
                writer = None
                for window, _, lengths in _gathered(held):
                    table = window.append_column(_LENGTH_COLUMN, pa.array(lengths, pa.int64()))
                    writer = writer or pa.ipc.new_stream(sink, table.schema)
                    writer.write_table(table)
                writer.close()
        except OSError as error:
            raise write_failure(self._folder, error, held_bytes) from error
        self._spilled.append((path, np.concatenate([[0], np.cumsum(sum(np.diff(h.bounds) for h in held))])))
        self.bytes += held_bytes

    def take(self) -> tuple:
        """``(held chunks, done)``: the spills, memory-mapped, and what removes them; the
        spills of the next run start anew."""
        held = []
        for path, bounds in self._spilled:
            table = pa.ipc.open_stream(pa.memory_map(path)).read_all()
            held.append(_Held(table.drop_columns([_LENGTH_COLUMN]), bounds, table.column(_LENGTH_COLUMN)))
        done = self._remove
        self._folder, self._spilled, self.bytes = None, [], 0
        return held, done


def read_run_index(data: bytes) -> tuple:
    """A whole run's ``(index, G)``: int64 rows ``(first pile, offset, length, records)`` and the
    piles a segment holds; ValueError if ``data`` does not end as a run does."""
    if len(data) < 24 or data[-8:] != RUN_MAGIC:
        raise ValueError(f"not a pileshuffle run (no {RUN_MAGIC.decode()} footer)")
    size, group = int.from_bytes(data[-24:-16], "little"), int.from_bytes(data[-16:-8], "little")
    if size % 32 or size > len(data) - 24:
        raise ValueError(f"a run's index of {size} bytes does not fit in {len(data)} bytes")
    return np.frombuffer(data[len(data) - 24 - size : len(data) - 24], dtype="<i8").reshape(-1, 4), group
