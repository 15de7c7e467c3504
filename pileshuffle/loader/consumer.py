"""Consumer: one reader of an epoch's global sequence, split among ranks and workers.

What every sequence the loader reads shares (``ShuffledDataset``: one output; ``Mixture``:
several, interleaved by weight); a subclass says what an epoch's sequence is and how to
read a list of its position ranges.

Invariants:
- An epoch is one global sequence of ``total`` records, a pure function of the subclass's
  identity and the epoch; a consumer (rank, worker) reads a list of ranges of it
  (``split``), in order.
- ``position`` counts the records this consumer has yielded this epoch; a state is
  ``(ranges, position)`` plus what identifies the sequence (``_identity()`` and the
  epoch), so resuming is exact, and refused on any other sequence.
- A *pass* is one ``iter()`` / ``batches()`` (a ``ds.tf()`` iteration is one too). Each new
  pass reads the next epoch, unless ``set_epoch(e)`` was called since the last pass (then
  epoch e from its start) or a state was loaded (then the rest of that state's epoch, once).

Subclasses define ``format``, ``schema``, ``outputs``, ``_order_of(epoch)`` (an object with
``epoch`` and ``total``), ``_identity()``, ``_check_identity(state)`` and
``_read(ranges, step)`` (tables of the ranges' records of this epoch, in order, cut at
multiples of ``step`` records).
"""

import copy

import numpy as np
import pyarrow as pa

from pileshuffle.formats import get_format
from pileshuffle.loader import split
from pileshuffle.loader.arguments import checked_batch_size, whole_number
from pileshuffle.loader.batching import list_batches, object_array, payloads, table_batches

__all__ = ["STATE_FORMAT", "SEEDS", "Consumer"]

STATE_FORMAT = 2  # 2: ``dataset`` is the output's identity dict (1 was an order-blind fingerprint)
SEEDS = 1 << 64  # seeds are 64-bit words (keys.stream_key)
_RECORD_PIECE = 1024  # records turned into Python objects at a time by iter()


