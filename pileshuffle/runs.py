"""Pass-1 runs: a writer's pile parts gathered up to a memory budget, written in pile order.

A pass-1 writer (one group of input files in the template, one bundle of ``ShuffleToPiles``)
keys each chunk it reads and sorts the chunk by pile (one ``take``). It holds the sorted chunks
until they reach ``budget`` bytes (or its input ends), then *flushes* them as one **run**: for
every pile the held chunks reach, one **segment** holding that pile's records from all of them.
So a pile's part grows with the budget, not with the input chunk: at M piles a run of B bytes
gives parts of about B / M bytes, however the input is cut into files and chunks.

A segment is one Arrow IPC stream (schema, one record batch, end marker) of the pile's records
in the writer's order, with two more columns: ``KEY_COLUMN`` (U, uint64) and ``HASH_COLUMN``
(the pass-1 fingerprint hash, uint64). It is self-contained: ``pa.ipc.open_stream`` reads it
alone. Its overhead is the schema, the batch header and the end marker, whatever it holds:
560 bytes for a bytes format's three columns, 1,070 for a 5-column Parquet table's seven.

Where a run goes:

- ``files`` mode: one object ``{writer}-r{n:05d}.run`` under the work folder, laid out like
  Spark's sort-shuffle output (one data file and its index), the index kept at the end::

      segment(pile p0) | segment(pile p1) | ... | index | uint64 index bytes | b"PSRUN001"

  ``p0 < p1 < ...`` are the piles the run reaches. The index is little-endian int64 rows of
  ``(pile, offset, length, records)``, one per segment. Pass 2 needs none of it (each
  ``(pile, Fragment)`` element names its segment's byte range); it makes a run self-describing.
  Objects: one per run, not one per (file, pile).
- ``shuffle`` mode: each segment is the payload of one ``(pile, Fragment)`` element.

Runs have deterministic names (the writer's name and a counter), so a re-run writer replaces
its runs; they are removed when the whole output is published.
"""

import dataclasses
import uuid

import numpy as np
import pyarrow as pa

from pileshuffle import interrupt, keys as keymath, storage
from pileshuffle.fingerprint import Fingerprint
from pileshuffle.fragments import END_OF_STREAM, Fragment, has_dictionaries, to_ipc, write_failure
from pileshuffle.names import HASH_COLUMN, KEY_COLUMN, run_name

__all__ = ["DEFAULT_RUN_BYTES", "RUN_MAGIC", "SEGMENT_OVERHEAD", "auto_run_bytes", "PileRuns", "read_run_index"]

DEFAULT_RUN_BYTES = 256 << 20  # a writer's budget where no pile count is known (ShuffleToPiles' default)
_PART_BYTES = 64 << 10  # auto: a run gives each pile a part of about this much...
_MIN_RUN_BYTES, _MAX_RUN_BYTES = 64 << 20, 1 << 30  # ...within these bounds
RUN_MAGIC = b"PSRUN001"
SEGMENT_OVERHEAD = 1000  # bytes of a segment beside its records: schema, batch header, end marker (measured:
# 560 for a bytes format's 3 columns, 1,070 for a 5-column Parquet table's 7)
_WINDOW_BYTES = 32 << 20  # a flush gathers about this many bytes of neighbouring piles at a time


def auto_run_bytes(num_piles: int) -> int:
    """``--run_bytes=auto``: ``num_piles`` parts of 64 KiB (about 64 records of 1 KB per element),
    at least 64 MiB and at most 1 GiB: at 100,000 piles a part is then about 10 KiB."""
    return int(min(_MAX_RUN_BYTES, max(_MIN_RUN_BYTES, num_piles * _PART_BYTES)))


@dataclasses.dataclass
class _Held:
    """One keyed chunk, sorted by pile: ``bounds[p]:bounds[p+1]`` are pile p's rows."""

    table: pa.Table  # the records with KEY_COLUMN and HASH_COLUMN, in pile order
    bounds: np.ndarray
    lengths: np.ndarray  # each row's payload bytes (the fingerprint's byte count)


