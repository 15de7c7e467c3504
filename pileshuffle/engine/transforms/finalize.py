"""Finalize: the one step that publishes a run, once, after every shard is written.

It checks that the shards account for every record read (by count and fingerprint:
``check_accounted``), writes empty shards for empty piles, journals the final names it will
create and delete, deletes the old output it replaces (its manifest first), renames the shards
to ``{prefix}-{i:05d}-of-{M:05d}{suffix}`` and writes ``{prefix}-manifest.json`` last: the
manifest's presence means the run finished. It replaces only files that a manifest or a journal
lists (``check_replaceable``). The manifest's sections shared with a store's generations
(``check_accounted``, ``balance_section``) are here too.
"""

import json
import time
import uuid

import apache_beam as beam

from pileshuffle import interrupt
from pileshuffle.engine import progress
from pileshuffle.engine.dedup import Dedup, dedup_section
from pileshuffle.engine.fragments import write_failure
from pileshuffle.engine.output_files import (
    OutputFiles,
    check_replaceable,
    file_name,
    release_lock_file,
    remove_tree,
    schema_json,
    write_journal,
)
from pileshuffle.engine.sources import stats_by_file
from pileshuffle.engine.transforms.shards import ShardStats, shard_path
from pileshuffle.errors import InputError, IntegrityError
from pileshuffle.formats import get_format
from pileshuffle.io import durable, storage
from pileshuffle.io.checksums import Crc32cWriter
from pileshuffle.names import (
    SHARDS_KIND,
    manifest_header,
    manifest_path,
    output_lock_path,
    shard_name,
    staged_manifest_name,
    staging_dir,
)
from pileshuffle.records.fingerprint import Fingerprint, total
from pileshuffle.version import __version__

__all__ = ["check_accounted", "balance_section", "Finalize"]


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
        shards = sorted((i for i in items if isinstance(i, ShardStats)), key=lambda s: s.pile)
        sources = stats_by_file(i for i in items if not isinstance(i, ShardStats))
        fmt = get_format(self._format_name)
        num_piles = self._num_piles or (shards[0].num_piles if shards else 0)
        input_fp = (
            total(s.fingerprint for s in sources) if sources else total(s.put_in for s in shards)
        )
        # with --balance's copies
        put_in = total(s.put_in for s in sources) if sources else input_fp
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
        self._publish(old, [staged[p].staged_path for p in range(num_piles)], finals, manifest)
        self._remove_work(shards)
        # the job that was handed the output's lock (taken_output) lets it go
        if self._release_lock:
            release_lock_file(output_lock_path(self._prefix), self._release_lock)
        yield manifest

    def _publish(self, old: OutputFiles, staged_paths, finals, manifest):
        """Replace ``old`` by the shards under their final names, then the manifest."""
        remote = storage.is_remote(self._prefix)
        # what needs space is written first
        staged_manifest = None if remote else self._stage_manifest(manifest)
        self._settle(staged_paths)
        # Ctrl-C takes effect before this step or after it, never inside
        with interrupt.publishing():
            self._replace_old_outputs(old, finals)
            try:
                storage.put_in_place(staged_paths, finals)
                if remote:
                    # one upload, whole or absent: the commit point (no rename is atomic there)
                    storage.write_whole(
                        manifest_path(self._prefix), json.dumps(manifest, indent=1).encode()
                    )
                else:
                    # the shards' names are on disk before the manifest names them; last, the
                    # manifest: the run is done, and stays done through a crash of the machine
                    folder = storage.split(self._prefix)[0]
                    durable.settle_folder(folder)
                    storage.rename([staged_manifest], [manifest_path(self._prefix)])
                    durable.settle_folder(folder)
            except Exception as error:
                raise write_failure(self._prefix, error) from error

    @interrupt.writes
    def _settle(self, staged_paths):
        """Every local shard's bytes on disk before any takes its final name (``durable.settle``;
        the kernel has written most of them back by now)."""
        try:
            durable.settle_all(staged_paths)
        except OSError as error:  # a write the disk failed only now (delayed allocation)
            raise write_failure(staging_dir(self._prefix), error) from error

    @interrupt.writes
    def _write_empty_shard(self, fmt, pile, num_piles, suffix, schema, direct):
        path = shard_path(self._prefix, pile, num_piles, suffix, direct)
        try:
            with Crc32cWriter(
                storage.open_write(path, fmt.shard_handle_compression(self._compression))
            ) as handle:
                fmt.write_shard(handle, [], self._compression, schema)
        except OSError as error:
            raise write_failure(staging_dir(self._prefix), error) from error
        progress.pile_written()
        return ShardStats(
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
            durable.settle(staged)
        except OSError as error:
            raise write_failure(staging_dir(self._prefix), error) from error
        return staged

    @interrupt.writes
    def _remove_work(self, shards):
        dirs = {staging_dir(self._prefix)} | {s.work_dir for s in shards if s.work_dir}
        for directory in sorted(dirs):
            remove_tree(directory)


def _pile_size_summary(shards):
    """Records per shard, for the manifest: ``{"min", "mean", "max"}``."""
    records = [s.records for s in shards]
    return {"min": min(records), "mean": sum(records) / len(records), "max": max(records)}


def _shard_entry(path: str, shard: ShardStats) -> dict:
    """A shard as the manifest lists it (docs/format.md)."""
    return {
        "path": path,
        "records": shard.records,
        "bytes": shard.file_bytes,
        "crc32c": shard.crc32c,
    }
