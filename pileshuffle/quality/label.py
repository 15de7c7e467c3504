"""What a record's label is, and its value per record: a field, or a few payload bytes.

A field is a Parquet column, a JSON key, a ``tf.train.Example`` feature (TFRecord) or a tar
member's extension (``formats.labels``); payload bytes ``start:end`` (at most 8) read as one
unsigned code, bytes past a record's end as 0.
"""

import dataclasses

import numpy as np
import pyarrow as pa

from pileshuffle.errors import InputError
from pileshuffle.formats import holder_of
from pileshuffle.formats.labels import record_labels
from pileshuffle.records.fingerprint import binary_column_parts

__all__ = ["Label"]


@dataclasses.dataclass(frozen=True)
class Label:
    """What a record's label is: ``field``, a Parquet column, a JSON key, a ``tf.train.Example``
    feature (TFRecord) or a member's extension (tar, e.g. ``cls``); or the payload bytes
    ``start:end`` (at most 8 bytes; bytes past a record's end read as 0)."""

    field: str = None
    start: int = None
    end: int = None

    @classmethod
    def parse_bytes(cls, text: str) -> "Label":
        try:
            start, end = (int(part) for part in text.split(":"))
        except ValueError:
            raise ValueError(f"--label_bytes takes START:END (e.g. 0:1), got {text!r}") from None
        if not 0 <= start < end <= start + 8:
            raise ValueError(f"--label_bytes {text}: need 0 <= START < END <= START+8")
        return cls(start=start, end=end)

    def values(self, table: pa.Table, path: str) -> np.ndarray:
        """One label value per record of a chunk: text (fields) or uint64 codes (bytes)."""
        if self.field is None:
            return self._byte_codes(table, path)
        return record_labels(table, self.field, path)

    def _byte_codes(self, table, path):
        holder = holder_of(table)
        if holder.record_column is None:
            raise InputError(
                path,
                f"is {holder.name}: --label_bytes reads TFRecord payloads or JSONL lines; use "
                "--label_field COLUMN",
            )
        header, footer = holder.before, holder.after
        data, offsets = binary_column_parts(table.column(0))
        raw = np.frombuffer(data, dtype=np.uint8)
        starts, ends = offsets[:-1] + header, offsets[1:] - footer
        codes = np.zeros(len(starts), dtype=np.uint64)
        for shift, k in enumerate(range(self.start, self.end)):
            where = starts + k
            inside = where < ends
            byte = np.where(
                inside, raw[np.minimum(where, len(raw) - 1)] if len(raw) else 0, 0
            ).astype(np.uint64)
            codes |= byte << np.uint64(8 * shift)
        return codes

    def longest(self, table: pa.Table) -> int:
        """The longest payload in a chunk (``--label_bytes``; 0 for a field label)."""
        holder = holder_of(table)
        if self.field is not None or holder.record_column is None:
            return 0
        header, footer = holder.before, holder.after
        _, offsets = binary_column_parts(table.column(0))
        return int(np.diff(offsets).max(initial=header + footer)) - header - footer

    def describe(self) -> str:
        return f"field {self.field!r}" if self.field else f"payload bytes {self.start}:{self.end}"

    def option(self) -> str:
        return (
            f"--label_field {self.field}"
            if self.field
            else f"--label_bytes {self.start}:{self.end}"
        )
