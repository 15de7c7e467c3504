"""Pile: one pile's records put in their pass-2 order, in memory, with no runner involved.

A pile's records are put in order by their key U (stable over the canonical fragment
order). Every key of a pile shares the same top digits, so this sorts on the rest of
U: the whole output is the input sorted by U, a uniform permutation.

A pile larger than ``max_pile_bytes`` is never loaded whole: it is split again on the
next digits of U (``U * M mod 2**64``) into sub-piles written as fragments, and the
sub-piles are ordered one after another; the order is the same as without the split.
Pass 2 (``transforms.shuffle``) makes Piles; ``verify`` and the pile store read them back.
"""

import dataclasses
import math
import uuid

import numpy as np
import pyarrow as pa

from pileshuffle.engine.duplicates import distinct_in_order, stream_distinct
from pileshuffle.engine.fragments import Fragment, FragmentFiles, read_batches
from pileshuffle.engine.pile_groups import in_key_order
from pileshuffle.formats import record_lengths
from pileshuffle.formats.base import parts_by_pile
from pileshuffle.io import storage
from pileshuffle.names import HASH_COLUMN, KEY_COLUMN, split_writer_name
from pileshuffle.records import keys as keymath
from pileshuffle.records.fingerprint import Fingerprint, total

__all__ = ["DEFAULT_MAX_PILE_BYTES", "MAX_SPLIT_WAYS", "Pile"]

# the most of one pile pass 2 holds in memory; a larger pile is split (files mode)
DEFAULT_MAX_PILE_BYTES = 64 << 20
_OUTPUT_SLICE_BYTES = 8 << 20  # about this many bytes per ordered table a pile yields
# splits of splits stop here: records that share one key cannot be split apart
_MAX_SPLIT_DEPTH = 16
MAX_SPLIT_WAYS = 1024  # larger sub-piles are split again


def _next_digits(keys: np.ndarray, num_piles: int) -> np.ndarray:
    """The digits of U after its top base-``num_piles`` digit: ``U * M mod 2**64``."""
    with np.errstate(over="ignore"):
        return keys * np.uint64(num_piles)


@dataclasses.dataclass(frozen=True)
class Pile:
    """One pile: its fragments in canonical order, and how to put its records in order.

    ``tables()`` yields the pile's records in their final order as Arrow tables, holding at
    most one pile (or one sub-pile of a split pile) in memory. ``depth`` counts splits.
    """

    index: int
    num_piles: int
    fragments: tuple
    max_pile_bytes: int = DEFAULT_MAX_PILE_BYTES
    work_dir: str = None
    depth: int = 0
    # a dedup.Dedup: records with equal content keep only the first (pileshuffle.engine.dedup)
    dedup: object = None
    single_key: bool = False  # every record has one key: under dedup, streamed (never loaded whole)

    @property
    def records(self) -> int:
        return sum(f.records for f in self.fragments)

    @property
    def nbytes(self) -> int:
        return sum(f.nbytes for f in self.fragments)

    @property
    def fingerprint(self):
        """What pass 1 put into this pile."""
        return total(f.fingerprint for f in self.fragments)

    @property
    def needs_split(self) -> bool:
        """Larger than ``max_pile_bytes`` and splittable. The depth bound stops endless
        splitting of records that share one key (keyed composed use with duplicate ids):
        such a sub-pile is loaded whole instead."""
        return (
            self.nbytes > self.max_pile_bytes
            and self.work_dir is not None
            and self.records > 1
            and self.depth < _MAX_SPLIT_DEPTH
        )

    def tables(self):
        """Yield the records in final order, as the user's columns only."""
        for table in self.ordered():
            yield table.drop_columns([HASH_COLUMN])

    def ordered(self, dropped=None):
        """Yield the records in final order, each with its pass-1 hash (``HASH_COLUMN``). Under
        ``dedup`` only the first of each content; ``dropped`` (a ``duplicates.Dropped``) counts the
        rest."""
        if self.dedup is not None and self.single_key:
            batches = (
                pa.Table.from_batches([b]).drop_columns([KEY_COLUMN])
                for f in self.fragments
                for b in read_batches(f)
            )
            yield from stream_distinct(batches, _records_of, self.dedup, dropped)
            return
        if self.needs_split:
            for sub_pile in self.split():
                yield from sub_pile.ordered(dropped)
            return
        if not self.fragments:
            return
        records, keys, order = in_key_order(self.fragments)
        # (Table.nbytes: 0.1 ms a pile)
        step = max(1, int(_OUTPUT_SLICE_BYTES * len(order) / max(1, self.nbytes)))
        # a take from parts joins them anew every time: join once
        if self.dedup is not None or step < len(order):
            records = records.combine_chunks()
        if self.dedup is not None:
            user, hashes, lengths = _records_of(records)
            order = order[
                distinct_in_order(
                    user, order, keys[order], hashes[order], lengths[order], self.dedup, dropped
                )
            ]
        for start in range(0, len(order), step):
            yield records.take(order[start : start + step])

    def split(self):
        """The sub-piles of this pile, in order: fragments re-keyed on the next digits of U."""
        # one open file each
        ways = min(MAX_SPLIT_WAYS, max(2, math.ceil(self.nbytes / self.max_pile_bytes) * 2))
        split_dir = storage.join(self.work_dir, "splits")
        files = FragmentFiles(
            split_dir, split_writer_name(uuid.uuid4().hex[:12], self.depth, self.index)
        )
        # sub-pile -> (lowest, highest) key: one key alone is one record repeated, under dedup
        key_range = {}
        for fragment in self.fragments:
            for batch in read_batches(fragment):
                digits = _next_digits(batch.column(KEY_COLUMN).to_numpy(), self.num_piles)
                table = pa.Table.from_batches([batch]).set_column(
                    batch.schema.get_field_index(KEY_COLUMN),
                    KEY_COLUMN,
                    pa.array(digits, type=pa.uint64()),
                )
                for sub, part, rows in parts_by_pile(table, keymath.pile_of(digits, ways), ways):
                    files.append(sub, part, Fingerprint())
                    low, high = key_range.get(sub, (digits[rows[0]], digits[rows[0]]))
                    key_range[sub] = (min(low, digits[rows].min()), max(high, digits[rows].max()))
        for sub in files.commit():
            fragment = Fragment((0,), sub.records, sub.nbytes, Fingerprint(), path=sub.path)
            low, high = key_range[sub.pile]
            yield Pile(
                sub.pile,
                ways,
                (fragment,),
                self.max_pile_bytes,
                self.work_dir,
                self.depth + 1,
                self.dedup,
                bool(low == high),
            )

    def split_count(self) -> int:
        return 1 if self.needs_split else 0


def _records_of(table: pa.Table) -> tuple:
    """``(records, hashes, lengths)`` of a table of records with their ``HASH_COLUMN``."""
    records = table.drop_columns([HASH_COLUMN])
    return records, table.column(HASH_COLUMN).to_numpy(), record_lengths(records)