class Consumer:
    """The epochs, splits, passes and states of a sequence (see the module docstring)."""

    def __init__(self, *, seed, rank, world_size, remainder, prefetch):
        self.seed = whole_number("seed", seed, 0, SEEDS)
        self.world_size = whole_number("world_size", world_size, 1)
        self.rank = whole_number("rank", rank, 0, self.world_size, "world_size")
        self.remainder, self.prefetch = remainder, bool(prefetch)
        split.rank_share(0, self.rank, self.world_size, remainder)  # checks the remainder
        self._parts = ()  # ((worker, num_workers), ...) of a for_worker view

    # --- what it is -------------------------------------------------------------
    @property
    def epoch(self) -> int:
        return self._order.epoch

    @property
    def ranges(self) -> list:
        """The global positions this consumer reads this epoch, in order."""
        return list(self._ranges)

    @property
    def position(self) -> int:
        """Records this consumer has yielded this epoch."""
        return self._position

    def __len__(self) -> int:
        return split.length(self._ranges)

    def _where(self) -> str:
        return f"rank {self.rank}/{self.world_size}" + "".join(
            f", worker {w}/{n}" for w, n in self._parts
        )

    def torch(self, *, batch_size=None, **kwargs):
        """A ``torch.utils.data.IterableDataset`` of these records, or with ``batch_size`` of
        ``batches()``: the same types through DataLoader workers (see ``loader.torch``)."""
        batch_size = checked_batch_size(batch_size)  # checked before torch's import
        from pileshuffle.loader.torch import TorchDataset

        return TorchDataset(self, batch_size=batch_size, **kwargs)

    def tf(self, *, batch_size=None, **kwargs):
        """A ``tf.data.Dataset`` of these records (see ``loader.tf``)."""
        batch_size = checked_batch_size(batch_size)  # checked before TensorFlow's import
        from pileshuffle.loader.tf import to_tf

        return to_tf(self, batch_size=batch_size, **kwargs)

    def grain(self, *, shard_options=None, num_epochs=1):
        """A ``grain.IterDataset`` of these records: per host (``rank``/``world_size``, or Grain's
        ``shard_options``), per ``mp_prefetch`` worker, ``num_epochs`` epochs per iterator (None:
        endless), its iterators' state the loader's (see ``loader.grain``)."""
        from pileshuffle.loader.grain import GrainDataset

        return GrainDataset(self, shard_options=shard_options, num_epochs=num_epochs)

    # --- epochs and splits ------------------------------------------------------
    def _split_of(self, consumer) -> list:
        """The standard ranges of ``consumer`` = [rank, world_size, worker, num_workers,
        ...] this epoch."""
        ranges = split.rank_share(self._order.total, consumer[0], consumer[1], self.remainder)
        return _worker_parts(ranges, zip(consumer[2::2], consumer[3::2]))

    def _start_epoch(self, epoch: int):
        self._order = self._order_of(epoch)
        self._ranges = self._split_of(self._consumer())
        self._position = 0
        self._resume_at = None  # where the next iteration starts (a loaded state's position)
        self._resumed = None
        self._passed = False  # a pass has started since this epoch was set or a state loaded

    def set_epoch(self, epoch: int):
        """The next pass reads epoch ``epoch`` from its start. Only when no pass has started
        since a state of that same epoch was loaded does the state stay (so a resumed state
        survives the usual ``set_epoch`` at an epoch's start)."""
        epoch = whole_number("epoch", epoch, 0)
        if epoch != self.epoch or self._passed:
            self._start_epoch(epoch)

    def _begin_pass(self):
        """A new pass: the next epoch if a pass has started since ``set_epoch`` or
        ``load_state_dict``, else the epoch (and position) they set."""
        if self._passed:
            self._start_epoch(self.epoch + 1)
        self._passed = True

    def _next_pass(self):
        """This consumer as its next pass will begin (itself, or a copy at the next epoch)."""
        if not self._passed:
            return self
        upcoming = copy.copy(self)
        upcoming._start_epoch(self.epoch + 1)
        return upcoming

    def _at_epoch(self, epoch: int):
        """A copy whose next pass reads ``epoch`` from its start (this consumer itself when its
        next pass would: its own epoch, where a loaded state may be waiting)."""
        if not self._passed and self.epoch == epoch:
            return self
        view = copy.copy(self)
        view._start_epoch(epoch)
        return view

    def for_worker(self, worker: int, num_workers: int):
        """A view reading contiguous part ``worker`` of ``num_workers`` of what this
        consumer's next pass would read (this epoch's rest, or the next epoch's share). After
        ``load_state_dict(list)`` of exactly the split this view belongs to, the view
        resumes its own state instead (the uninterrupted order)."""
        num_workers = whole_number("num_workers", num_workers, 1)
        worker = whole_number("worker", worker, 0, num_workers, "num_workers")
        view = copy.copy(self._next_pass())
        if (worker, num_workers) != (0, 1):
            view._parts = view._parts + ((worker, num_workers),)
        own = _own_state(view._resumed, view) if view._resumed else None
        if own is not None:
            view._resume(own)
        else:
            view._ranges = split.part(
                split.tail(view._ranges, view._resume_at or 0), worker, num_workers
            )
            view._position = view._resume_at = 0
        return view

    # --- state ------------------------------------------------------------------
    def _consumer(self) -> list:
        return [self.rank, self.world_size, *(x for part in self._parts for x in part)]

    def state_after(self, n: int) -> dict:
        """The state of this consumer once it has yielded ``n`` records this epoch
        (a function of ``n`` alone)."""
        if not 0 <= int(n) <= len(self):
            raise ValueError(f"n must be in 0..{len(self)}, got {n}")
        return {
            "format": STATE_FORMAT,
            **self._identity(),
            "epoch": self.epoch,
            "consumer": self._consumer(),
            "ranges": [[int(a), int(b)] for a, b in self._ranges],
            "position": int(n),
        }

    def state_dict(self) -> dict:
        """Small and JSON-serializable: where this consumer is in this epoch."""
        return self.state_after(self._position)

    def load_state_dict(self, state):
        """Resume. One state (this consumer's): continue exactly where it stopped. A
        list of the states of *all* consumers of an earlier split: if that split is this
        one (same world size and workers), each consumer continues its own state; else
        this consumer reads its part of the union of their unfinished tails, dealt out
        again in global order (``split.redeal``): nothing lost, nothing repeated."""
        states = list(state) if isinstance(state, (list, tuple)) else [state]
        if not states:
            raise ValueError("load_state_dict() of an empty list")
        for one in states:
            self._check_state(one)
        epochs = {int(one["epoch"]) for one in states}
        if len(epochs) > 1:
            raise ValueError(f"the states are of different epochs {sorted(epochs)}")
        if epochs != {self.epoch}:
            self._start_epoch(epochs.pop())
        self._passed = False
        if isinstance(state, dict):
            if list(state["consumer"]) != self._consumer():
                raise ValueError(
                    "this state is of consumer (rank, world_size, worker, num_workers...) = "
                    f"{state['consumer']}, not {self._consumer()}: to change the split, pass the "
                    "states of all consumers as a list"
                )
            self._resume(state)
            return
        self._resumed = states
        own = _own_state(states, self)
        if own is not None:
            self._resume(own)
            return
        tails = (
            r
            for one in states
            for r in split.tail([tuple(x) for x in one["ranges"]], int(one["position"]))
        )
        ranges = split.redeal(split.union(tails), self.rank, self.world_size, self.remainder)
        self._ranges, self._position, self._resume_at = _worker_parts(ranges, self._parts), 0, 0

    def _resume(self, state: dict):
        """Continue ``state`` (one of this consumer's): its ranges, from its position."""
        self._ranges, self._position = [tuple(r) for r in state["ranges"]], int(state["position"])
        self._resume_at = self._position

    def _check_state(self, state: dict):
        """Refuse a state that is not of this sequence, saying how it differs."""
        kind = type(self).__name__
        if not isinstance(state, dict) or "format" not in state:
            raise ValueError(f"not a {kind} state: {state!r:.200}")
        if state["format"] != STATE_FORMAT:
            raise ValueError(
                f"a {kind} state of format {state['format']}, made by another version of "
                f"pileshuffle; this one reads format {STATE_FORMAT} (start the epoch afresh)"
            )
        absent = [name for name in self._identity() if name not in state]
        if absent:
            other = "Mixture" if "mixture" in state else "ShuffledDataset"
            raise ValueError(f"a {other} state, not a {kind}'s (it has no {', '.join(absent)})")
        self._check_identity(state)
        if not 0 <= int(state["position"]) <= split.length([tuple(r) for r in state["ranges"]]):
            raise ValueError(f"the state's position {state['position']} is outside its ranges")

    # --- reading ----------------------------------------------------------------
    def _tables(self, step: int):
        """Tables of at most ``step`` records, in order, from where this iteration starts
        (a loaded state's position, else 0); the caller advances ``_position``. Sets the
        position at once (not lazily), so ``state_dict()`` is right before the first
        record is taken."""
        self._begin_pass()
        start, self._resume_at = self._resume_at or 0, None
        self._position = start
        return self._read(split.tail(self._ranges, start), step)

    def __iter__(self):
        """The records from this epoch's start, or from a loaded state's position."""
        return self._records(self._tables(_RECORD_PIECE))

    def _records(self, tables):
        rows = self.format == "parquet"
        fmt = get_format(self.format)
        for table in tables:
            records = table.to_pylist() if rows else fmt.records_of(payloads(table))
            del table  # holds a step's buffers: let the next step's load find it gone
            for record in records:
                self._position += 1
                yield record

    def batches(self, batch_size: int, *, drop_last: bool = False, as_numpy: bool = False):
        """Batches of ``batch_size`` records (the last may be shorter unless ``drop_last``):
        ``list[bytes]`` (TFRecord, JSONL), ``pyarrow.RecordBatch`` (Parquet), or with
        ``as_numpy`` a ``dict`` of numpy arrays (``{"record": object array of bytes}``
        for bytes formats)."""
        batch_size = checked_batch_size(batch_size)
        return self._batches(self._tables(batch_size), batch_size, drop_last, as_numpy)

    def _batches(self, tables, batch_size, drop_last, as_numpy):
        parts = table_batches if self.format == "parquet" else list_batches
        for batch in parts(tables, batch_size):
            size = len(batch) if isinstance(batch, list) else batch.num_rows
            self._position += size  # a batch counts as read once yielded; a dropped last one too
            if size == batch_size or not drop_last:
                yield self._batch(batch, as_numpy)

    def _batch(self, batch, as_numpy: bool):
        if self.format != "parquet":
            batch = get_format(self.format).records_of(batch)
            return {"record": object_array(batch)} if as_numpy else batch
        if as_numpy:
            return {
                name: column.to_numpy() for name, column in zip(batch.column_names, batch.columns)
            }
        batches = batch.combine_chunks().to_batches()
        return batches[0] if batches else pa.RecordBatch.from_pylist([], schema=batch.schema)


def _worker_parts(ranges, parts) -> list:
    """A rank's ``ranges`` cut for nested workers: ``parts`` = ((worker, num_workers), ...)."""
    for worker, num_workers in parts:
        ranges = split.part(ranges, worker, num_workers)
    return ranges


def _own_state(states, consumer):
    """``consumer``'s own state in ``states`` if they are exactly the states of all
    consumers of its split, each with its standard ranges; else None."""
    mine = consumer._consumer()
    shape = mine[1::2]  # world_size, num_workers, ...
    consumers = {tuple(s["consumer"]) for s in states}
    if len(consumers) != len(states) or len(states) != int(np.prod(shape)):
        return None
    for state in states:
        if list(state["consumer"][1::2]) != shape:
            return None
        if [tuple(r) for r in state["ranges"]] != consumer._split_of(state["consumer"]):
            return None
    return next((s for s in states if list(s["consumer"]) == mine), None)
