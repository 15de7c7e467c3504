"""An epoch's steps as Blocks, each pile loaded once per stretch of steps that read it.

``Steps(output, order)`` is called with the steps a consumer reads, in order, and gives
each step's records in epoch order as one Block (bytes formats: views over the piles'
buffers; Parquet: the piles' tables and the rows to take from them, which the reader
gathers a piece at a time).

Invariant: after the call for step t it holds the piles step t read except the one whose
last slice that was (at most ``width - 1``), and it drops piles before loading one; so
while a reader holds step t (its ``width`` piles) and this object builds step t + 1 (one
new pile), at most ``width + 1`` piles are loaded.
"""

import pyarrow as pa

from pileshuffle.loader.block import Block

__all__ = ["Steps", "ranks_loaded", "load_step", "stepped_blocks"]


class Steps:
    """A callable: ``steps(t)`` is step t's Block; call it with steps in increasing order
    (see the module docstring for which piles it holds)."""

    def __init__(self, output, order):
        self._piles, self._order = output.piles, order
        self._loaded = {}  # rank -> the pile's Block, its records in their permuted order
        self._decoded = output.decoded

    def __call__(self, step: int) -> Block:
        ranks = self._order.step_ranks(step)
        for rank in [r for r in self._loaded if r not in ranks]:
            del self._loaded[rank]
        for rank in ranks:
            if rank not in self._loaded:
                # Parquet: first return the freed piles' pages (Arrow's pool keeps them)
                if self._decoded:
                    pa.default_memory_pool().release_unused()
                self._loaded[rank] = self._load(rank)
        block = Block.interleave(
            [self._loaded[r].part(*self._order.slice_bounds(r, step)) for r in ranks],
            self._order.step_places(step),
        )
        # its last slice: no later step reads it
        self._loaded.pop(step - self._order.width + 1, None)
        return block

    def _load(self, rank: int) -> Block:
        pile = self._piles[int(self._order.pile_order[rank])]
        return pile.load(order=self._order.pile_permutation(rank))


def ranks_loaded(order, steps) -> list:
    """The pile ranks ``Steps`` loads, in order, for this sequence of steps."""
    loaded, out = set(), []
    for step in steps:
        ranks = order.step_ranks(step)
        loaded &= set(ranks)
        out += [r for r in ranks if r not in loaded]
        loaded |= set(ranks)
        loaded.discard(step - order.width + 1)
    return out


def load_step(planned: tuple) -> tuple:
    """``(block, pieces)`` of a planned step ``(load, pieces)``: its Block built."""
    load, pieces = planned
    return load(), pieces


def stepped_blocks(loaded, decoded: bool):
    """The pieces of each loaded step ``(block, pieces)`` of ``loaded``, in order, as Blocks;
    ``decoded`` (Parquet): each step's pages go back to Arrow's pool once its pieces are read."""
    for block, pieces in loaded:
        for lo, hi in pieces:
            yield block.part(lo, hi)
        del block
        if decoded:
            pa.default_memory_pool().release_unused()
