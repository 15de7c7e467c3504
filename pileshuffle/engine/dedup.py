"""Exact deduplication inside the shuffle: a record's key U from its content, duplicates
dropped in pass 2.

With ``--dedup exact`` a record's key is a seeded function of the record (a bytes format's
record as stored, which its payload determines; a Parquet row's values); with ``--dedup_key
FIELD`` of one field's value (a Parquet column's value; a JSON key's, a ``tf.train.Example``
feature's or a tar member's as text, as ``formats.labels`` reads labels). Equal contents get
equal keys, so they meet in one pile and, after pass 2's sort by U, sit side by side; different
contents get independent uniform keys: the output is a uniform permutation of the distinct
records.

- The content hash is 64 bits (``Dedup.contents``): per value CRC32C, CRC-32 (zlib) and length,
  mixed (two CRCs of coprime generators: a CRC of degree 64); a whole record's reuses its
  fingerprint hash (its CRC32C) and adds the CRC-32. U is ``keys.position_keys(seed,
  (DEDUP_STREAM,), hash)``, a keyed bijection of it.
- Records whose keys tie are compared by their values (bytes, or Arrow equality), never by a
  hash: a collision between different contents keeps both (``duplicates``).
- Kept: the first of each group in the pile's canonical order, which is input order (files in
  sorted order, records in file order): a re-run keeps the same records, and writes the same
  bytes.
- A group pass 2 cannot split by U (one record repeated more than a pile holds) is streamed,
  never loaded whole (``duplicates.stream_distinct``): memory is one batch and the group's
  distinct values.
- ``verify`` and ``quality`` find the distinct records of a whole input by content hash, the
  numbers waiting on disk (``distinct_fingerprint``, ``first_occurrences``).
"""

import dataclasses
import heapq
import os
import re
import tempfile

import numpy as np
import pyarrow as pa

from pileshuffle.errors import InputError
from pileshuffle.formats.json_labels import KEEP_HINT
from pileshuffle.records import keys as keymath
from pileshuffle.records.fingerprint import (
    Fingerprint,
    binary_column_parts,
    is_binary_type,
    mix64,
    row_hashes,
)
from pileshuffle.records.slice_crcs import crc32_of_slices

__all__ = [
    "DEDUP_STREAM",
    "TOP_GROUPS",
    "Dedup",
    "dedup_section",
    "distinct_fingerprint",
    "first_occurrences",
]

# the key stream of content keys (0: input positions, 1: composed use's draws, 2: store
# generations)
DEDUP_STREAM = 3
TOP_GROUPS = 10  # the largest duplicate groups a manifest lists
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


