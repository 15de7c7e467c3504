"""Pass 1 into a pile store, as one new generation, and its publication (``write_generation``,
under the store's lock: ``lock.store_lock``). It first deletes what a killed command of its own
kind left (unpublished generation directories), and publishes one manifest version last.

Template path (``run --layout store``, ``append``): the sorted sources are dealt into at
most W contiguous writer groups (balanced by bytes); one ``_WriteStoreGroup`` call per
group reads its sources in order and appends each record to the data file of its
(group, pile). A generation therefore has at most W x M files, whatever the number of
inputs, and within a file records are in canonical order (source id, then position);
taking the files in writer order gives the order ``run`` feeds pass 2.

Keys: generation 0 uses ``run``'s stream ``(INPUT_STREAM, source id)``, so a store
materializes to ``run``'s exact bytes; generation g > 0 uses
``(GENERATION_STREAM, g, source id)`` (source id = rank in that generation's inputs).

A store created with ``--balance`` balances every generation on its own class counts: a
counting pass over the generation's sources, then each record written as many times as
its copies say, each copy with a key of its own (``run``'s ``assign.SourcePiles``), so the
copies spread over the piles as in ``run``.

A store created with ``--dedup`` keys every generation's records by their content (stream 3,
the store's seed) and, once the writers are done, marks each pile's copies of earlier rows in
copies files beside the data files (``store.copies``) before publishing.

``store.publish`` then runs once, after every file is written: it checks that the files
account for every record read (counts and fingerprints) and writes the next manifest
version, exclusively. Every DoFn here emits from ``process`` (Beam's DaskRunner drops
``finish_bundle`` outputs). The composed use, ``WritePileStore``, is ``store.composed``.
"""

import dataclasses
import time

import apache_beam as beam

from pileshuffle import names
from pileshuffle.engine.balance import ClassPlanner
from pileshuffle.engine.inputs import file_identity
from pileshuffle.engine.runner import execute
from pileshuffle.engine.transforms.assign import INPUT_STREAM, SourcePiles
from pileshuffle.engine.transforms.graph import counted_classes
from pileshuffle.engine.tuning import prepare_worker
from pileshuffle.errors import OutputError
from pileshuffle.formats import get_format
from pileshuffle.formats.base import DEFAULT_CHUNK_BYTES
from pileshuffle.store import layout
from pileshuffle.store.copies import MarkEarlierCopies
from pileshuffle.store.generation_files import StoreFile, StoreFiles
from pileshuffle.store.publish import publish

__all__ = [
    "GENERATION_STREAM",
    "STORE_WRITERS",
    "WriterGroup",
    "writer_groups",
    "build_generation",
    "write_generation",
    "same_inputs",
    "input_identity",
]

GENERATION_STREAM = 2  # key stream tag of generations after the first (1 is composed use's)
STORE_WRITERS = 32  # default W: writer groups per generation (at most one per input file)


def _generation_stream(generation: int, source_id: int) -> tuple:
    """The key stream of a source: ``run``'s for generation 0, one per generation after."""
    return (
        (INPUT_STREAM, source_id) if generation == 0 else (GENERATION_STREAM, generation, source_id)
    )


@dataclasses.dataclass(frozen=True)
class WriterGroup:
    """One writer of a generation and the sources it reads, in order (its data files are
    ``w{writer}``)."""

    writer: int
    sources: tuple


