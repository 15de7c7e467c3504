"""Mixture: several outputs of one format read as one stream, interleaved by weight.

Invariants:
- Source i is a ``ShuffledDataset`` with its own seed, mix and reshuffle (a path is opened
  with a seed derived from the mixture's seed and i). Its *stream* is its epochs back to
  back, each in its own order.
- The mixed stream is ``interleave.Interleave(weights, seed)``: position n reads the next
  record of the source the pattern names, so every window holds the weights' shares as
  exactly as whole numbers allow.
- ``stop="first"``: epoch e reads epoch e of every source from its start, and ends where
  the first source would need a record past its epoch (or after ``records_per_epoch``, if
  fewer). ``stop="restart"``: sources are endless; epoch e is positions
  ``[e * L, (e + 1) * L)`` of the endless mixed stream, ``L = records_per_epoch`` (default:
  all sources' records), so a source that runs out goes on with its next epoch (its own
  reshuffle) and the next mixture epoch goes on where this one stopped.
- Ranks, workers, passes and states are ``loader.consumer``'s, over the epoch's ``L``
  positions: a state saved with one world size or worker count resumes with another. A
  state names every source's identity, the weights, the seed, ``stop`` and ``L``.
- Memory: each source holds what its own reader holds (``mix=K``: K + 1 piles) plus one
  chunk of ``_CHUNK`` records being mixed; the sources' piles load on one thread, one at a
  time, in the order the mixed stream first reads them (``Mixture._step_loads``).
"""

import collections
import copy
import dataclasses
import heapq
import os

import numpy as np
import pyarrow as pa

from pileshuffle.loader.arguments import check_world_size, describe_identity, whole_number
from pileshuffle.loader.batching import cut_at_steps, gathered
from pileshuffle.loader.block import Block
from pileshuffle.loader.consumer import Consumer
from pileshuffle.loader.dataset import ShuffledDataset
from pileshuffle.loader.interleave import Interleave
from pileshuffle.loader.prefetch import prefetched
from pileshuffle.loader.steps import stepped_blocks
from pileshuffle.records import keys as keymath

__all__ = ["STOPS", "MixtureEpoch", "Mixture"]

STOPS = ("first", "restart")
_SOURCE_SEED_STREAM = 0x4D4958534544  # "MIXSED"
_CHUNK = 8192  # records mixed at a time: one take per chunk, sliced into the reader's steps


@dataclasses.dataclass(frozen=True)
class MixtureEpoch:
    """Epoch ``epoch`` of a mixture: ``total`` positions, starting at ``offset`` of the
    endless mixed stream; source i's stream is read from ``bases[i]`` + its count there."""

    epoch: int
    total: int
    offset: int
    bases: tuple


