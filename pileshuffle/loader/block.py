"""``Block``: records in an order, reordered and cut without copying their bytes.

A bytes format's block is binary views (16 bytes a record) over the buffers the records were
read into: reordering moves views, never payloads. A Parquet block is single-chunk tables one
after another and ``rows``, the records in order as indices into them: reordering composes
``rows``, and only ``slice`` gathers values (``loader.gather``), each copied once.
"""

import dataclasses

import numpy as np
import pyarrow as pa

from pileshuffle.formats.views import VIEW_ITEM, shift_buffers, value_views, view_array
from pileshuffle.loader.gather import gather
from pileshuffle.names import RECORD_COLUMN
from pileshuffle.records.fingerprint import binary_column_parts

__all__ = ["Block"]


@dataclasses.dataclass(frozen=True)
class Block:
    """Records in an order. Bytes formats: binary views over ``buffers`` (reordering
    moves 16-byte views, never payloads). Parquet: single-chunk tables one after
    another (one per pile) and ``rows``, the records in order as indices into them
    (None: all of them, in order); reordering only composes ``rows``, and ``slice``
    gathers them (``loader.gather``: each value copied once). The same table objects
    are kept from load to gather (``gather`` keeps each pile's views while it lives).
    ``slice`` gives a ``pyarrow.Table``; ``part``/``reorder`` give Blocks."""

    views: np.ndarray = None
    buffers: tuple = ()
    tables: tuple = None
    rows: np.ndarray = None

    @property
    def num_rows(self) -> int:
        if self.tables is None:
            return len(self.views)
        return len(self.rows) if self.rows is not None else sum(t.num_rows for t in self.tables)

    def _table_rows(self, indices: np.ndarray) -> np.ndarray:
        return indices if self.rows is None else self.rows[indices]

    def slice(self, start: int, stop: int) -> pa.Table:
        if self.tables is None:
            return pa.table({RECORD_COLUMN: view_array(self.views[start:stop], self.buffers)})
        if self.rows is not None:
            return gather(self.tables, self.rows[start:stop])
        parts, offset = [], 0
        for table in self.tables:
            lo, hi = max(start, offset), min(stop, offset + table.num_rows)
            if lo < hi or not parts and table is self.tables[-1]:
                parts.append(table.slice(lo - offset, max(0, hi - lo)))
            offset += table.num_rows
        return parts[0] if len(parts) == 1 else pa.concat_tables(parts)

    def part(self, start: int, stop: int) -> "Block":
        """Records ``start .. stop-1`` (no data copied)."""
        if self.tables is None:
            return Block(self.views[start:stop], self.buffers)
        if self.rows is None and len(self.tables) == 1:
            return Block(tables=(self.tables[0].slice(start, stop - start),))
        if self.rows is not None:
            # a view: a Mixture takes parts again and again
            return Block(tables=self.tables, rows=self.rows[start:stop])
        return Block(tables=self.tables, rows=np.arange(start, stop, dtype=np.int64))

    def compact(self) -> "Block":
        """The same records copied into one new buffer (Parquet: one new table):
        nothing refers to the old buffers."""
        if self.tables is not None:
            return Block(tables=(self.slice(0, self.num_rows).combine_chunks(),))
        if not len(self.views):
            return self
        array = view_array(self.views, self.buffers)
        size = int(self.views[:, :4].copy().view("<i4").astype(np.int64).sum())
        values, offsets = binary_column_parts(
            array.cast(pa.binary() if size < 2**31 else pa.large_binary())
        )
        return Block(value_views(values, offsets), (values,))

    def reorder(self, indices: np.ndarray) -> "Block":
        if self.tables is None:
            # 10x views[indices] on (n, 16)
            return Block(np.take(self.views, indices, axis=0), self.buffers)
        return Block(tables=self.tables, rows=self._table_rows(np.asarray(indices, np.int64)))

    @staticmethod
    def of_table(table: pa.Table) -> "Block":
        """The records of a table ``slice`` made, as a Block again (bytes formats: the
        binary views and their buffers, no data copied)."""
        if not pa.types.is_binary_view(table.schema.field(0).type):
            return Block(tables=(table,))
        chunks = [
            Block(
                np.frombuffer(array.buffers()[1], np.uint8).reshape(-1, 16)[array.offset :][
                    : len(array)
                ],
                tuple(array.buffers()[2:]),
            )
            for array in table.column(0).chunks
        ]
        return Block.concat(chunks) if chunks else Block(np.empty((0, 16), np.uint8), ())

    @staticmethod
    def interleave(blocks, places) -> "Block":
        """``blocks`` one after another, then record i of that put at place ``places[i]``
        (None: as they are), in one pass."""
        if places is None:
            return Block.concat(blocks)
        blocks = [b for b in blocks if b.num_rows]
        if blocks[0].tables is not None:
            joined = _concat_tables(blocks)
            rows = np.empty(len(places), np.int64)
            rows[places] = (
                joined.rows if joined.rows is not None else np.arange(len(places), dtype=np.int64)
            )
            return Block(tables=joined.tables, rows=rows)
        views, buffers, start = np.empty((len(places), 16), np.uint8), [], 0
        items = views.view(
            VIEW_ITEM
        ).ravel()  # one 16-byte item per record: 8x faster to scatter than (n, 16)
        for block in blocks:
            items[places[start : start + block.num_rows]] = (
                shift_buffers(block.views, len(buffers)).view(VIEW_ITEM).ravel()
            )
            buffers += block.buffers
            start += block.num_rows
        return Block(views, tuple(buffers))

    @staticmethod
    def concat(blocks) -> "Block":
        """One block holding ``blocks`` one after another."""
        blocks = list(blocks)
        blocks = [b for b in blocks if b.num_rows] or blocks[:1]
        if blocks and blocks[0].tables is not None:
            return _concat_tables(blocks)
        if len(blocks) == 1:
            return blocks[0]
        views, buffers = [np.zeros((0, 16), np.uint8)], []
        for block in blocks:
            views.append(shift_buffers(block.views, len(buffers)))
            buffers += block.buffers
        return Block(np.concatenate(views), tuple(buffers))


def _one_chunk(table: pa.Table) -> pa.Table:
    """``table`` itself when each column is one chunk (the same object: ``gather`` keeps
    what it made of it), else its chunks combined."""
    return (
        table if all(column.num_chunks == 1 for column in table.columns) else table.combine_chunks()
    )


def _concat_tables(blocks) -> Block:
    """Table blocks one after another: their tables, and their rows shifted to match."""
    tables = tuple(_one_chunk(t) for b in blocks for t in b.tables)
    if all(b.rows is None for b in blocks):
        return Block(tables=tables)
    rows, offset = [], 0
    for block in blocks:
        size = sum(t.num_rows for t in block.tables)
        rows.append(
            (block.rows if block.rows is not None else np.arange(size, dtype=np.int64)) + offset
        )
        offset += size
    return Block(tables=tables, rows=np.concatenate(rows))
