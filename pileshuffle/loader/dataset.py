"""ShuffledDataset: a finished output read back for training, reshuffled every epoch.

Invariants (epochs, splits, passes and states: ``loader.consumer``):
- An epoch is one global sequence (``order.EpochOrder``), a pure function of
  ``(output, seed, epoch, mix, reshuffle)``; a consumer only loads the piles its ranges read.
- The next step of the epoch is built on a background thread while the current one is
  read (``steps.Steps``): with ``mix=K``, at most K + 1 piles are loaded at once, plus
  the batch being built.
"""

import functools

import pyarrow as pa

from pileshuffle.loader import split
from pileshuffle.loader.arguments import (
    check_world_size,
    checked_columns,
    describe_identity,
    whole_number,
)
from pileshuffle.loader.batching import cut_at_steps, gathered
from pileshuffle.loader.cache import DEFAULT_LIMIT, PileCache
from pileshuffle.loader.consumer import STATE_FORMAT, Consumer
from pileshuffle.loader.order import EpochOrder
from pileshuffle.loader.outputs import open_output, store_version_of
from pileshuffle.loader.prefetch import prefetched
from pileshuffle.loader.steps import Steps, load_step, ranks_loaded, stepped_blocks

__all__ = ["STATE_FORMAT", "ShuffledDataset"]


