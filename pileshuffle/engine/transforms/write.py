"""WritePiles: pass 2's shard writer and the finalize step that publishes a run, composed.

Each pile becomes one shard (``shards.WriteShard``) where no reader looks until Finalize
(``finalize.Finalize``), which runs once, after every shard, checks that the shards account for
every record read and publishes them with the manifest last. ``PreparePublication`` decides first
whether shards go straight to their final names (``direct``).
"""

import time

import apache_beam as beam

from pileshuffle.engine.output_files import check_replaceable, write_journal
from pileshuffle.engine.transforms.finalize import Finalize
from pileshuffle.engine.transforms.shards import WriteShard
from pileshuffle.formats import get_format
from pileshuffle.io import storage
from pileshuffle.names import manifest_path, shard_name

__all__ = ["PreparePublication", "KeyByNone", "WritePiles"]


class PreparePublication(beam.DoFn):
    """Runs once, before pass 2 writes anything; yields whether shards go straight to their
    final names (``direct``). They do on an object store when nothing is published at the
    prefix and the pile count is known: there a rename is a copy (twice the writes, and the
    staged copy is billed for the bucket's soft-delete days), and no old output needs
    protecting from a run that may fail. The journal then lists every final name first, so a
    killed run's shards are its re-run's to replace, and a failed run's are deleted. A
    finished output (``--overwrite``) keeps staging: it stays whole until the new one commits."""

    def __init__(self, prefix, num_piles, suffix, overwrite):
        self._prefix, self._num_piles = prefix, num_piles
        self._suffix, self._overwrite = suffix, overwrite

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
