"""The seeded stratified interleave of a ``Mixture``: which source each position of the
endless mixed stream reads.

- Weights become whole numbers ``W_i`` with period ``Q = sum(W_i)``: exactly (as fractions)
  when their common denominator is at most ``MAX_PERIOD`` (0.7, 0.2, 0.1 -> 7, 2, 1), else
  rounded to multiples of 1 / ``ROUNDED_PERIOD`` (each source at least 1).
- The pattern is a Pfair schedule (Baruah et al. 1996) on one processor: source i's k-th record
  (from 1) may take a position from ``floor((k - 1) * Q / W_i)`` on and must take one before
  ``ceil(k * Q / W_i)``; each position goes to the released record with the earliest deadline,
  ties to a seeded priority among the sources. The shares sum to 1 and earliest-deadline-first
  is optimal on one processor, so every record meets its window: after ``Q`` positions every
  source has read exactly ``W_i`` records, the pattern repeats every ``Q`` positions, and any
  position's source, or any source's count up to a position, is computed alone.
- So every prefix of the stream holds each source's share to less than 1 record (the windows'
  definition), and every window of n positions to less than 2 (less than 1 with two sources;
  tests/test_mixture.py checks both over random weights); independent coin flips would be
  off by about ``sqrt(n * w * (1 - w))``.
"""

import functools
import math
import numbers
from fractions import Fraction

import numpy as np

from pileshuffle.records import keys as keymath

__all__ = ["MAX_PERIOD", "ROUNDED_PERIOD", "whole_weights", "Interleave"]

# exact weights up to this common denominator (a pattern of 65,536 is built in ~0.5 s)
MAX_PERIOD = 1 << 16
# otherwise weights are rounded to 1/65,536: far below any window's noise
ROUNDED_PERIOD = MAX_PERIOD
_PRIORITY_STREAM = 0x4D49585052  # "MIXPR"


def _shares(weights) -> list:
    """``weights`` (positive numbers) as exact fractions summing to 1."""
    fractions = []
    for index, weight in enumerate(weights):
        if (
            isinstance(weight, bool)
            or not isinstance(weight, numbers.Real)
            or not math.isfinite(weight)
            or not weight > 0
        ):
            raise ValueError(f"weights[{index}] must be a positive number, got {weight!r}")
        exact = (
            Fraction(weight) if isinstance(weight, numbers.Rational) else Fraction(float(weight))
        )
        # the fraction a float such as 0.7 was written as
        short = exact.limit_denominator(MAX_PERIOD)
        fractions.append(short if short and float(short) == float(weight) else exact)
    total = sum(fractions)
    return [f / total for f in fractions]


def whole_weights(weights) -> list:
    """The whole numbers ``W_i`` of the module docstring (their sum is the period)."""
    shares = _shares(weights)
    period = math.lcm(*(s.denominator for s in shares))
    if period <= MAX_PERIOD:
        return [int(s * period) for s in shares]
    scaled = [s * ROUNDED_PERIOD for s in shares]
    whole = [max(1, math.floor(s)) for s in scaled]
    by_remainder = sorted(range(len(shares)), key=lambda i: (whole[i] - scaled[i], i))
    for i in by_remainder[: max(0, ROUNDED_PERIOD - sum(whole))]:
        whole[i] += 1
    return whole


class Interleave:
    """The pattern of sources of a mixture of ``weights`` under ``seed`` (module docstring)."""

    def __init__(self, weights, seed: int):
        self.weights = whole_weights(weights)
        self.period = sum(self.weights)
        raw = keymath.record_keys(seed, (_PRIORITY_STREAM,), 0, len(self.weights))
        self.pattern = _pattern(tuple(self.weights), tuple(np.argsort(raw, kind="stable").tolist()))

    def sources(self, start: int, stop: int) -> np.ndarray:
        """The source of each position ``start .. stop-1`` of the stream."""
        return self.pattern[np.arange(start, stop, dtype=np.int64) % self.period]

    def count(self, source: int, n: int) -> int:
        """How many of the first ``n`` positions read ``source``."""
        laps, rest = divmod(int(n), self.period)
        return laps * self.weights[source] + int(np.count_nonzero(self.pattern[:rest] == source))

    def position_of(self, source: int, k: int) -> int:
        """The position of ``source``'s ``k``-th record (from 0)."""
        laps, rest = divmod(int(k), self.weights[source])
        return laps * self.period + int(np.flatnonzero(self.pattern == source)[rest])


@functools.lru_cache(maxsize=16)
def _pattern(weights: tuple, priority: tuple) -> np.ndarray:
    """One period of sources (module docstring); ``priority[i]`` breaks ties (higher first)."""
    count, period = len(weights), sum(weights)
    shares = np.array(weights, dtype=np.int64)
    tie = np.array(priority, dtype=np.int64)
    taken = np.zeros(count, dtype=np.int64)
    pattern = np.empty(period, dtype=np.uint8 if count <= 256 else np.uint32)
    for position in range(period):
        released = taken * period // shares <= position
        deadline = -((taken + 1) * period // -shares)  # ceil((taken + 1) * Q / W)
        rank = np.where(released, deadline * count - tie, np.iinfo(np.int64).max)
        source = int(np.argmin(rank))
        if not released[source]:
            # impossible: shares sum to 1
            raise AssertionError(f"no source released at position {position} of {weights}")
        taken[source] += 1
        pattern[position] = source
    pattern.flags.writeable = False
    return pattern