class ShuffledDataset(Consumer):
    """The records of a finished output (shards or a pile store) in a seeded order per epoch.

    ``path``: an output prefix, ``{P}-manifest.json``, ``{P}-store`` or a store manifest.
    ``iter(ds)`` yields ``bytes`` (TFRecord payloads, JSONL lines without the newline)
    or ``dict`` rows (Parquet); ``ds.batches(n)`` yields batches. See docs/loader.md.

    ``cache_dir``: a local folder keeping the files of piles loaded from a remote output (gs://,
    s3://) for later epochs, shared safely by a host's processes (DataLoader workers); None (the
    default): no cache; local outputs are read in place. ``cache_limit``: bytes the folder may
    hold, least recently used evicted first: an int, or a string such as ``"50GB"``, ``"500MB"``
    (decimal: 1 GB = 10**9 bytes; ``GiB`` = 2**30); a larger file is read uncached. The cache
    never changes the records, their order or a state.
    """

    def __init__(
        self,
        path,
        *,
        seed=0,
        epoch=0,
        reshuffle=True,
        mix=1,
        rank=0,
        world_size=1,
        columns=None,
        remainder="drop",
        prefetch=True,
        filesystem=None,
        cache_dir=None,
        cache_limit=DEFAULT_LIMIT,
    ):
        super().__init__(
            seed=seed, rank=rank, world_size=world_size, remainder=remainder, prefetch=prefetch
        )
        self.mix, self.reshuffle = whole_number("mix", mix, 1), bool(reshuffle)
        epoch = whole_number("epoch", epoch, 0)
        cache = PileCache.of(cache_dir, cache_limit)
        self.output = open_output(str(path), filesystem, checked_columns(columns), cache)
        if columns is not None and self.format != "parquet":
            raise ValueError(
                f"columns={list(columns)!r}: {self.output.location} holds {self.format} records, "
                "which have no columns (columns= selects Parquet columns)"
            )
        self._pile_records = tuple(p.records for p in self.output.piles)
        check_world_size(self.output.records, self.output.location, self.world_size, remainder)
        self._start_epoch(epoch)

    # --- what it is -------------------------------------------------------------
    @property
    def format(self) -> str:
        return self.output.format

    @property
    def schema(self) -> pa.Schema:
        return self.output.schema

    @property
    def order(self) -> EpochOrder:
        """This epoch's global order (``order.positions()`` gives it as arrays)."""
        return self._order

    def __repr__(self):
        return (
            f"ShuffledDataset({self.output.location!r}, {self.format}, {len(self.output.piles)} "
            f"piles, seed={self.seed}, epoch={self.epoch}, mix={self.mix}, "
            f"reshuffle={self.reshuffle}, {self._where()}, {len(self)} records, position "
            f"{self._position})"
        )

    # --- what a Consumer asks ----------------------------------------------------
    @property
    def outputs(self) -> tuple:
        """The outputs read (one)."""
        return (self.output,)

    def _order_of(self, epoch: int) -> EpochOrder:
        return EpochOrder(self._pile_records, self.seed, epoch, self.mix, self.reshuffle)

    def _identity(self) -> dict:
        return {
            "dataset": self.output.identity,
            "seed": self.seed,
            "mix": self.mix,
            "reshuffle": self.reshuffle,
        }

    def _check_identity(self, state: dict):
        if state["dataset"] != self.output.identity:
            version = (
                store_version_of(self.output, state["dataset"])
                if self.output.kind == "store"
                else None
            )
            hint = (
                "; the store version it was saved on is still readable: "
                f"ShuffledDataset({version!r})"
                if version
                else ""
            )
            raise ValueError(
                f"the state is of another output ({describe_identity(state['dataset'])}), not of "
                f"{self.output.location} ({describe_identity(self.output.identity)}): a re-run "
                "with another seed or number of piles, or a store changed since, is another "
                f"order, and the state's position in it means nothing here{hint}"
            )
        for name in ("seed", "mix", "reshuffle"):
            if state[name] != getattr(self, name):
                raise ValueError(
                    f"the state has {name}={state[name]!r} but the dataset "
                    f"{name}={getattr(self, name)!r}"
                )

    # --- reading ----------------------------------------------------------------
    def _read(self, ranges, step):
        """Tables of this epoch's ``ranges``, in order, cut at multiples of ``step`` records
        (a batch is one piece except where it straddles two steps); reshuffled Parquet rows
        are gathered ``TAKE_ROWS`` at a time (never a copy of a whole step)."""
        return cut_at_steps(gathered(self._blocks(ranges)), step)

    def _blocks(self, ranges):
        """This epoch's ``ranges`` as Blocks over the loaded piles (nothing copied), in order;
        each step is built on the prefetch thread while the one before is read."""
        loads = [planned[1:] for planned in self._step_loads(ranges)]
        yield from stepped_blocks(
            prefetched(loads, load_step) if self.prefetch else map(load_step, loads),
            self.output.decoded,
        )

    def _step_loads(self, ranges) -> list:
        """``[(first, load, pieces), ...]``: the steps ``ranges`` read, in order, each as the
        epoch position of its first record read, a function building it (``steps.Steps``: call
        them in order) and its pieces (``_plan``)."""
        steps, starts = Steps(self.output, self._order), self._order.step_starts
        return [
            (int(starts[step]) + pieces[0][0], functools.partial(steps, step), pieces)
            for step, pieces in self._plan(ranges)
        ]

    def _plan(self, ranges) -> list:
        """``[(step, [(lo, hi), ...]), ...]``: the steps to read, in order, and the
        pieces of each (positions within the step) to read."""
        starts = self._order.step_starts
        plan = []
        for a, b in ranges:
            step = int(self._order.step_of(a))
            while a < b:
                while starts[step + 1] <= a:
                    step += 1
                hi = min(b, int(starts[step + 1]))
                piece = (a - int(starts[step]), hi - int(starts[step]))
                if plan and plan[-1][0] == step:
                    plan[-1][1].append(piece)
                else:
                    plan.append((step, [piece]))
                a = hi
        return plan

    def piles_to_load(self) -> list:
        """The piles (indices) the next iteration loads, in order: with ``mix=K``, its
        share plus at most K + 1 piles per range (the partial windows at either end)."""
        upcoming = self._next_pass()
        steps = [
            step
            for step, _ in upcoming._plan(split.tail(upcoming._ranges, upcoming._resume_at or 0))
        ]
        return [int(upcoming._order.pile_order[r]) for r in ranks_loaded(upcoming._order, steps)]