def writer_groups(sources, writers: int = STORE_WRITERS) -> list:
    """Sources (sorted by id) in at most ``writers`` contiguous groups of about equal
    bytes; a pure function of the source list, so every runner writes the same files."""
    sources = sorted(sources, key=lambda s: s.id)
    count = max(1, min(int(writers), len(sources)))
    weights = [max(1, s.size) for s in sources]
    whole, seen, groups = sum(weights), 0, [[] for _ in range(count)]
    for source, weight in zip(sources, weights):
        groups[min(count - 1, (seen + weight // 2) * count // whole)].append(source)
        seen += weight
    return [WriterGroup(w, tuple(g)) for w, g in enumerate(g for g in groups if g)]


class _WriteStoreGroup(beam.DoFn):
    """Pass 1 of one writer group into the store: emits one ``SourceStats`` per source and
    one ``StoreFile`` per pile that received records. With the ``counts`` side input (the
    counting pass's, planned under ``policy``) each record is written as many times as its
    copies say."""

    def __init__(
        self,
        store,
        generation,
        format_name,
        seed,
        num_piles,
        chunk_bytes=DEFAULT_CHUNK_BYTES,
        skip_corrupt=False,
        label=None,
        policy=None,
        keep_unlabeled=False,
        dedup=None,
    ):
        self._store, self._generation, self._format_name = store, generation, format_name
        self._seed, self._num_piles, self._chunk_bytes, self._skip_corrupt = (
            seed,
            num_piles,
            chunk_bytes,
            skip_corrupt,
        )
        self._label, self._planner = label, None if policy is None else ClassPlanner(policy, seed)
        self._keep_unlabeled, self._dedup = keep_unlabeled, dedup

    def setup(self):
        prepare_worker()

    def process(self, group: WriterGroup, counts=None):
        files = StoreFiles(self._store, self._generation, group.writer)
        fmt = get_format(self._format_name)
        balance = (
            None if counts is None else (self._label, self._planner(counts), self._keep_unlabeled)
        )
        for source in group.sources:
            reading = SourcePiles(
                fmt,
                source,
                self._seed,
                _generation_stream(self._generation, source.id),
                self._chunk_bytes,
                self._skip_corrupt,
                self._num_piles,
                balance,
                dedup=self._dedup,
            )
            for _, _, parts in reading:
                for pile, part, part_fingerprint in parts:
                    files.append(pile, part, part_fingerprint)
            yield reading.stats()
        yield from files.commit_files()


def build_generation(
    pipeline,
    prefix,
    base,
    generation,
    groups,
    seed,
    skip_corrupt=False,
    lock_token=None,
    input_sizes=None,
    input_identities=None,
    allow_duplicates=False,
):
    """The template's graph for one generation: writer groups -> files -> publish (refused,
    unless ``allow_duplicates`` or the store deduplicates, when its records are exactly a live
    generation's). A dedup store marks each file's copies of earlier rows before publishing. A
    balanced store (``layout.store_balance``) first counts this generation's classes."""
    dedup = layout.store_dedup(base)
    items = _written_files(pipeline, prefix, base, generation, groups, seed, skip_corrupt, dedup)
    if dedup is not None:
        items = _marked_copies(items, prefix, base, generation, dedup)
    return publish(
        items,
        prefix,
        base,
        generation,
        len(groups),
        lock_token,
        input_sizes,
        input_identities,
        refuse_copies=not allow_duplicates and dedup is None,  # a dedup store hides copies
    )


def _written_files(pipeline, prefix, base, generation, groups, seed, skip_corrupt, dedup):
    """The writer groups' output: one ``SourceStats`` per source read and one ``StoreFile`` per
    pile a group wrote to; in a balanced store, each record as many times as its copies say."""
    balance = layout.store_balance(base)
    label, policy, keep_unlabeled = (None, None, False) if balance is None else balance
    return (
        pipeline
        | "ListWriterGroups" >> beam.Create(groups)
        | "SpreadWriterGroups" >> beam.Reshuffle()
        | "WriteStoreGroup"
        >> beam.ParDo(
            _WriteStoreGroup(
                names.store_dir(prefix),
                generation,
                base["format"],
                seed,
                base["num_piles"],
                skip_corrupt=skip_corrupt,
                label=label,
                policy=policy,
                keep_unlabeled=keep_unlabeled,
                dedup=dedup,
            ),
            **_generation_classes(
                pipeline, groups, base["format"], label, skip_corrupt, keep_unlabeled
            ),
        )
    )


class _KeyByPile(beam.DoFn):
    """A data file keyed by its pile; anything else (``SourceStats``) under ``None``."""

    def process(self, item):
        yield (item.pile if isinstance(item, StoreFile) else None, item)


def _marked_copies(items, prefix, base, generation, dedup):
    """A dedup store: each pile's new files with the rows that repeat an earlier live row
    recorded."""
    return (
        items
        | "KeyByPile" >> beam.ParDo(_KeyByPile())
        | "GatherPiles" >> beam.GroupByKey()
        | "MarkEarlierCopies"
        >> beam.ParDo(MarkEarlierCopies(prefix, generation, dedup, base["version"]))
    )


def _generation_classes(pipeline, groups, format_name, label, skip_corrupt, keep_unlabeled) -> dict:
    """In a balanced store, ``_WriteStoreGroup``'s ``counts`` side input: this generation's
    sources counted on their own (``counted_classes``, as ``run`` counts); else nothing."""
    if label is None:
        return {}
    sources = (
        pipeline
        | "ListSources" >> beam.Create([s for g in groups for s in g.sources])
        | "SpreadSources" >> beam.Reshuffle()
    )
    return counted_classes(sources, format_name, label, skip_corrupt, keep_unlabeled)


def write_generation(
    options, prefix, base, sources, seed, skip_corrupt, token, wait=None, allow_duplicates=False
):
    """Pass 1 of ``sources`` into the store as generation ``base['next_generation']``, under
    the store's lock (``lock.store_lock``), on the runner ``options`` name (with
    ``runner_defaults`` applied); returns the new manifest (or Beam's result when the runner is
    not waited for). A failure or Ctrl-C removes the generation's directory."""
    layout.remove_unpublished(prefix)
    try:
        generation = base["next_generation"]
        groups = writer_groups(sources, STORE_WRITERS)
        sizes = {s.path: s.size for s in sources}
        identities = {s.path: input_identity(s.path, s.size)[0] for s in sources}
        started = time.time()
        result = execute(
            options,
            lambda p: build_generation(
                p,
                prefix,
                base,
                generation,
                groups,
                seed,
                skip_corrupt,
                token,
                sizes,
                identities,
                allow_duplicates,
            ),
            len(groups),
            wait=wait,
        )
        if result is not None:
            return result
        manifest = layout.read_store_manifest(prefix)
        if manifest is None or manifest["version"] != base["version"] + 1:
            raise OutputError(
                f"the pipeline finished but {names.store_dir(prefix)} has no version "
                f"{base['version'] + 1}"
            )
    except BaseException:
        layout.remove_unpublished(prefix)
        raise
    manifest["wall_seconds"] = time.time() - started
    return manifest


def same_inputs(generation: dict, sources) -> bool:
    """Whether a generation was written from exactly ``sources`` (paths and sizes): a re-run."""
    listed = {(i["path"], i.get("bytes")) for i in generation["inputs"]}
    return listed == {(s.path, s.size) for s in sources}


def input_identity(path: str, size) -> tuple:
    """What makes an input the same file under any name: its real identity (resolved real
    path on a local disk, bucket + object on gs://; ``inputs.file_identity``) and its size."""
    return file_identity(path), size
