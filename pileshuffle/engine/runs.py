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

A segment is one Arrow IPC stream (schema, one record batch, end marker) of the pile's (or group's)
records in the writer's order, with two more columns: ``KEY_COLUMN`` (U, uint64) and ``HASH_COLUMN``
(the pass-1 fingerprint hash, uint64). It is self-contained: ``pa.ipc.open_stream`` reads it alone.
Its overhead is the schema, the batch header and the end marker, whatever it holds: 560 bytes for a
bytes format's three columns, 1,070 for a 5-column Parquet table's seven.

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

import os
import shutil
import tempfile
import uuid
import weakref

import numpy as np
import pyarrow as pa

from pileshuffle import interrupt
from pileshuffle.engine import memory_runs, run_segments
from pileshuffle.engine.fragments import (
    END_OF_STREAM,
    Fragment,
    GroupSegment,
    has_dictionaries,
    segment_encoder,
    write_failure,
)
from pileshuffle.engine.run_segments import Held
from pileshuffle.io import storage
from pileshuffle.names import HASH_COLUMN, KEY_COLUMN, run_name
from pileshuffle.records import keys as keymath
from pileshuffle.records.fingerprint import Fingerprint

__all__ = [
    "DEFAULT_RUN_BYTES",
    "MAX_HELD_BYTES",
    "RUN_MAGIC",
    "SEGMENT_OVERHEAD",
    "auto_run_bytes",
    "run_bytes_for",
    "PileRuns",
    "read_run_index",
]

# a writer's budget where no pile count is known (ShuffleToPiles' default)
DEFAULT_RUN_BYTES = 256 << 20
# a writer holds at most this in memory; a larger run is spilled to local disk and merged
MAX_HELD_BYTES = 1 << 30
_PART_BYTES = 64 << 10  # auto: a run gives each pile a part of about this much...
_MIN_RUN_BYTES, _MAX_RUN_BYTES = 64 << 20, 1 << 30  # ...within these bounds, all held in memory
# auto for runs on an object store (spilled)
_REMOTE_PART_BYTES, _MAX_REMOTE_RUN_BYTES = 256 << 10, 32 << 30
# auto where a writer spills to a disk of its own (Dataflow, shuffle)
_SPILLED_PART_BYTES = 128 << 10
# a spilled run stops growing at this much per pile: the merge holds one part 3 times
_MAX_MERGED_PART = 64 << 20
RUN_MAGIC = b"PSRUN002"  # 002: segments of groups of piles, G in the footer
# bytes of a segment beside its records: schema, batch header, end marker (measured: 560 for a
# bytes format's 3 columns, 1,070 for a 5-column Parquet table's 7)
SEGMENT_OVERHEAD = 1000
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