class Mixture(Consumer):
    """The records of several outputs (shard outputs or pile stores, of one format) as one
    stream whose every window holds ``weights``' shares (see the module docstring).

    ``datasets``: paths (opened as ``ShuffledDataset(path, seed=<derived from seed>)``) or
    ``ShuffledDataset`` objects, unsplit (rank 0 of 1), whose seed, mix, columns and cache
    are used. ``weights``: positive numbers, one per dataset (normalized). ``stop``:
    ``"first"`` or ``"restart"``; ``records_per_epoch``: the epoch's length (``"restart"``;
    with ``"first"`` a cap). Reading, splitting, ``state_dict``/``load_state_dict``,
    ``torch()`` and ``tf()`` are ``ShuffledDataset``'s. See docs/loader.md.
    """

    def __init__(
        self,
        datasets,
        weights,
        *,
        seed=0,
        stop="first",
        records_per_epoch=None,
        epoch=0,
        rank=0,
        world_size=1,
        remainder="drop",
        prefetch=True,
    ):
        super().__init__(
            seed=seed, rank=rank, world_size=world_size, remainder=remainder, prefetch=prefetch
        )
        datasets, weights = list(datasets), list(weights)
        if not datasets or len(weights) != len(datasets):
            raise ValueError(
                f"a Mixture needs one weight per dataset: {len(datasets)} datasets, {len(weights)} "
                "weights"
            )
        if stop not in STOPS:
            raise ValueError(f"stop must be one of {', '.join(map(repr, STOPS))}, got {stop!r}")
        self.stop = stop
        self.sources = [self._source(dataset, i) for i, dataset in enumerate(datasets)]
        _check_alike(self.sources)
        self._interleave = Interleave(weights, self.seed)
        self.weights = list(self._interleave.weights)
        self._lengths = [source._order.total for source in self.sources]
        self.records_per_epoch = self._epoch_length(records_per_epoch)
        check_world_size(self.records_per_epoch, self._location(), self.world_size, remainder)
        self._start_epoch(whole_number("epoch", epoch, 0))

    def _source(self, dataset, index: int) -> ShuffledDataset:
        if isinstance(dataset, (str, os.PathLike)):
            seed = int(keymath.stream_key(self.seed, _SOURCE_SEED_STREAM, index)[0])
            return ShuffledDataset(dataset, seed=seed, prefetch=self.prefetch)
        if not isinstance(dataset, ShuffledDataset):
            raise TypeError(
                f"datasets[{index}] must be a path or a ShuffledDataset, got "
                f"{type(dataset).__name__}"
            )
        if dataset.world_size != 1 or dataset._parts:
            raise ValueError(
                f"datasets[{index}] is {dataset._where()} of a split: give a Mixture its datasets "
                "unsplit (rank=0, world_size=1); the Mixture splits the mixed stream"
            )
        return copy.copy(dataset)

    def _epoch_length(self, records_per_epoch) -> int:
        """L: with ``"first"`` where the first source runs out (capped by ``records_per_epoch``),
        with ``"restart"`` ``records_per_epoch`` or all sources' records."""
        for source, length in zip(self.sources, self._lengths):
            if length == 0:
                raise ValueError(
                    f"{source.output.location} holds no records: a Mixture cannot take shares of it"
                )
        cap = (
            None
            if records_per_epoch is None
            else whole_number("records_per_epoch", records_per_epoch, 1)
        )
        if self.stop == "restart":
            return sum(self._lengths) if cap is None else cap
        first = min(self._interleave.position_of(i, n) for i, n in enumerate(self._lengths))
        return first if cap is None else min(first, cap)

    # --- what it is -------------------------------------------------------------
    @property
    def format(self) -> str:
        return self.sources[0].format

    @property
    def schema(self) -> pa.Schema:
        return self.sources[0].schema

    @property
    def outputs(self) -> tuple:
        """The sources' outputs, in order."""
        return tuple(source.output for source in self.sources)

    def sources_at(self, start: int, stop: int) -> np.ndarray:
        """Which source (index) each of this epoch's positions ``start .. stop-1`` reads."""
        return self._interleave.sources(self._order.offset + start, self._order.offset + stop)

    def _location(self) -> str:
        return " + ".join(source.output.location for source in self.sources)

    def __repr__(self):
        return (
            f"Mixture({self._location()!r}, weights={self.weights}, {self.format}, "
            f"seed={self.seed}, stop={self.stop!r}, epoch={self.epoch}, {self.records_per_epoch} "
            f"records per epoch, {self._where()}, {len(self)} records, position {self._position})"
        )

    # --- what a Consumer asks ----------------------------------------------------
    def _order_of(self, epoch: int) -> MixtureEpoch:
        if self.stop == "first":
            return MixtureEpoch(
                epoch, self.records_per_epoch, 0, tuple(epoch * n for n in self._lengths)
            )
        return MixtureEpoch(
            epoch, self.records_per_epoch, epoch * self.records_per_epoch, (0,) * len(self.sources)
        )

    def _identity(self) -> dict:
        return {
            "mixture": [source._identity() for source in self.sources],
            "weights": self.weights,
            "seed": self.seed,
            "stop": self.stop,
            "records_per_epoch": self.records_per_epoch,
        }

    def _check_identity(self, state: dict):
        theirs, ours = state["mixture"], [source._identity() for source in self.sources]
        if len(theirs) != len(ours):
            raise ValueError(
                f"the state is of a mixture of {len(theirs)} datasets, this one mixes {len(ours)}"
            )
        for index, (their, our) in enumerate(zip(theirs, ours)):
            if their != our:
                raise ValueError(
                    f"the state's dataset {index} is {describe_identity(their['dataset'])} (seed "
                    f"{their['seed']}, mix {their['mix']}), not "
                    f"{self.sources[index].output.location} ({describe_identity(our['dataset'])}, "
                    f"seed {our['seed']}, mix {our['mix']}): another order"
                )
        for name in ("weights", "seed", "stop", "records_per_epoch"):
            if state[name] != getattr(self, name):
                raise ValueError(
                    f"the state has {name}={state[name]!r} but the mixture "
                    f"{name}={getattr(self, name)!r}"
                )

    # --- reading ----------------------------------------------------------------
    def _read(self, ranges, step):
        """Tables of this epoch's ``ranges``, in order, cut at multiples of ``step`` records."""
        return cut_at_steps(gathered(self._chunks(ranges)), step)

    def _chunks(self, ranges):
        """The ranges' records mixed ``_CHUNK`` positions at a time, as Blocks over the sources'
        loaded piles: the only copy is the final gather, as for one output."""
        for a, b in ranges:
            loads = self._step_loads(a, b)
            loaded = (
                prefetched(loads, _load, ahead=len(self.sources))
                if self.prefetch
                else map(_load, loads)
            )
            shared = _Shared(
                loaded, len(self.sources), [source.output.decoded for source in self.sources]
            )
            readers = [_Rows(shared.blocks(i)) for i in range(len(self.sources))]
            for lo in range(a, b, _CHUNK):
                yield self._mixed(readers, lo, min(b, lo + _CHUNK))

    def _step_loads(self, a: int, b: int):
        """``(source, load, pieces)`` for the steps of every source's piles that this epoch's
        positions ``a .. b-1`` read (``ShuffledDataset._step_loads``), in the order the mixed
        stream first reads them; planned as they are taken (an epoch may hold thousands of a
        small source's epochs). One prefetch thread builds them in that order, one at a time,
        at most one per source ahead of the reader: about two piles per source are loaded, as
        when each is read alone, but never two loads at once (each source prefetching on a
        thread of its own loaded two at once, their buffers together past twice one output's
        memory: 530-590 against 500 MB for two 1 GB Parquet outputs, now 455-460)."""
        plans = [self._source_step_loads(source, a, b) for source in range(len(self.sources))]
        for _, source, load, pieces in heapq.merge(*plans, key=lambda planned: planned[0]):
            yield source, load, pieces

    def _source_step_loads(self, source: int, a: int, b: int):
        """``(position, source, load, pieces)`` for the steps source ``source`` reads for this
        epoch's positions ``a .. b-1``, in order; ``position``: where the stream first reads it."""
        order, length, dataset = self._order, self._lengths[source], self.sources[source]
        start = order.bases[source] + self._interleave.count(source, order.offset + a)
        stop = order.bases[source] + self._interleave.count(source, order.offset + b)
        while start < stop:  # one stretch per epoch of the source
            epoch, lo = divmod(start, length)
            hi = min(length, lo + stop - start)
            for first, load, pieces in dataset._at_epoch(epoch)._step_loads([(lo, hi)]):
                position = self._interleave.position_of(
                    source, epoch * length + first - order.bases[source]
                )
                yield position, source, load, pieces
            start += hi - lo

    def _mixed(self, readers, lo: int, hi: int) -> Block:
        """Positions ``lo .. hi-1``: each source's next records, put where the pattern says."""
        sources = self.sources_at(lo, hi)
        counts = np.bincount(sources, minlength=len(readers))
        parts = [readers[i].take(int(n)) for i, n in enumerate(counts) if n]
        if len(parts) == 1:
            return parts[0]
        # record j of the parts goes to place j
        return Block.interleave(parts, np.argsort(sources, kind="stable"))


