"""Finished outputs as piles: "a set of files plus each record's key".

``open_output(path)`` finds what is at ``path`` and returns an ``Output`` whose piles
are ``PileRef``s. A pile loads as a ``Block`` (``loader.block``), its records in their
*written order*:
- a shard output (``{P}-manifest.json``): pile i is shard i, in file order;
- a pile store (``{P}-store/manifest-*.json``, the highest version is current): pile i
  is the records of its Arrow IPC files over the live generations, files in
  (generation, writer) order, stably sorted by ``_pileshuffle_key`` -- the order
  ``materialize`` writes. ``load(part=(s, ways))`` gives sub-pile s, the records whose
  next digits of U (``U * M mod 2**64``) have top digit s in base ``ways``, in the same
  order: the sub-piles one after another are the pile.
Everything after this module (epoch order, splitting, state) sees only ``PileRef``s.
All I/O goes through ``pileshuffle.io.storage`` (``pyarrow.fs``: local, gs://, s3://);
nothing here imports Beam.
"""

import dataclasses
import json

import numpy as np
import pyarrow as pa

from pileshuffle.errors import InputError
from pileshuffle.formats import get_format
from pileshuffle.formats.views import value_views
from pileshuffle.io import storage
from pileshuffle.io.arrow_backend import arrow_filesystem
from pileshuffle.io.checksums import check_crc32c, unreadable_bytes
from pileshuffle.io.copy_marks import read_copies, visible_places
from pileshuffle.loader.block import Block
from pileshuffle.loader.cache import remote_name
from pileshuffle.loader.order import sort_by_key
from pileshuffle.names import HASH_COLUMN, KEY_COLUMN, RECORD_COLUMN
from pileshuffle.records import keys as keymath
from pileshuffle.records.fingerprint import binary_column_parts

__all__ = [
    "BYTES_SCHEMA",
    "NoOutputError",
    "resolve",
    "file_exists",
    "read_json",
    "Source",
    "sub_pile_of",
    "PileRef",
]

# what a bytes format's batches hold: the payloads
BYTES_SCHEMA = pa.schema([pa.field(RECORD_COLUMN, pa.binary())])


class NoOutputError(InputError):
    """Nothing finished at the path: no manifest."""


def resolve(path: str, filesystem=None):
    """``(filesystem, path on it)`` for a local path or a URI (gs://, s3://, file://): resolved
    once per output, then handed to every read."""
    return arrow_filesystem(path, filesystem)


def file_exists(fs, path: str) -> bool:
    """Whether ``path`` exists on ``fs`` (from ``resolve``)."""
    return storage.exists(path, fs)


def _read_bytes(fs, path: str, name: str = None) -> pa.Buffer:
    """A whole file (``storage.read_buffer``: local files mapped, .gz decompressed); errors name
    the file (as ``name``: a cached copy's errors name the remote file)."""
    try:
        return storage.read_buffer(path, fs)
    except (OSError, pa.ArrowException) as error:
        raise InputError(name or path, unreadable_bytes(path, error)) from error


def read_json(fs, path: str) -> dict:
    """A JSON file (a manifest) on ``fs``; unreadable or invalid JSON is an InputError naming it."""
    try:
        return json.loads(_read_bytes(fs, path).to_pybytes())
    except ValueError as error:
        raise InputError(path, f"is not valid JSON: {error}") from error


