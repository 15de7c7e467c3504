"""Seeded key derivation and pile arithmetic.

Every record gets a 64-bit uniform number U that is a pure function of
``(seed, stream, index)``: ``stream`` names where the record came from (an input
file, a pile being split again) and ``index`` is its position there. U comes from
numpy's counter-based Philox generator, one key per stream, so any slice of a
stream can be computed on its own and equals the same slice of the whole stream.

The pile of a record is the top digit of U in base M, ``floor(U * M / 2**64)``
(exact, in 64-bit halves), never ``U % M``. Pass 2 orders each pile by U, i.e. by
its remaining digits; together that is a sort of all records by a uniform random
number each, i.e. a uniform permutation.
"""

import math

import numpy as np

__all__ = ["stream_key", "record_keys", "pile_of", "group_by_pile", "auto_num_piles"]

_PHILOX_WORDS_PER_COUNTER = 4


def stream_key(seed: int, *stream: int) -> np.ndarray:
    """The 128-bit Philox key of one stream of ``seed``: two uint64 words."""
    entropy = [int(seed) & 0xFFFFFFFFFFFFFFFF, *(int(s) for s in stream)]
    return np.random.SeedSequence(entropy).generate_state(2, np.uint64)


def record_keys(seed: int, stream: tuple, start: int, count: int) -> np.ndarray:
    """U for records ``start .. start+count-1`` of ``stream``: uint64 array.

    Invariant: ``record_keys(s, t, a, n)[i] == record_keys(s, t, 0, a + n)[a + i]``.
    """
    counter = np.array([start // _PHILOX_WORDS_PER_COUNTER, 0, 0, 0], dtype=np.uint64)
    generator = np.random.Philox(key=stream_key(seed, *stream), counter=counter)
    skip = start % _PHILOX_WORDS_PER_COUNTER
    return generator.random_raw(skip + count)[skip:]


def pile_of(keys: np.ndarray, num_piles: int) -> np.ndarray:
    """The pile of each key: the top digits of U in base ``num_piles`` (int64 array)."""
    if not 1 <= num_piles < 2**31:
        raise ValueError(f"num_piles must be between 1 and 2**31-1, got {num_piles}")
    m = np.uint64(num_piles)
    high, low = keys >> np.uint64(32), keys & np.uint64(0xFFFFFFFF)
    # floor(U * M / 2**64) exactly: both partial products stay below 2**63 for M < 2**31
    return ((high * m + ((low * m) >> np.uint64(32))) >> np.uint64(32)).astype(np.int64)


def group_by_pile(piles: np.ndarray, num_piles: int):
    """Stable grouping: ``(order, bounds)`` so that ``order[bounds[p]:bounds[p+1]]``
    are the positions of pile ``p`` in their original order."""
    order = np.argsort(piles, kind="stable")
    bounds = np.searchsorted(piles[order], np.arange(num_piles + 1), side="left")
    return order, bounds


def _records_per_pile_limit(max_pile_records: float) -> float:
    """Largest mean pile size s with s + 6*sqrt(s) <= ``max_pile_records``."""
    if max_pile_records <= 0:
        return 0.0
    root = (-6 + math.sqrt(36 + 4 * max_pile_records)) / 2
    return root * root


def auto_num_piles(total_bytes: int, mean_record_bytes: float, max_pile_bytes: int) -> int:
    """Fewest piles whose expected largest pile (s + 6 sqrt(s) records) fits ``max_pile_bytes``."""
    mean_record_bytes = max(1.0, float(mean_record_bytes))
    total_records = max(1.0, total_bytes / mean_record_bytes)
    limit = _records_per_pile_limit(max_pile_bytes / mean_record_bytes)
    if limit < 1:
        return max(1, math.ceil(total_records))
    return max(1, math.ceil(total_records / limit))
