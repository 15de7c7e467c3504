"""WritePiles: pass 2's shard writer, and the one finalize step that publishes a run.

Each pile is written where no reader looks until Finalize: locally in a staging directory
beside the output, under a name of the attempt's own (a re-run bundle writes another file;
Finalize renames only the one whose stats reached it); on an object store as one upload (which appears only when whole), straight to its final name when nothing
is published at the prefix (``PreparePublication``: a rename there is a copy), else staged. Finalize runs
once, after every shard: it checks that the shards account for every record read (by
count and fingerprint), writes empty shards for empty piles, journals the final names it
will create and delete, deletes the old output it replaces (its manifest first), renames
the shards to ``{prefix}-{i:05d}-of-{M:05d}{suffix}`` and writes ``{prefix}-manifest.json``
last: the manifest's presence means the run finished. It replaces only files that a
manifest or a journal lists (``check_replaceable``).
"""

import dataclasses
import json
import time
import uuid

import apache_beam as beam
import pyarrow as pa
from apache_beam.io.filesystem import BeamIOError

from pileshuffle import __version__, interrupt, progress
from pileshuffle.engine.dedup import Dedup, Dropped, dedup_section
from pileshuffle.engine.fragments import between_passes, write_failure
from pileshuffle.engine.output_files import (
    OutputFiles,
    check_replaceable,
    file_name,
    release_lock_file,
    remove_tree,
    write_journal,
)
from pileshuffle.engine.transforms.assign import stats_by_file
from pileshuffle.engine.transforms.pile_groups import PileGroup
from pileshuffle.engine.tuning import prepare_worker
from pileshuffle.errors import InputError, IntegrityError
from pileshuffle.formats import get_format, records_bytes
from pileshuffle.io import storage
from pileshuffle.io.checksums import Crc32cWriter
from pileshuffle.names import (
    HASH_COLUMN,
    SHARDS_KIND,
    attempt_name,
    manifest_header,
    manifest_path,
    output_lock_path,
    shard_name,
    staged_manifest_name,
    staging_dir,
)
from pileshuffle.records.fingerprint import Fingerprint, total

__all__ = [
    "WriteShard",
    "PreparePublication",
    "check_accounted",
    "balance_section",
    "Finalize",
    "schema_json",
    "KeyByNone",
    "WritePiles",
]


@dataclasses.dataclass(frozen=True)
class _ShardStats:
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
    groups: tuple = ()  # under dedup: the pile's largest duplicate groups, dedup.Dropped.groups
    dedup: Dedup = None  # the pile's Dedup (composed use: the manifest learns it here)