@dataclasses.dataclass(frozen=True)
class Source:
    """How to read an output's files: format, filesystem, the columns wanted (Parquet), and
    the local cache of its remote files (``loader.cache``; None: read where they are) with
    what the manifest says of each file (``facts``: path -> ``FileFacts``)."""

    format: str
    filesystem: object
    columns: tuple = None
    num_piles: int = 1
    cache: object = None
    facts: dict = dataclasses.field(default=None, compare=False)
    # a dedup store: path -> (copies path, crc32c, live)
    copies: dict = dataclasses.field(default=None, compare=False)

    def _read(self, path: str, read):
        """``read(filesystem, path)``: of the file's local copy when it is cached, else of the
        file where it is. ``read`` parses the whole file, so a damaged copy fails inside it
        (and the cache drops it and reads the remote file instead)."""
        facts = self.facts.get(path) if self.cache is not None and self.facts else None
        if facts is None:
            return read(self.filesystem, path)
        return self.cache.read(self.filesystem, path, facts, read)

    def read_shard(self, path: str) -> Block:
        """A shard's records, its bytes proven by the CRC32C its manifest lists (when it
        lists one)."""
        fmt, name, listed = (
            get_format(self.format),
            remote_name(self.filesystem, path),
            self._listed_crc32c(path),
        )

        def block(fs, where):
            if fmt.record_column is not None:
                buffer = _read_bytes(fs, where, name)
                # the format's own checks name the place first
                views = fmt.payload_views(buffer, name, 0)
                self._check_size(path, name, buffer.size)
                if not fmt.checks_every_byte:
                    check_crc32c(name, buffer, listed)
                return Block(views, (buffer,))
            try:
                with _proven_random_access(fs, where, name, listed) as handle:
                    return Block(tables=(fmt.read_rows(handle, self.columns),))
            except (OSError, pa.ArrowException) as error:
                raise InputError(name, f"cannot be read as {fmt.name}: {error}") from error

        return self._read(path, block)

    def _listed_crc32c(self, path: str):
        """The CRC32C the manifest lists for ``path`` (None: it lists none)."""
        facts = (self.facts or {}).get(path)
        return None if facts is None else facts.crc32c

    def _check_size(self, path: str, name: str, size: int):
        """Refuse a shard whose bytes are not as many as its manifest lists (a .gz:
        decompressed, unlisted)."""
        facts = (self.facts or {}).get(path)
        if facts is not None and not path.endswith(".gz"):
            facts.check_size(name, size)

    def read_store_keys(self, path: str) -> np.ndarray:
        """The ``_pileshuffle_key`` column of a store file (local files: memory-mapped, so
        only the keys' pages are read)."""

        def keys(fs, where):
            try:
                with storage.open_mapped(where, fs) as mapped:
                    parts = [
                        batch.column(KEY_COLUMN).to_numpy() for batch in pa.ipc.open_stream(mapped)
                    ]
            except (OSError, pa.ArrowException, KeyError) as error:
                raise InputError(
                    path, f"cannot be read as a pile store data file: {error}"
                ) from error
            return np.concatenate(parts) if parts else np.zeros(0, np.uint64)

        found = self._read(path, keys)
        visible = self.visible_rows(path, len(found))
        return found if visible is None else found[visible]

    def visible_rows(self, path: str, rows: int):
        """The places of the rows readers get of a store data file of ``rows`` rows: in a dedup
        store, those that are no copy of a live earlier row (``copy_marks``); None: every row."""
        listed = (self.copies or {}).get(path)
        if listed is None:
            return None
        where, crc32c, live = listed
        name = remote_name(self.filesystem, where)
        data = _read_bytes(self.filesystem, where, name)
        check_crc32c(name, data, crc32c)
        return visible_places(rows, *read_copies(data, name), live)

    def read_store_file(self, path: str):
        """``(block, keys)`` of one store data file (an Arrow IPC stream): its visible rows."""
        block, keys = self._read(path, lambda fs, where: self._store_file(fs, where, path))
        visible = self.visible_rows(path, len(keys))
        return (
            (block, keys) if visible is None else (block.reorder(visible).compact(), keys[visible])
        )

    def _store_file(self, fs, where: str, path: str):
        name = remote_name(self.filesystem, path)
        # the whole file (local: mapped), so the columns are views
        buffer = _read_bytes(fs, where, name)
        check_crc32c(name, buffer, self._listed_crc32c(path))
        try:
            table = pa.ipc.open_stream(buffer).read_all()
        except (OSError, pa.ArrowException) as error:
            raise InputError(name, f"cannot be read as an Arrow IPC stream: {error}") from error
        if KEY_COLUMN not in table.column_names:
            raise InputError(name, f"has no {KEY_COLUMN} column: not a pile store data file")
        keys = table.column(KEY_COLUMN).to_numpy()
        fmt = get_format(self.format)
        if fmt.record_column is None:
            columns = [c for c in table.column_names if c not in (KEY_COLUMN, HASH_COLUMN)]
            return Block(tables=(table.select(list(self.columns or columns)),)), keys
        # a store file holds the format's records as pass 1 read them, or bare payloads (composed
        # runs)
        column = next(
            (c for c in (fmt.record_column, RECORD_COLUMN) if c in table.column_names), None
        )
        if column is None:
            raise InputError(
                path,
                f"has none of the columns {[fmt.record_column, RECORD_COLUMN]}: not a "
                f"{self.format} pile store file",
            )
        blocks = []
        for chunk in table.column(column).chunks:
            buffer, offsets = binary_column_parts(chunk)
            views = (
                value_views(buffer, offsets)
                if column == RECORD_COLUMN
                else fmt.payload_views(buffer, path, 0)
            )
            blocks.append(Block(views, (buffer,)))
        return Block.concat(blocks), keys


