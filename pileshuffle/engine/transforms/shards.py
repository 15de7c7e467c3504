"""WriteShard: pass 2 writes one pile, in order, as one shard, and accounts for every record.

A shard is written where no reader looks until Finalize (``finalize``): locally under a name of
the attempt's own in the staging directory (a re-run bundle writes another file; Finalize renames
only the one whose ``ShardStats`` reached it); on an object store as one upload (which appears only
when whole), under its staging name, or straight under its final name when nothing is published at
the prefix (``direct``: ``write.PreparePublication``). Every record written is counted by the hash
pass 1 gave it: a shard whose records (with the duplicates ``--dedup`` left out) are not the
pile's, by count and fingerprint, is an IntegrityError and nothing is published.
"""

import dataclasses
import uuid

import apache_beam as beam
import pyarrow as pa
from apache_beam.io.filesystem import BeamIOError

from pileshuffle import interrupt
from pileshuffle.engine import progress
from pileshuffle.engine.dedup import Dedup
from pileshuffle.engine.duplicates import Dropped
from pileshuffle.engine.fragments import between_passes, write_failure
from pileshuffle.engine.pile_groups import PileGroup
from pileshuffle.engine.tuning import prepare_worker
from pileshuffle.errors import IntegrityError
from pileshuffle.formats import get_format, records_bytes
from pileshuffle.io import storage
from pileshuffle.io.checksums import Crc32cWriter
from pileshuffle.names import HASH_COLUMN, attempt_name, shard_name, staging_dir
from pileshuffle.records.fingerprint import Fingerprint

__all__ = ["ShardStats", "WriteShard", "shard_path"]


@dataclasses.dataclass(frozen=True)
class ShardStats:
    """One written shard (still under its staging name)."""

    pile: int
    num_piles: int
    staged_path: str
    records: int
    file_bytes: int
    nbytes: int
    put_in: Fingerprint
    written: Fingerprint
    split: int
    crc32c: str
    work_dir: str = None
    schema: pa.Schema = None
    between_passes: tuple = (0, 0, 0)  # fragments.between_passes of the pile
    dropped: Fingerprint = Fingerprint()  # under dedup: the duplicates pass 2 left out
    groups: tuple = ()  # under dedup: the pile's largest duplicate groups, Dropped.groups
    dedup: Dedup = None  # the pile's Dedup (composed use: the manifest learns it here)


class WriteShard(beam.DoFn):
    """Pass 2: write one pile's records, in order, as one shard (temp file, then rename)."""

    def __init__(self, format_name, compression, prefix, schema=None):
        self._format_name, self._compression = format_name, compression
        self._prefix, self._schema = prefix, schema
        self._schema_told = False

    def setup(self):
        prepare_worker()

    def start_bundle(self):
        # Finalize learns an unknown Parquet schema from a bundle's first shard
        self._schema_told = False

    def process(self, element, direct=False):
        """A ``Pile``, or a ``PileGroup`` put in order at once (``pile_groups``): a shard a pile."""
        if not isinstance(element, PileGroup):
            yield self._write(element, element.ordered, direct)
            return
        for pile in element.alone():
            yield self._write(pile, pile.ordered, direct)
        for pile, table in element.ordered():
            yield self._write(pile, lambda dropped, table=table: (table,), direct)

    def _write(self, pile, ordered, direct) -> ShardStats:
        """``pile``'s shard from ``ordered(dropped)`` (its tables in final order, with hashes)."""
        fmt = get_format(self._format_name)
        staged = shard_path(
            self._prefix, pile.index, pile.num_piles, fmt.suffix(self._compression), direct
        )
        carried = between_passes(pile.fragments)
        written = [Fingerprint()]
        dropped = Dropped()
        schema = [self._schema]

        def counted(tables):
            """Account for every record written, by the hash pass 1 gave it."""
            for table in tables:
                records = table.drop_columns([HASH_COLUMN])
                hashes = table.column(HASH_COLUMN).to_numpy()
                written[0] += Fingerprint.of(hashes, records_bytes(records))
                schema[0] = schema[0] or records.schema
                yield records

        try:
            with interrupt.writing():  # Ctrl-C's clean-up waits for it; none starts after Ctrl-C
                handle_compression = fmt.shard_handle_compression(self._compression)
                with Crc32cWriter(storage.open_write(staged, handle_compression)) as handle:
                    tables = counted(ordered(dropped))
                    fmt.write_shard(handle, tables, self._compression, self._schema)
        except (OSError, BeamIOError) as error:
            raise write_failure(staging_dir(self._prefix), error, pile.nbytes) from error
        expected = pile.fingerprint
        _check_written(pile.index, expected, written[0], dropped)
        progress.pile_written()
        return ShardStats(
            pile.index,
            pile.num_piles,
            staged,
            written[0].records,
            _file_bytes(handle, staged, handle_compression),
            pile.nbytes,
            expected,
            written[0],
            pile.split_count(),
            handle.hex(),
            pile.work_dir,
            self._schema_to_tell(schema[0]),
            carried,
            dropped.fingerprint,
            tuple(dropped.groups),
            pile.dedup,
        )

    def _schema_to_tell(self, schema):
        """``schema`` for the first shard of a bundle, when Finalize needs it (Parquet with no
        schema given); else None: a schema is pickled into every ``ShardStats`` it rides with
        (40 us a shard)."""
        if self._format_name != "parquet" or self._schema is not None or self._schema_told:
            return None
        self._schema_told = schema is not None
        return schema


def _check_written(pile: int, expected: Fingerprint, written: Fingerprint, dropped: Dropped):
    """Refuse a shard unless what it holds and the duplicates left out are what pass 1 put in
    (``expected``)."""
    if written + dropped.fingerprint == expected:
        return
    records = dropped.fingerprint.records
    left_out = f" and left out {records} duplicates" if records else ""
    raise IntegrityError(
        f"pile {pile}: pass 1 put in {expected.describe()} but pass 2 read back and "
        f"wrote {written.describe()}{left_out}: records were lost, duplicated or changed "
        "between the passes; nothing was published"
    )


def _file_bytes(handle: Crc32cWriter, path: str, compression: str) -> int:
    """A written shard's size: the bytes written through ``handle`` to a local file that the
    handle did not compress (no stat of the file), else what the file system says."""
    return (
        handle.written
        if compression == storage.UNCOMPRESSED and not storage.is_remote(path)
        else storage.size(path)
    )


def shard_path(prefix: str, pile: int, num_piles: int, suffix: str, direct: bool) -> str:
    """Where pass 2 writes a shard: its final name (``direct``), its staging name on an object
    store (an upload appears whole), or locally a staging name of this attempt's own. A local
    attempt writes there in place: only a shard whose ``ShardStats`` reached Finalize is renamed
    to its final name, and what an attempt that failed left goes with the staging folder."""
    if direct:
        return shard_name(prefix, pile, num_piles, suffix)
    staged = shard_name(storage.join(staging_dir(prefix), "shard"), pile, num_piles, suffix)
    return staged if storage.is_remote(staged) else attempt_name(staged, uuid.uuid4().hex[:12])