class PileRuns:
    """Gathers a writer's keyed chunks into runs of ``budget`` bytes (as Arrow holds them).

    ``add`` and ``flush`` return the ``(pile, Fragment)`` elements of the runs they make (none while
    a run is filling); with ``group`` > 1, ``(pile // group, GroupSegment)`` elements. ``directory``
    given: files mode, runs are objects there named ``run_name(writer, n)``; None: shuffle mode,
    segments are element payloads, made as they are taken. Memory: the held chunks (at most
    ``MAX_HELD_BYTES`` or ``budget``, plus one chunk) and one window of about 32 MiB at a flush; a
    larger run is spilled to local disk and merged (``_Spills``). With ``memory`` (files mode), a
    run that fits in it is kept in this process's memory instead of written (``memory_runs``).
    """

    def __init__(
        self,
        num_piles: int,
        budget: int,
        writer: str,
        directory: str = None,
        order: tuple = (),
        memory: int = 0,
        group: int = 1,
    ):
        self._num_piles, self._budget = num_piles, int(budget)
        self._writer, self._directory = writer, directory
        self._group = int(group)
        # files mode: runs kept in this process's memory up to this (memory_runs)
        self._memory = int(memory)
        self._order, self._held, self._held_bytes, self._runs = tuple(order), [], 0, 0
        self._hold, self._spills = min(self._budget, MAX_HELD_BYTES), _Spills()

    @property
    def runs(self) -> int:
        """How many runs this writer has flushed."""
        return self._runs

    def add(
        self, table: pa.Table, keys: np.ndarray, hashes: np.ndarray, lengths: np.ndarray, rows=None
    ):
        """Hold one chunk (``rows``: the records with their copies are ``table.take(rows)``)."""
        if len(keys) == 0:
            return ()
        order, bounds = keymath.group_by_pile(
            keymath.pile_of(keys, self._num_piles), self._num_piles
        )
        taken = table.take(order if rows is None else rows[order])
        taken = taken.append_column(KEY_COLUMN, pa.array(keys[order], type=pa.uint64()))
        taken = taken.append_column(HASH_COLUMN, pa.array(hashes[order], type=pa.uint64()))
        self._held.append(Held(taken, bounds, lengths[order]))
        self._held_bytes += taken.nbytes
        if self._held_bytes < self._hold:
            return ()
        if self._spills.bytes + self._held_bytes < self._budget:
            self._spill()
            return ()
        return self.flush()

    def flush(self):
        """Make what is held (and spilled) one run; its ``(pile, Fragment)`` elements (none if
        nothing is held). Files mode: a list, once the run is in place; shuffle mode: an
        iterator."""
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
            return (
                (key, _element(order, facts, payload=encoded(part)))
                for key, part, facts in run_segments.segments(held, done, self._group)
            )
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
            segments = (
                run_segments.sliced(held, done)
                if self._group == 1
                else list(run_segments.segments(held, done, self._group))
            )

            # the records themselves, no IPC between the passes of one process
            def keep(offset, part):
                kept[offset] = part
                return encoded.size(part)

            elements, index = _placed(segments, order, final, self._group, keep)
            if memory_runs.keep(
                self._directory, self._memory, final, kept, sum(row[2] for row in index)
            ):
                return elements
            segments = run_segments.segments_of(segments)
        else:
            segments = run_segments.segments(held, done, self._group)
        # an attempt's own: two never share one
        temp = storage.writing_name(final, uuid.uuid4().hex[:12])
        try:
            with storage.open_write(temp) as handle:
                elements, index = _placed(
                    segments, order, final, self._group, lambda _, part: encoded.write(handle, part)
                )
                table = np.asarray(index, dtype="<i8").reshape(-1, 4).tobytes()
                handle.write(
                    table
                    + len(table).to_bytes(8, "little")
                    + self._group.to_bytes(8, "little")
                    + RUN_MAGIC
                )
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
    """A run's segments: ``encoded(batch)`` is a batch's (``segment_encoder``),
    ``encoded.size(batch)`` its length without encoding it (a run kept in memory keeps its batches,
    ``memory_runs``)."""

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
        which is what a run kept in memory counts, ``run_segments.sliced``)."""
        self._for(part.schema)
        batches = [part] if isinstance(part, pa.RecordBatch) else part.to_batches()
        if self._head is None:  # dictionaries: the stream writer's bytes, known by writing them
            return len(self._encode(run_segments.one_record_batch(part)))
        return (
            self._head + sum(pa.ipc.get_record_batch_size(b) for b in batches) + len(END_OF_STREAM)
        )

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
    fingerprint = Fingerprint(
        summed[2], summed[4], summed[5], int(np.bitwise_xor.reduce(facts[:, 6]))
    )
    return GroupSegment(Fragment(order, summed[2], summed[3], fingerprint, **where), facts)


class _Spills:
    """A run's spills on the local disk (``tempfile``'s folder): each one Arrow IPC stream of held
    chunks gathered in pile order a window at a time (``run_segments.gathered``), with each record's
    payload length as one more column, and the spill's pile bounds kept in memory (8 bytes a pile).
    Read back memory-mapped as held chunks, a spill is merged like any: the merge is a flush."""

    def __init__(self):
        self._folder, self._spilled, self.bytes = None, [], 0

    def __bool__(self) -> bool:
        return bool(self._spilled)

    def write(self, held):
        """Write ``held`` (chunks in pile order each) as one spill."""
        if self._folder is None:
            self._folder = tempfile.mkdtemp(prefix="pileshuffle-spill-")
            self._remove = weakref.finalize(self, shutil.rmtree, self._folder, True)  # also at exit
        path, held_bytes = (
            os.path.join(self._folder, f"{len(self._spilled):05d}.spill"),
            sum(h.table.nbytes for h in held),
        )
        try:
            with pa.OSFile(path, "wb") as sink:
                writer = None
                for window, _, lengths in run_segments.gathered(held):
                    table = window.append_column(_LENGTH_COLUMN, pa.array(lengths, pa.int64()))
                    writer = writer or pa.ipc.new_stream(sink, table.schema)
                    writer.write_table(table)
                writer.close()
        except OSError as error:
            raise write_failure(self._folder, error, held_bytes) from error
        self._spilled.append(
            (path, np.concatenate([[0], np.cumsum(sum(np.diff(h.bounds) for h in held))]))
        )
        self.bytes += held_bytes

    def take(self) -> tuple:
        """``(held chunks, done)``: the spills, memory-mapped, and what removes them; the
        spills of the next run start anew."""
        held = []
        for path, bounds in self._spilled:
            table = pa.ipc.open_stream(pa.memory_map(path)).read_all()
            held.append(
                Held(table.drop_columns([_LENGTH_COLUMN]), bounds, table.column(_LENGTH_COLUMN))
            )
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
    return np.frombuffer(data[len(data) - 24 - size : len(data) - 24], dtype="<i8").reshape(
        -1, 4
    ), group