def _proven_random_access(fs, where: str, path: str, listed: str):
    """A random-access file over a Parquet shard whose bytes have the CRC32C ``listed`` (None: not
    checked, read 1 MiB at a time). A checked shard is held whole, where it is: a local file
    memory-mapped, a remote one fetched in one request; the reader parses its column chunks in
    place (``ParquetFormat.read_rows``), so the pages the check touched are read, not copied again:
    0.97x the epoch of the loader before checksums, where a check beside its 1 MiB reads made 0.84x
    (in-process, medians of 5; bench pairs: docs/performance.md, "Integrity on read"). The mapped
    pages count in RSS as page cache, one shard at a time."""
    if listed is None:
        return storage.open_random_access(where, fs)
    buffer = _read_bytes(fs, where, path)
    check_crc32c(path, buffer, listed)
    return pa.BufferReader(buffer)


def sub_pile_of(keys: np.ndarray, num_piles: int, ways: int) -> np.ndarray:
    """The sub-pile of each key of a pile split ``ways`` ways: the top digit, in base
    ``ways``, of U's digits after its pile digit (``U * M mod 2**64``)."""
    with np.errstate(over="ignore"):
        return keymath.pile_of(np.asarray(keys, np.uint64) * np.uint64(num_piles), ways)


@dataclasses.dataclass(frozen=True)
class PileRef:
    """One pile: its files (in their canonical order) and whether records carry keys.

    ``load()`` returns the pile's records in written order; ``load((s, ways))`` only
    sub-pile ``s`` of ``ways`` (keyed piles), in the same order."""

    index: int
    records: int
    files: tuple
    keyed: bool
    source: Source
    part: tuple = None  # (sub, ways): this ref is sub-pile ``sub`` of pile ``index``

    def load(self, part=None, order=None) -> Block:
        """The pile's records (sub-pile ``part``, else this ref's), as written, or in
        ``order`` (indices into that)."""
        shards = self._shards(part or self.part)
        block = (
            self._stored(part or self.part)
            if shards is None
            else Block.concat(b for _, b in shards)
        )
        if (part is None or part == self.part) and block.num_rows != self.records:
            raise InputError(
                ", ".join(self.files),
                f"holds {block.num_rows:,} records where the manifest lists "
                f"{self.records:,}: changed after it was written "
                "(`pileshuffle verify` says how)",
            )
        return block if order is None else block.reorder(order)

    def _shards(self, part):
        """``[(path, Block), ...]`` of a shard output's pile, read; None for a store's."""
        if self.keyed:
            return None
        if part is not None:
            raise ValueError("only keyed piles (stores) load in sub-piles")
        return [(path, self.source.read_shard(path)) for path in self.files]

    def _stored(self, part) -> Block:
        blocks, keys = [], []
        for path in self.files:
            block, file_keys = self.source.read_store_file(path)
            # keep only the sub-pile's records, copied out of the file's buffers
            if part is not None:
                chosen = np.flatnonzero(
                    sub_pile_of(file_keys, self.source.num_piles, part[1]) == part[0]
                )
                block, file_keys = block.reorder(chosen).compact(), file_keys[chosen]
            blocks.append(block)
            keys.append(file_keys)
        keys = np.concatenate(keys) if keys else np.zeros(0, np.uint64)
        return Block.concat(blocks).reorder(sort_by_key(keys))