class WriteShard(beam.DoFn):
    """Pass 2: write one pile's records, in order, as one shard (temp file, then rename)."""

    def __init__(self, format_name, compression, prefix, schema=None):
        self._format_name, self._compression, self._prefix, self._schema = (
            format_name,
            compression,
            prefix,
            schema,
        )
        self._schema_told = False

    def setup(self):
        prepare_worker()

    def start_bundle(self):
        self._schema_told = (
            False  # Finalize learns an unknown Parquet schema from a bundle's first shard
        )

    def process(self, element, direct=False):
        """A ``Pile``, or a ``PileGroup`` put in order at once (``pile_groups``): a shard a pile."""
        if not isinstance(element, PileGroup):
            yield self._write(element, element.ordered, direct)
            return
        for pile in element.alone():
            yield self._write(pile, pile.ordered, direct)
        for pile, table in element.ordered():
            yield self._write(pile, lambda dropped, table=table: (table,), direct)

    def _write(self, pile, ordered, direct) -> "_ShardStats":
        """``pile``'s shard from ``ordered(dropped)`` (its tables in final order, with their hashes)."""
        fmt = get_format(self._format_name)
        staged = _shard_path(
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
                    fmt.write_shard(
                        handle, counted(ordered(dropped)), self._compression, self._schema
                    )
        except (OSError, BeamIOError) as error:
            raise write_failure(staging_dir(self._prefix), error, pile.nbytes) from error
        expected = pile.fingerprint
        if written[0] + dropped.fingerprint != expected:
            left_out = (
                f" and left out {dropped.fingerprint.records} duplicates"
                if dropped.fingerprint.records
                else ""
            )
            raise IntegrityError(
                f"pile {pile.index}: pass 1 put in {expected.describe()} but pass 2 read back and wrote "
                f"{written[0].describe()}{left_out}: records were lost, duplicated or changed between the "
                "passes; nothing was published"
            )
        progress.pile_written()
        return _ShardStats(
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
        """``schema`` for the first shard of a bundle, when Finalize needs it (Parquet with no schema
        given); else None: a schema is pickled into every ``_ShardStats`` it rides with (40 us a shard)."""
        if self._format_name != "parquet" or self._schema is not None or self._schema_told:
            return None
        self._schema_told = schema is not None
        return schema


def _file_bytes(handle: Crc32cWriter, path: str, compression: str) -> int:
    """A written shard's size: the bytes written through ``handle`` to a local file that the
    handle did not compress (no stat of the file), else what the file system says."""
    return (
        handle.written
        if compression == storage.UNCOMPRESSED and not storage.is_remote(path)
        else storage.size(path)
    )


def _shard_path(prefix: str, pile: int, num_piles: int, suffix: str, direct: bool) -> str:
    """Where pass 2 writes a shard: its final name (``direct``), its staging name on an object store
    (an upload appears whole), or locally a staging name of this attempt's own. A local attempt
    writes there in place: only a shard whose ``_ShardStats`` reached Finalize is renamed to its
    final name, and what an attempt that failed left goes with the staging folder."""
    if direct:
        return shard_name(prefix, pile, num_piles, suffix)
    staged = shard_name(storage.join(staging_dir(prefix), "shard"), pile, num_piles, suffix)
    return staged if storage.is_remote(staged) else attempt_name(staged, uuid.uuid4().hex[:12])


class PreparePublication(beam.DoFn):
    """Runs once, before pass 2 writes anything; yields whether shards go straight to their
    final names (``direct``). They do on an object store when nothing is published at the
    prefix and the pile count is known: there a rename is a copy (twice the writes, and the
    staged copy is billed for the bucket's soft-delete days), and no old output needs
    protecting from a run that may fail. The journal then lists every final name first, so a
    killed run's shards are its re-run's to replace, and a failed run's are deleted. A
    finished output (``--overwrite``) keeps staging: it stays whole until the new one commits."""

    def __init__(self, prefix, num_piles, suffix, overwrite):
        self._prefix, self._num_piles, self._suffix, self._overwrite = (
            prefix,
            num_piles,
            suffix,
            overwrite,
        )

    def process(self, _):
        if not storage.is_remote(self._prefix) or not self._num_piles:
            yield False
            return
        if check_replaceable(self._prefix, self._overwrite).manifest is not None:
            yield False
            return
        finals = [
            shard_name(self._prefix, p, self._num_piles, self._suffix)
            for p in range(self._num_piles)
        ]
        write_journal(self._prefix, finals + [manifest_path(self._prefix)], [])
        yield True


def _pile_size_summary(shards):
    """Records per shard, for the manifest: ``{"min", "mean", "max"}``."""
    records = [s.records for s in shards]
    return {"min": min(records), "mean": sum(records) / len(records), "max": max(records)}


def check_accounted(sources, read: Fingerprint, written: Fingerprint, purpose: str, wrote: str):
    """Publish nothing unless ``written`` accounts for every record ``read`` (by count and
    fingerprint) and there was a record at all; ``sources`` (``SourceStats``) name the input."""
    if read.records == 0:
        inputs = ", ".join(s.path for s in sources[:3]) + (", ..." if len(sources) > 3 else "")
        skipped = sum(s.skipped_records for s in sources)
        why = f" ({skipped} corrupt record(s) skipped)" if skipped else ""
        raise InputError(
            inputs or "the input PCollection", f"holds no records{why}: nothing to {purpose}"
        )
    if read != written:
        raise IntegrityError(
            f"records lost, duplicated or changed: read {read.describe()} but {wrote} "
            f"{written.describe()}; nothing was published"
        )


def balance_section(sources, options: dict) -> dict:
    """The manifest's ``balance``: the label, the policy and the records per class before
    and after (``SourceStats.classes`` added up)."""
    before, after = {}, {}
    for source in sources:
        for label, read, emitted in source.classes:
            before[label], after[label] = before.get(label, 0) + read, after.get(label, 0) + emitted
    policy = options.get("balance", "") + (
        ", undersampling" if options.get("undersample") else ", oversampling"
    )
    return {
        "label": options.get("label_field"),
        "policy": policy,
        "records_before": before,
        "records_after": after,
    }


class Finalize(beam.DoFn):
    """Check, complete, publish: the only step that creates final names."""

    def __init__(
        self,
        prefix,
        format_name,
        compression,
        num_piles,
        overwrite,
        schema,
        manifest_fields,
        started,
        release_lock=None,
    ):
        self._prefix, self._format_name, self._compression = prefix, format_name, compression
        self._release_lock = release_lock  # the output lock's token, when this job holds the lock
        self._num_piles, self._overwrite, self._schema = num_piles, overwrite, schema
        self._fields, self._started = manifest_fields, started

    def process(self, element, direct=False):
        _, items = element
        shards = sorted((i for i in items if isinstance(i, _ShardStats)), key=lambda s: s.pile)
        sources = stats_by_file(i for i in items if not isinstance(i, _ShardStats))
        fmt = get_format(self._format_name)
        num_piles = self._num_piles or (shards[0].num_piles if shards else 0)
        input_fp = (
            total(s.fingerprint for s in sources) if sources else total(s.put_in for s in shards)
        )
        put_in = (
            total(s.put_in for s in sources) if sources else input_fp
        )  # with --balance's copies
        output_fp = total(s.written for s in shards)
        dropped = total(s.dropped for s in shards)
        check_accounted(
            sources,
            put_in,
            output_fp + dropped,
            "shuffle",
            "wrote and left out as duplicates" if dropped.records else "wrote",
        )
        old = check_replaceable(self._prefix, self._overwrite)  # before any final name changes
        schema = self._schema or next((s.schema for s in shards if s.schema is not None), None)
        staged = {s.pile: s for s in shards}
        suffix = fmt.suffix(self._compression)
        for pile in range(num_piles):
            if pile not in staged:
                staged[pile] = self._write_empty_shard(fmt, pile, num_piles, suffix, schema, direct)
        finals = [shard_name(self._prefix, p, num_piles, suffix) for p in range(num_piles)]
        manifest = self._manifest(
            shards, sources, finals, staged, input_fp, output_fp, schema, num_piles
        )
        remote = storage.is_remote(self._prefix)
        staged_manifest = (
            None if remote else self._stage_manifest(manifest)
        )  # what needs space is written first
        with (
            interrupt.publishing()
        ):  # Ctrl-C takes effect before this step or after it, never inside
            self._replace_old_outputs(old, finals)
            try:
                storage.put_in_place([staged[p].staged_path for p in range(num_piles)], finals)
                if (
                    remote
                ):  # one upload, whole or absent: the commit point (no rename is atomic there)
                    storage.write_whole(
                        manifest_path(self._prefix), json.dumps(manifest, indent=1).encode()
                    )
                else:
                    storage.rename(
                        [staged_manifest], [manifest_path(self._prefix)]
                    )  # last: the run is done
            except Exception as error:
                raise write_failure(self._prefix, error) from error
        self._remove_work(shards)
        if self._release_lock:  # the job that was handed the output's lock (output_lock) lets it go
            release_lock_file(output_lock_path(self._prefix), self._release_lock)
        yield manifest

    @interrupt.writes
    def _write_empty_shard(self, fmt, pile, num_piles, suffix, schema, direct):
        path = _shard_path(self._prefix, pile, num_piles, suffix, direct)
        try:
            with Crc32cWriter(
                storage.open_write(path, fmt.shard_handle_compression(self._compression))
            ) as handle:
                fmt.write_shard(handle, [], self._compression, schema)
        except OSError as error:
            raise write_failure(staging_dir(self._prefix), error) from error
        progress.pile_written()
        return _ShardStats(
            pile,
            num_piles,
            path,
            0,
            storage.size(path),
            0,
            Fingerprint(),
            Fingerprint(),
            0,
            handle.hex(),
        )

    def _replace_old_outputs(self, old: OutputFiles, finals):
        """Journal the publication, then delete the old files the new shards do not
        replace by name: the old manifest first, so a reader never trusts a partial set."""
        replaced_by_name = {file_name(f) for f in finals}
        doomed = [p for p in old.replaceable if file_name(p) not in replaced_by_name]
        write_journal(self._prefix, finals + [manifest_path(self._prefix)], doomed)
        for batch in (
            [p for p in doomed if p == old.manifest],
            [p for p in doomed if p != old.manifest],
        ):
            if batch:
                storage.delete(batch)

    def _manifest(self, shards, sources, finals, staged, input_fp, output_fp, schema, num_piles):
        seconds = time.time() - self._started if self._started else None
        manifest = {
            **manifest_header(SHARDS_KIND),
            "pileshuffle_version": __version__,
            **self._fields,
            "format": self._format_name,
            "compression": self._compression,
            "num_piles": num_piles,
            "shards": [_shard_entry(finals[p], staged[p]) for p in range(num_piles)],
            "totals": {
                "records": output_fp.records,
                "payload_bytes": output_fp.bytes,
                "shard_bytes": sum(staged[p].file_bytes for p in range(num_piles)),
            },
            "pile_records": _pile_size_summary([staged[p] for p in range(num_piles)]),
            "piles_split": sum(s.split for s in shards),
            "between_passes": dict(
                zip(
                    ("written_bytes", "in_memory_bytes", "shuffled_bytes"),
                    (sum(s.between_passes[k] for s in shards) for k in range(3)),
                )
            ),
            "input_fingerprint": input_fp.to_json(),
            "output_fingerprint": output_fp.to_json(),
            "skipped": {
                "records": sum(s.skipped_records for s in sources),
                "bytes": sum(s.skipped_bytes for s in sources),
                "problems": [p for s in sources for p in s.problems][:100],
                "blank_lines": sum(s.blank_lines for s in sources),
            },
            "seconds": seconds,
        }
        if sources:
            manifest["inputs"] = [
                {"path": s.path, "records": s.fingerprint.records, "bytes": s.size} for s in sources
            ]
        if any(s.classes for s in sources):
            manifest["balance"] = balance_section(sources, self._fields.get("options", {}))
        dedup = Dedup.from_options(self._fields.get("options", {})) or next(
            (s.dedup for s in shards if s.dedup), None
        )
        if dedup is not None:
            manifest["dedup"] = dedup_section(
                dedup, input_fp, output_fp, [g for s in shards for g in s.groups]
            )
        if schema is not None:
            manifest["schema"] = schema_json(schema)
        return manifest

    @interrupt.writes
    def _stage_manifest(self, manifest) -> str:
        """The manifest, written in the staging directory (renamed into place last)."""
        staged = storage.join(
            staging_dir(self._prefix), staged_manifest_name(uuid.uuid4().hex[:12])
        )
        try:
            with storage.open_write(staged, "uncompressed", "application/json") as handle:
                handle.write(json.dumps(manifest, indent=1).encode())
        except OSError as error:
            raise write_failure(staging_dir(self._prefix), error) from error
        return staged

    @interrupt.writes
    def _remove_work(self, shards):
        dirs = {staging_dir(self._prefix)} | {s.work_dir for s in shards if s.work_dir}
        for directory in sorted(dirs):
            remove_tree(directory)


def _shard_entry(path: str, shard: _ShardStats) -> dict:
    """A shard as the manifest lists it (docs/format.md)."""
    return {
        "path": path,
        "records": shard.records,
        "bytes": shard.file_bytes,
        "crc32c": shard.crc32c,
    }


def schema_json(schema: pa.Schema) -> dict:
    """An Arrow schema as a manifest records it: each field's name, type and nullability, and the metadata as text."""
    metadata = {
        k.decode(errors="replace"): v.decode(errors="replace")
        for k, v in (schema.metadata or {}).items()
    }
    return {
        "fields": [{"name": f.name, "type": str(f.type), "nullable": f.nullable} for f in schema],
        "metadata": metadata,
    }


class KeyByNone(beam.DoFn):
    """Everything under one key: the one GroupByKey before a step that sees it all."""

    def process(self, element):
        yield None, element


class WritePiles(beam.PTransform):
    """Write ``Pile`` elements as shards ``{prefix}-{i:05d}-of-{M:05d}{suffix}`` plus a manifest.

    ``format``: tfrecord | parquet | jsonl. ``compression``: none | gzip for bytes
    formats, a Parquet codec (snappy, zstd, gzip, none) for Parquet. ``expected``: an
    optional PCollection of pass-1 ``SourceStats`` to check the output against (the
    template passes it); without it each shard is checked against what pass 1 put in
    Returns a PCollection holding the manifest dict.
    """

    def __init__(
        self,
        prefix,
        format,
        compression="none",
        num_piles=None,
        overwrite=False,
        schema=None,
        expected=None,
        manifest_fields=None,
        started=None,
        release_lock=None,
    ):
        super().__init__()
        self._release_lock = release_lock
        fmt = get_format(format)
        self._prefix, self._format = prefix, fmt.name
        self._compression = (
            compression if fmt.name != "parquet" else fmt.output_compression(compression, [])
        )
        self._num_piles, self._overwrite, self._schema = num_piles, overwrite, schema
        self._expected, self._fields, self._started = expected, dict(manifest_fields or {}), started

    def expand(self, piles):
        suffix = get_format(self._format).suffix(self._compression)
        direct = beam.pvalue.AsSingleton(
            piles.pipeline
            | "StartPublication" >> beam.Create([None])
            | "PreparePublication"
            >> beam.ParDo(
                PreparePublication(self._prefix, self._num_piles, suffix, self._overwrite)
            )
        )
        shards = piles | "WriteShard" >> beam.ParDo(
            WriteShard(self._format, self._compression, self._prefix, self._schema), direct
        )
        parts = (shards,) if self._expected is None else (shards, self._expected)
        return (
            parts
            | "FlattenForFinalize" >> beam.Flatten()
            | "KeyForFinalize" >> beam.ParDo(KeyByNone())
            | "GatherForFinalize" >> beam.GroupByKey()
            | "Finalize"
            >> beam.ParDo(
                Finalize(
                    self._prefix,
                    self._format,
                    self._compression,
                    self._num_piles,
                    self._overwrite,
                    self._schema,
                    self._fields,
                    self._started or time.time(),
                    self._release_lock,
                ),
                direct,
            )
        )
