"""The epoch order: one global sequence per epoch, a pure function of
``(piles' sizes, seed, epoch, mix, reshuffle)``.

With ``reshuffle`` and ``mix = K``, a sliding window of K piles:
- the piles are *ranked* in a seeded permutation; pile rank j's records are put in a
  seeded permutation of their own and cut into K *slices* of equal size (sizes differ
  by at most one, the first slices larger);
- the epoch is a run of *steps* t = 0 .. M+K-2; step t holds slice t-j of every pile
  rank j with t-K < j <= t, the slices interleaved in a seeded uniform way (each
  slice's records keep their order).
So pile rank j is read over steps j .. j+K-1, about K piles' worth of the stream, and
at any point at most K piles are being read: a reader holds K piles plus the next one.
``mix = 1`` reads the ranked piles one after another, each in its permutation.
Without ``reshuffle``: piles 0..M-1, each in written order, in every epoch.

Permutations sort counter-based uniform 64-bit keys (``keys.record_keys`` on loader
streams keyed ``(seed, epoch, mix, rank or step)``), so any pile's or step's order is
computed alone, by any consumer; nothing depends on ranks or workers.

Each epoch alone is a uniform permutation when the piles are uniform random subsets
(which the 2-pass shuffle guarantees): every pile's records go, in a uniform order, to
a set of positions chosen without looking at them.
"""

import dataclasses
import functools

import numpy as np

from pileshuffle.records import keys as keymath

__all__ = ["sort_by_key", "EpochOrder", "epoch_order"]

_PILE_ORDER_STREAM = 0x4C4F41445049  # "LOADPI"
_WITHIN_PILE_STREAM = 0x4C4F41444752  # "LOADGR"
_STEP_STREAM = 0x4C4F41445354  # "LOADST"


def sort_by_key(keys: np.ndarray) -> np.ndarray:
    """``np.argsort(keys, kind="stable")``, fast: an unstable sort (several times faster
    for uint64), kept when no two keys are equal, which is then the same result."""
    order = np.argsort(keys)
    ordered = keys[order]
    if len(keys) > 1 and (ordered[1:] == ordered[:-1]).any():
        return np.argsort(keys, kind="stable")
    return order


@dataclasses.dataclass(frozen=True)
class EpochOrder:
    """The order of one epoch. Positions are global (0..N-1); ``pile_records[p]`` is pile
    p's size. Piles are named by index (``pile_order[rank]``) or by rank in this epoch."""

    pile_records: tuple
    seed: int = 0
    epoch: int = 0
    mix: int = 1
    reshuffle: bool = True

    def __post_init__(self):
        if int(self.mix) < 1:
            raise ValueError(f"mix must be at least 1, got {self.mix}")

    @property
    def width(self) -> int:
        """Piles read at once: ``mix`` when reshuffling, else 1."""
        return int(self.mix) if self.reshuffle else 1

    @functools.cached_property
    def pile_order(self) -> np.ndarray:
        """The pile index of each rank."""
        count = len(self.pile_records)
        if not self.reshuffle:
            return np.arange(count, dtype=np.int64)
        keys = keymath.record_keys(self.seed, (_PILE_ORDER_STREAM, self.epoch, 0, 0), 0, count)
        return sort_by_key(keys).astype(np.int64)

    @functools.cached_property
    def slice_starts(self) -> np.ndarray:
        """``(M, K + 1)``: where each slice of pile rank j starts in its permuted records."""
        sizes = np.asarray(self.pile_records, dtype=np.int64)[self.pile_order]
        width = self.width
        counts = sizes[:, None] // width + (np.arange(width) < sizes[:, None] % width)
        return np.concatenate(
            (np.zeros((len(sizes), 1), np.int64), np.cumsum(counts, axis=1)), axis=1
        )

    @functools.cached_property
    def step_starts(self) -> np.ndarray:
        """Global position where each step starts, plus N at the end."""
        counts = np.diff(self.slice_starts, axis=1)
        steps = (np.arange(len(counts))[:, None] + np.arange(self.width)).ravel()
        sizes = np.bincount(steps, weights=counts.ravel(), minlength=self.num_steps).astype(
            np.int64
        )
        return np.concatenate(([0], np.cumsum(sizes))).astype(np.int64)

    @property
    def num_steps(self) -> int:
        count = len(self.pile_records)
        return count + self.width - 1 if count else 0

    @property
    def total(self) -> int:
        return int(self.step_starts[-1])

    def step_of(self, positions) -> np.ndarray:
        return np.searchsorted(self.step_starts, positions, side="right") - 1

    def step_ranks(self, step: int) -> range:
        """The pile ranks step ``step`` reads (slice ``step - rank`` of each), ascending."""
        return range(max(0, step - self.width + 1), min(step, len(self.pile_records) - 1) + 1)

    def slice_bounds(self, rank: int, step: int) -> tuple:
        """``(lo, hi)``: the records of pile ``rank`` (in its permuted order) read in ``step``."""
        s = step - rank
        return int(self.slice_starts[rank, s]), int(self.slice_starts[rank, s + 1])

    def pile_permutation(self, rank: int):
        """Indices into pile ``rank``'s written order, in the order it is read (None: as
        written)."""
        if not self.reshuffle:
            return None
        size = int(self.slice_starts[rank, -1])
        keys = keymath.record_keys(
            self.seed, (_WITHIN_PILE_STREAM, self.epoch, self.mix, rank), 0, size
        )
        return sort_by_key(keys).astype(np.int64)

    def step_places(self, step: int):
        """Where in the step each record of its slices (one after another, ascending rank)
        goes: a uniform interleaving in which each slice keeps its order. None when the
        step reads one slice (or none): the slice in its order."""
        ranks = self.step_ranks(step)
        sizes = [b - a for a, b in (self.slice_bounds(rank, step) for rank in ranks)]
        if sum(1 for size in sizes if size) <= 1:
            return None
        keys = keymath.record_keys(
            self.seed, (_STEP_STREAM, self.epoch, self.mix, step), 0, sum(sizes)
        )
        labels = np.repeat(np.arange(len(sizes), dtype=np.uint16), sizes)[sort_by_key(keys)]
        # a slice's records, in order, take its label's places
        return np.argsort(labels, kind="stable")

    def positions(self):
        """``(pile, index)`` arrays over the whole epoch: global position i holds record
        ``index[i]`` (in written order) of pile ``pile[i]``. For quality measurements;
        O(N) memory."""
        permutations = [self.pile_permutation(rank) for rank in range(len(self.pile_records))]
        piles, indices = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]
        for step in range(self.num_steps):
            pile, index = [], []
            for rank in self.step_ranks(step):
                lo, hi = self.slice_bounds(rank, step)
                pile.append(np.full(hi - lo, self.pile_order[rank], np.int64))
                written = np.arange(lo, hi, dtype=np.int64)
                index.append(written if permutations[rank] is None else permutations[rank][lo:hi])
            pile, index = np.concatenate(pile), np.concatenate(index)
            places = self.step_places(step)
            if places is not None:
                pile[places], index[places] = pile.copy(), index.copy()
            piles.append(pile)
            indices.append(index)
        return np.concatenate(piles), np.concatenate(indices)


def epoch_order(pile_records, seed=0, epoch=0, mix=1, reshuffle=True):
    """``(pile, index in pile)`` per global position of one epoch (see ``EpochOrder``)."""
    return EpochOrder(
        tuple(int(r) for r in pile_records), int(seed), int(epoch), int(mix), bool(reshuffle)
    ).positions()