def _load(planned: tuple) -> tuple:
    """``(source, block, pieces)`` of a planned ``(source, load, pieces)``: its step built."""
    source, load, pieces = planned
    return source, load(), pieces


class _Shared:
    """The sources' steps, loaded in one sequence (``Mixture._step_loads``), handed to each
    source's reader (``blocks``) in its own order; a step loaded before its source asks for it
    waits here (rarely more than one: the sequence is the order the mixed stream reads them)."""

    def __init__(self, loaded, sources: int, decoded: list):
        self._loaded, self._decoded = iter(loaded), decoded
        self._waiting = [collections.deque() for _ in range(sources)]

    def blocks(self, source: int):
        """Source ``source``'s Blocks, in order (``steps.stepped_blocks``)."""
        return stepped_blocks(self._steps(source), self._decoded[source])

    def _steps(self, source: int):
        waiting = self._waiting[source]
        while True:
            while not waiting:
                loaded = next(self._loaded, None)
                if loaded is None:
                    return
                self._waiting[loaded[0]].append(loaded[1:])
            yield waiting.popleft()


class _Rows:
    """Exactly ``n`` records at a time (one Block) from a stream of Blocks."""

    def __init__(self, blocks):
        self._blocks, self._held = iter(blocks), None

    def take(self, n: int) -> Block:
        parts = []
        while n:
            if self._held is None or self._held.num_rows == 0:
                self._held = next(self._blocks, None)
                if self._held is None:
                    raise RuntimeError(
                        "a mixture source ran out before its count (a bug: counts are exact)"
                    )
            size = min(n, self._held.num_rows)
            parts.append(self._held.part(0, size))
            self._held, n = self._held.part(size, self._held.num_rows), n - size
        return parts[0] if len(parts) == 1 else Block.concat(parts)


def _check_alike(sources):
    """Refuse sources of different formats, or Parquet sources with different columns."""
    first = sources[0]
    for source in sources[1:]:
        if source.format != first.format:
            raise ValueError(
                f"a Mixture reads one format: {first.output.location} holds {first.format}, "
                f"{source.output.location} holds {source.format}"
            )
        if first.format == "parquet" and not source.schema.equals(first.schema):
            raise ValueError(
                f"a Mixture's Parquet datasets need the same columns: {first.output.location} has "
                f"{first.schema.names}, {source.output.location} has {source.schema.names} "
                "(select common ones with ShuffledDataset(..., columns=[...]))"
            )