class PileRuns:
    """Holds a writer's keyed chunks up to ``budget`` bytes; each flush is one run.

    ``add`` and ``flush`` return the ``(pile, Fragment)`` elements of the runs they made (none
    while the budget holds). ``directory`` given: files mode, runs are objects there named
    ``run_name(writer, n)``; None: shuffle mode, segments are element payloads. Memory: the
    held chunks (at most ``budget`` plus one chunk) and one window of about 32 MiB at a flush.
    """

    def __init__(self, num_piles: int, budget: int, writer: str, directory: str = None, order: tuple = ()):
        self._num_piles, self._budget, self._writer, self._directory = num_piles, int(budget), writer, directory
        self._order, self._held, self._held_bytes, self._runs = tuple(order), [], 0, 0

    @property
    def runs(self) -> int:
        """How many runs this writer has flushed."""
        return self._runs

    def add(self, table: pa.Table, keys: np.ndarray, hashes: np.ndarray, lengths: np.ndarray, rows=None) -> list:
        """Hold one chunk (``rows``: the records with their copies are ``table.take(rows)``)."""
        if len(keys) == 0:
            return []
        order, bounds = keymath.group_by_pile(keymath.pile_of(keys, self._num_piles), self._num_piles)
        taken = table.take(order if rows is None else rows[order])
        taken = taken.append_column(KEY_COLUMN, pa.array(keys[order], type=pa.uint64()))
        taken = taken.append_column(HASH_COLUMN, pa.array(hashes[order], type=pa.uint64()))
        self._held.append(_Held(taken, bounds, lengths[order]))
        self._held_bytes += taken.nbytes
        return self.flush() if self._held_bytes >= self._budget else []

    def flush(self) -> list:
        """Write what is held as one run; its ``(pile, Fragment)`` elements (none if nothing is held)."""
        if not self._held:
            return []
        held, self._held, self._held_bytes = self._held, [], 0
        order = (*self._order, self._runs)
        if self._directory is None:
            elements = [(pile, Fragment(order, *facts, payload=segment)) for pile, segment, facts in _segments(held)]
        else:
            elements = self._write_run(held, order)
        self._runs += 1
        return elements

    @interrupt.writes  # Ctrl-C's clean-up waits for it; none starts after Ctrl-C
    def _write_run(self, held, order) -> list:
        final = storage.join(self._directory, run_name(self._writer, self._runs))
        temp = storage.writing_name(final, uuid.uuid4().hex[:12])  # an attempt's own: two never share one
        elements, index, offset = [], [], 0
        try:
            with storage.open_write(temp) as handle:
                for pile, segment, facts in _segments(held):
                    handle.write(segment)
                    elements.append((pile, Fragment(order, *facts, path=final, offset=offset, length=len(segment))))
                    index.append((pile, offset, len(segment), facts[0]))
                    offset += len(segment)
                table = np.asarray(index, dtype="<i8").reshape(-1, 4).tobytes()
                handle.write(table + len(table).to_bytes(8, "little") + RUN_MAGIC)
            storage.put_in_place([temp], [final])
        except OSError as error:  # a buffered writer reports a full disk when it is closed
            raise write_failure(self._directory, error, sum(h.table.nbytes for h in held) - offset) from error
        return elements


def _segments(held):
    """``(pile, segment bytes, (records, nbytes, fingerprint))`` for every pile the held chunks
    reach, in pile order; each pile's records in held order (chunk by chunk). Neighbouring piles
    are gathered a window of about ``_WINDOW_BYTES`` at a time: a slice of each chunk, one take."""
    num_piles = len(held[0].bounds) - 1
    counts = sum(np.diff(h.bounds) for h in held)
    mean = sum(h.table.nbytes for h in held) / max(1, int(counts.sum()))
    reached = np.cumsum(counts) * mean  # about the bytes of piles 0..p
    start = 0
    while start < num_piles:
        before = reached[start - 1] if start else 0.0
        stop = min(num_piles, max(start + 1, int(np.searchsorted(reached, before + _WINDOW_BYTES, side="right"))))
        yield from _window_segments(held, start, stop)
        start = stop


def _window_segments(held, start: int, stop: int):
    """The segments of piles ``start .. stop-1``: each chunk's slice of them, put in pile order."""
    slices, piles, lengths = [], [], []
    for h in held:
        first, last = int(h.bounds[start]), int(h.bounds[stop])
        if last > first:
            slices.append(h.table.slice(first, last - first))
            piles.append(np.repeat(np.arange(start, stop), np.diff(h.bounds[start : stop + 1])))
            lengths.append(h.lengths[first:last])
    if not slices:
        return
    piles = np.concatenate(piles)
    order = np.argsort(piles, kind="stable")  # pile-major, chunk order kept within a pile
    window = pa.concat_tables(slices).combine_chunks().take(order)
    batch = window.to_batches()[0] if window.num_rows else None
    piles, lengths = piles[order], np.concatenate(lengths)[order]
    firsts = np.concatenate([[0], np.flatnonzero(np.diff(piles)) + 1])
    counts = np.diff(np.append(firsts, len(piles)))
    hashes = window.column(HASH_COLUMN).to_numpy()
    with np.errstate(over="ignore"):
        sums = np.add.reduceat(hashes, firsts)
    xors, payloads = np.bitwise_xor.reduceat(hashes, firsts), np.add.reduceat(lengths, firsts)
    encode = _encoder(window.schema)
    for pile, first, count, total, xor, payload in zip(piles[firsts].tolist(), firsts.tolist(), counts.tolist(),
                                                       sums.tolist(), xors.tolist(), payloads.tolist()):
        part = batch.slice(first, count)
        yield pile, encode(part), (count, part.nbytes, Fingerprint(count, payload, total, xor))


def _encoder(schema: pa.Schema):
    """A function from a record batch to its segment: one Arrow IPC stream (schema, the batch, end
    marker). The schema message is encoded once: the bytes equal ``pa.ipc.new_stream``'s. A schema
    with dictionary columns goes through the stream writer, which writes their dictionaries."""
    if has_dictionaries(schema):
        return lambda batch: to_ipc(pa.Table.from_batches([batch]))
    head = schema.serialize().to_pybytes()
    return lambda batch: b"".join((head, batch.serialize().to_pybytes(), END_OF_STREAM))


def read_run_index(data: bytes) -> np.ndarray:
    """A whole run's index: int64 rows ``(pile, offset, length, records)``; ValueError if ``data``
    does not end as a run does."""
    if len(data) < 16 or data[-8:] != RUN_MAGIC:
        raise ValueError("not a pileshuffle run (no PSRUN001 footer)")
    size = int.from_bytes(data[-16:-8], "little")
    if size % 32 or size > len(data) - 16:
        raise ValueError(f"a run's index of {size} bytes does not fit in {len(data)} bytes")
    return np.frombuffer(data[len(data) - 16 - size : len(data) - 16], dtype="<i8").reshape(-1, 4)