@dataclasses.dataclass(frozen=True)
class Dedup:
    """What makes two records duplicates: the whole record (``field`` None) or one field's value."""

    field: str = None

    def options(self) -> dict:
        """The manifest's options (``from_options`` reads them back)."""
        return (
            {"dedup": "exact"} if self.field is None else {"dedup": "key", "dedup_key": self.field}
        )

    @classmethod
    def from_options(cls, options: dict):
        """The ``Dedup`` a manifest's options name, or None."""
        kind = (options or {}).get("dedup")
        return None if not kind else cls(options.get("dedup_key") if kind == "key" else None)

    def values(
        self, records: pa.Table, path: str = "", first: int = 0, positions: np.ndarray = None
    ) -> pa.Table:
        """The columns two records must agree on to be duplicates (``records``: the user's columns).
        A record without the field is an InputError naming ``path`` and the record: by its number
        (``first``: the file's records before ``records``) or, where that is unknown (``first``
        None: a span of a file), by its ``positions`` entry."""
        if self.field is None:
            return records
        from pileshuffle.formats import holder_of

        try:
            return self._field_values(records, path, 0 if first is None else first)
        except InputError as error:
            problem = error.problem.replace(KEEP_HINT, "")
            # a span: the record named by its place, not its number
            if first is None and positions is not None:
                row, problem = next(
                    (i, p)
                    for i in range(records.num_rows)
                    for p in [self._problem(records.slice(i, 1))]
                    if p
                )
                unit = "byte" if holder_of(records).record_column is not None else "row"
                problem = re.sub(
                    r"\b(?:record|line|sample) 1 of the file",
                    f"the record at {unit} {int(positions[row]):,}",
                    problem,
                )
            raise InputError(path, f"{problem} (--dedup_key {self.field})") from None

    def _problem(self, record: pa.Table) -> str:
        """Why the field of this one record cannot be read ("" when it can)."""
        try:
            self._field_values(record, "", 0)
            return ""
        except InputError as error:
            return error.problem.replace(KEEP_HINT, "")

    def _field_values(self, records: pa.Table, path: str, first: int) -> pa.Table:
        from pileshuffle.formats import holder_of
        from pileshuffle.formats.labels import record_labels

        # rows: the column itself, any type, nulls equal
        if holder_of(records).record_column is None:
            if self.field not in records.column_names:
                raise InputError(
                    path,
                    f"has no column {self.field!r} (columns: {', '.join(records.column_names)})",
                )
            return records.select([self.field])
        labels = record_labels(records, self.field, path, first)
        return pa.table({"value": pa.array(labels.tolist(), type=pa.string())})

    def contents(
        self,
        records: pa.Table,
        hashes: np.ndarray,
        path: str = "",
        first: int = 0,
        positions: np.ndarray = None,
    ) -> np.ndarray:
        """The 64-bit content hash of every record (``hashes``: their fingerprint hashes, which
        whole records reuse), as run, verify and quality compute it: a hash of CRC32C and length
        (the fingerprint's; of the field's value, a one-column row) with the CRC-32 (zlib) of the
        bytes."""
        if self.field is not None:
            values = self.values(records, path, first, positions)
            return _with_crc32(row_hashes(values), values.columns)
        from pileshuffle.formats import holder_of

        holder = holder_of(records)
        if holder.record_column is None:  # rows: every binary or string value
            return _with_crc32(hashes, records.columns)
        # a bytes format's payload
        return _with_crc32(hashes, [records.column(0)], holder.before, holder.after)

    def keys(
        self,
        records: pa.Table,
        seed: int,
        hashes: np.ndarray,
        path: str = "",
        first: int = 0,
        positions: np.ndarray = None,
    ) -> np.ndarray:
        """U of every record: a keyed bijection of its content hash (equal contents, equal keys)."""
        return keymath.position_keys(
            seed, (DEDUP_STREAM,), self.contents(records, hashes, path, first, positions)
        )

    def file_contents(self, fmt, path: str, skip_corrupt: bool = False, report=None):
        """``(table, fingerprint hashes, content hashes)`` of every chunk of the file
        ``path`` in order: what verify and quality recompute of a run's input."""
        from pileshuffle.formats import record_hashes

        first = 0
        for table in fmt.read_chunks(path, skip_corrupt=skip_corrupt, report=report):
            hashes = record_hashes(table)
            yield table, hashes, self.contents(table, hashes, path, first)
            first += table.num_rows


def _with_crc32(hashes: np.ndarray, columns, before: int = 0, after: int = 0) -> np.ndarray:
    """``hashes`` (64-bit, from CRC32C and length) mixed with the CRC-32 (zlib) of each binary or
    string value of ``columns``, in column order (``before``/``after``: framing bytes left out of
    each value); fixed-width values are left as they are: their fingerprint hash is a bijection of
    them already."""
    second = np.zeros(len(hashes), dtype=np.uint64)
    with np.errstate(over="ignore"):
        for position, column in enumerate(columns):
            if not is_binary_type(column.type):
                continue
            data, offsets = binary_column_parts(
                column.fill_null(b"" if "binary" in str(column.type) else "")
            )
            second = mix64(
                second * np.uint64(0x100000001B3)
                + crc32_of_slices(data, offsets, before, after)
                + np.uint64(position)
            )
        return mix64(np.asarray(hashes, dtype=np.uint64) + second * _GOLDEN)


