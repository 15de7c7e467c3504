"""The sizes of a plan's piles, as ``plan`` shows them: each record lands in one of M piles
at random, so a pile's records are Binomial(records, 1/M). From that, the expected pile, the
headroom ``--num_piles auto`` plans for (s + 6 sqrt(s)) and the chance that some pile exceeds
``--max_pile_bytes`` and is split again."""

import dataclasses
import math

from pileshuffle.planning.input_size import RECORD_OVERHEAD

__all__ = ["PileSizes", "pile_sizes"]


@dataclasses.dataclass(frozen=True)
class PileSizes:
    """Pile sizes of a plan: records per pile are Binomial(records, 1/M)."""

    records: int
    num_piles: int
    record_bytes: float  # per record in a pile, payload and overhead
    max_pile_bytes: int

    @property
    def expected(self) -> float:
        return self.records / self.num_piles

    @property
    def headroom(self) -> float:
        """s + 6 sqrt(s): what auto sizing plans for."""
        return self.expected + 6 * math.sqrt(self.expected)

    @property
    def split_probability(self) -> float:
        """Probability that some pile holds more than ``max_pile_bytes`` (and is split again),
        by the normal approximation of each pile's binomial size."""
        limit = self.max_pile_bytes / self.record_bytes
        if self.num_piles == 1:
            return float(self.records > limit)
        variance = self.expected * (1 - 1 / self.num_piles)
        one = 0.5 * math.erfc((limit - self.expected) / math.sqrt(2 * variance))
        return 1.0 if one >= 1 else -math.expm1(self.num_piles * math.log1p(-one))


def pile_sizes(plan) -> PileSizes:
    """The ``PileSizes`` of a ``plan.Plan``: the records it writes, with their keys and hashes."""
    return PileSizes(
        plan.written_records,
        plan.num_piles,
        plan.mean_record_bytes + RECORD_OVERHEAD,
        plan.max_pile_bytes,
    )
