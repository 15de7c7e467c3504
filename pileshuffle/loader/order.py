"""The epoch order: one global sequence per epoch, a pure function of
``(piles' sizes, seed, epoch, mix, reshuffle)``.

With ``reshuffle``: the piles are visited in a seeded permutation; consecutive runs of
``mix`` visited piles form a *group*; a group's records (its piles' records one after
another, each pile in written order) are put in a seeded permutation of their own.
Without ``reshuffle``: piles 0..M-1, each in written order, in every epoch (groups of
one pile). Permutations sort counter-based uniform 64-bit keys (``keys.record_keys``
on loader streams keyed ``(seed, epoch[, mix, group])``), so any group's permutation is
computed alone, in O(group size), by any consumer; nothing depends on ranks or workers.

Each epoch alone is a uniform permutation when the piles are uniform random subsets
(which the 2-pass shuffle guarantees): a uniform order of uniform subsets.
"""

import dataclasses
import functools

import numpy as np

from pileshuffle import keys as keymath

_PILE_ORDER_STREAM = 0x4C4F41445049  # "LOADPI"
_GROUP_STREAM = 0x4C4F41444752  # "LOADGR"


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
    p's size. ``locate`` and ``positions`` give, per global position, the pile and the
    record's index in that pile's written order."""

    pile_records: tuple
    seed: int = 0
    epoch: int = 0
    mix: int = 1
    reshuffle: bool = True

    def __post_init__(self):
        if int(self.mix) < 1:
            raise ValueError(f"mix must be at least 1, got {self.mix}")

    @property
    def group_size(self) -> int:
        """Piles per group: ``mix`` when reshuffling, else 1."""
        return int(self.mix) if self.reshuffle else 1

    @functools.cached_property
    def pile_order(self) -> np.ndarray:
        """The piles in the order this epoch visits them."""
        count = len(self.pile_records)
        if not self.reshuffle:
            return np.arange(count, dtype=np.int64)
        keys = keymath.record_keys(self.seed, (_PILE_ORDER_STREAM, self.epoch, 0, 0), 0, count)
        return sort_by_key(keys).astype(np.int64)

    @functools.cached_property
    def group_starts(self) -> np.ndarray:
        """Global position where each group starts, plus N at the end."""
        sizes = np.asarray(self.pile_records, dtype=np.int64)[self.pile_order]
        piles_at = np.arange(0, len(sizes), self.group_size)
        per_group = np.add.reduceat(sizes, piles_at) if len(sizes) else np.zeros(0, np.int64)
        return np.concatenate(([0], np.cumsum(per_group))).astype(np.int64)

    @property
    def num_groups(self) -> int:
        return len(self.group_starts) - 1

    @property
    def total(self) -> int:
        return int(self.group_starts[-1])

    def group_piles(self, group: int) -> np.ndarray:
        """The piles of ``group``, in the order their records are concatenated."""
        return self.pile_order[group * self.group_size : (group + 1) * self.group_size]

    def group_permutation(self, group: int):
        """Indices into the group's concatenated records, in epoch order (None: identity)."""
        size = int(self.group_starts[group + 1] - self.group_starts[group])
        if not self.reshuffle:
            return None
        keys = keymath.record_keys(self.seed, (_GROUP_STREAM, self.epoch, self.mix, group), 0, size)
        return sort_by_key(keys).astype(np.int64)

    def group_of(self, positions) -> np.ndarray:
        return np.searchsorted(self.group_starts, positions, side="right") - 1

    def positions(self):
        """``(pile, index)`` arrays over the whole epoch: global position i holds record
        ``index[i]`` (in written order) of pile ``pile[i]``. For quality measurements;
        O(N) memory."""
        piles, indices = [], []
        records = np.asarray(self.pile_records, dtype=np.int64)
        for group in range(self.num_groups):
            members = self.group_piles(group)
            sizes = records[members]
            pile = np.repeat(members, sizes)
            index = np.arange(int(sizes.sum()), dtype=np.int64) - np.repeat(np.cumsum(sizes) - sizes, sizes)
            perm = self.group_permutation(group)
            if perm is not None:
                pile, index = pile[perm], index[perm]
            piles.append(pile)
            indices.append(index)
        if not piles:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        return np.concatenate(piles), np.concatenate(indices)


def epoch_order(pile_records, seed=0, epoch=0, mix=1, reshuffle=True):
    """``(pile, index in pile)`` per global position of one epoch (see ``EpochOrder``)."""
    return EpochOrder(tuple(int(r) for r in pile_records), int(seed), int(epoch), int(mix), bool(reshuffle)).positions()
