"""Pass 2 on groups of small piles: one join, one sort and one take for G neighbouring piles.

At many piles a pile is small (1 GB in 4,096 piles: 240 kB; 10 TB in 10,000 piles has the same parts
per pile), and pass 2's fixed work per pile (an element through the GroupByKey, a join of its parts,
a sort, a take, each a call that hands the interpreter lock over) costs more than its records. The
template therefore has pass 1 write one segment per (run, group of G neighbouring piles)
(``group_size``; ``runs``, ``GroupSegment``), keyed ``pile // G``, and pass 2 puts a whole group in
order at once, reading each segment once, then cuts it at the piles' bounds: each pile still becomes
one shard. The order is the piles' own: the piles are ranges of U, so a stable sort of the group's
records on U (its piles' parts one after another, each pile's in canonical order) orders them pile
by pile, and within a pile exactly as ``Pile.ordered`` does.

A pile that needs more (one split again past ``--max_pile_bytes``, or one under ``--dedup``) is
written alone, as without groups, from its views of the segments; the group's other piles are
then read from their views too (each segment read once per pile: rare, as a group holds no more
than ``--max_pile_bytes`` on average). Measured: ``bench/small_piles.py``.
"""

import dataclasses
import itertools

import numpy as np
import pyarrow as pa

from pileshuffle.engine import memory_runs
from pileshuffle.engine.fragments import read_joined
from pileshuffle.names import KEY_COLUMN
from pileshuffle.records import keys as keymath

__all__ = [
    "GROUP_BYTES",
    "MAX_GROUP",
    "PileGroup",
    "group_size",
    "group_words",
    "in_key_order",
    "template_group",
]

GROUP_BYTES = 16 << 20  # a group holds about this many bytes of piles
MAX_GROUP = 256  # and at most this many piles


def group_size(pile_bytes: float, max_pile_bytes: int) -> int:
    """Piles per group for piles of about ``pile_bytes`` held: 1 (no groups) for piles of 1 MiB or
    more; a group holds no more than ``GROUP_BYTES`` nor ``--max_pile_bytes`` (pass 2's bound)."""
    if pile_bytes >= 1 << 20:
        return 1
    return int(max(1, min(MAX_GROUP, min(GROUP_BYTES, max_pile_bytes) // max(1, int(pile_bytes)))))


def template_group(plan) -> int:
    """The template's piles per group (``group_size`` of the plan's mean pile, at most every pile);
    none under ``--dedup``."""
    return (
        1
        if plan.dedup
        else min(plan.num_piles, group_size(plan.held_bytes / plan.num_piles, plan.max_pile_bytes))
    )


def group_words(group: int) -> str:
    """What pass 2 holds at once, in ``plan``'s words."""
    return "per pile" if group == 1 else f"per group of {group} piles"


def in_key_order(fragments) -> tuple:
    """``(records, keys, order)`` of ``fragments`` joined in the order given: the records without
    their key column, their keys U, and the stable order on U (ties keep the given order). The
    one ordering rule of pass 2, for a pile (``Pile.ordered``) and a group alike."""
    table = _joined(fragments)
    keys = table.column(KEY_COLUMN).to_numpy()
    return table.drop_columns([KEY_COLUMN]), keys, keymath.key_order(keys)


def _joined(fragments) -> pa.Table:
    """``read_joined`` of ``fragments``, but a part of a run kept in this process's memory is
    the records pass 1 made (``memory_runs.records``): no IPC between the passes."""
    parts, tables = [(f, _kept_rows(f)) for f in fragments], []
    for in_memory, run in itertools.groupby(parts, key=lambda part: part[1] is not None):
        run = list(run)
        if in_memory:
            tables.extend(
                pa.Table.from_batches([kept]) if isinstance(kept, pa.RecordBatch) else kept
                for _, kept in run
            )
        else:
            tables.append(read_joined([fragment for fragment, _ in run]))
    return tables[0] if len(tables) == 1 else pa.concat_tables(tables)


def _kept_rows(fragment):
    """The fragment's rows of a segment kept in memory (``memory_runs``), a table or a record
    batch; or None."""
    if fragment.payload is not None or fragment.length is None:
        return None
    kept = memory_runs.records(fragment.path, fragment.offset)
    if kept is None or fragment.rows is None:
        return kept
    return kept.slice(fragment.rows[0], fragment.records)


def _written_alone(pile) -> bool:
    """A pile ``Pile.ordered`` writes by itself: split again, deduplicated, or of one key."""
    return pile.needs_split or pile.dedup is not None or pile.single_key


@dataclasses.dataclass(frozen=True)
class PileGroup:
    """Neighbouring piles (``Pile``, in pile order) written by one pass-2 element; ``segments``: the
    group's segments (``GroupSegment.fragment``) in canonical order, which the piles' fragments
    are views of (empty: the piles' own fragments are read)."""

    piles: tuple
    segments: tuple = ()

    def alone(self) -> list:
        """The piles that are written one by one (``Pile.ordered``): split again, deduplicated,
        or of one key."""
        return [p for p in self.piles if _written_alone(p)]

    def ordered(self):
        """``(pile, table)`` for every other pile with records: its records in final order, each
        with its pass-1 hash, cut from the group's one sorted table."""
        together = [p for p in self.piles if not _written_alone(p) and p.fragments]
        if not together:
            return
        # else a pile alone is not loaded again
        whole = self.segments and len(together) == len(self.piles)
        records, keys, order = in_key_order(
            self.segments if whole else [f for p in together for f in p.fragments]
        )
        records = records.take(order)
        piles, wanted = (
            keymath.pile_of(keys[order], together[0].num_piles),
            [p.index for p in together],
        )
        starts, stops = (
            np.searchsorted(piles, wanted, "left"),
            np.searchsorted(piles, wanted, "right"),
        )
        for pile, start, stop in zip(together, starts.tolist(), stops.tolist()):
            yield pile, records.slice(start, stop - start)