def dedup_section(dedup: Dedup, read: Fingerprint, kept: Fingerprint, groups) -> dict:
    """The manifest's ``dedup``: what was compared, records read, kept and dropped, and the largest
    duplicate groups (``Dropped.groups`` of every pile) with each group's copies and kept record."""
    largest = heapq.nlargest(TOP_GROUPS, groups, key=lambda g: (g[0], g[1]))
    return {
        "by": "record" if dedup.field is None else "field",
        **({} if dedup.field is None else {"field": dedup.field}),
        "compared": "bytes" if dedup.field is None else "value",
        "records_read": read.records,
        "records_kept": kept.records,
        "records_dropped": read.records - kept.records,
        "bytes_dropped": read.bytes - kept.bytes,
        "largest_groups": [
            {"copies": c, "record_hash": f"{h:016x}", "preview": p} for c, h, p in largest
        ],
    }


_PARTS = 64  # the partitions on disk of the input's numbers: memory holds one, 1/64 of them
_TRIPLE = np.dtype([("content", "<u8"), ("hash", "<u8"), ("length", "<i8")])
_PLACED = np.dtype([("content", "<u8"), ("index", "<i8")])


def _partitioned(rows, folder: str):
    """The structured arrays ``rows`` (in input order, with a ``content`` field) written to
    ``_PARTS`` files in ``folder`` by the top bits of ``content``, then yielded a file at a time:
    each holds every row of its content hashes, in input order."""
    paths = [os.path.join(folder, f"part-{p:02d}") for p in range(_PARTS)]
    handles, dtype = [open(path, "wb") for path in paths], None
    try:
        for chunk in rows:
            dtype = chunk.dtype
            order, bounds = keymath.group_by_pile(
                (chunk["content"] >> np.uint64(58)).astype(np.int64), _PARTS
            )
            for p in np.flatnonzero(np.diff(bounds)).tolist():
                handles[p].write(chunk[order[bounds[p] : bounds[p + 1]]].tobytes())
    finally:
        for handle in handles:
            handle.close()
    for path in paths if dtype is not None else []:
        yield np.fromfile(path, dtype=dtype)


def distinct_fingerprint(chunks) -> tuple:
    """``(read, distinct)`` fingerprints of the records of ``chunks`` (``(content hashes, record
    hashes, lengths)`` in input order): all of them, and the first of each content hash. What
    ``verify`` proves a dedup output against; records are one by their 64-bit content hash (the run
    compares bytes: the two differ only where distinct contents share 64 bits). The numbers, 24
    bytes a record, wait in the local temp folder (``_partitioned``)."""
    read = [Fingerprint()]

    def triples():
        for contents, hashes, lengths in chunks:
            read[0] += Fingerprint.of(hashes, int(np.sum(lengths)))
            rows = np.empty(len(contents), dtype=_TRIPLE)
            rows["content"], rows["hash"], rows["length"] = contents, hashes, lengths
            yield rows

    distinct = Fingerprint()
    with tempfile.TemporaryDirectory(prefix="pileshuffle-verify-") as folder:
        for part in _partitioned(triples(), folder):
            # the first of each, in input order
            _, first = np.unique(part["content"], return_index=True)
            distinct += Fingerprint.of(part["hash"][first], int(part["length"][first].sum()))
    return read[0], distinct


def first_occurrences(contents_chunks, folder: str) -> np.ndarray:
    """Whether each record of ``contents_chunks`` (content hashes, in input order) is the first of
    its content: a bool array memory-mapped in ``folder`` (1 byte a record on disk; the numbers it
    is made from wait there too, ``_partitioned``)."""
    count = [0]

    def placed():
        for contents in contents_chunks:
            rows = np.empty(len(contents), dtype=_PLACED)
            rows["content"], rows["index"] = contents, np.arange(count[0], count[0] + len(contents))
            count[0] += len(contents)
            yield rows

    parts = _partitioned(placed(), folder)
    part = next(parts, None)  # every row is written by now: count is known
    is_first = np.lib.format.open_memmap(
        os.path.join(folder, "first.npy"), mode="w+", dtype=bool, shape=(count[0],)
    )
    while part is not None:
        _, first = np.unique(part["content"], return_index=True)
        is_first[part["index"][first]] = True
        part = next(parts, None)
    return is_first
