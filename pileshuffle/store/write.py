"""Pass 1 into a pile store, as one new generation, and its publication.

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

``PublishGeneration`` runs once, after every file is written: it checks that the files
account for every record read (counts and fingerprints) and writes the next manifest
version, exclusively. Every DoFn here emits from ``process`` (Beam's DaskRunner drops
``finish_bundle`` outputs).
"""

import dataclasses

import apache_beam as beam
import pyarrow as pa

from pileshuffle import interrupt, names
from pileshuffle.engine.balance import ClassPlanner
from pileshuffle.engine.fragments import FragmentFiles, read_batches
from pileshuffle.engine.output_files import remove_tree
from pileshuffle.engine.transforms.assign import INPUT_STREAM, SourcePiles, SourceStats
from pileshuffle.engine.transforms.finalize import balance_section, check_accounted, schema_json
from pileshuffle.engine.transforms.graph import counted_classes
from pileshuffle.engine.transforms.write import KeyByNone
from pileshuffle.engine.tuning import prepare_worker
from pileshuffle.errors import InputError, OutputError
from pileshuffle.formats import get_format
from pileshuffle.formats.base import DEFAULT_CHUNK_BYTES
from pileshuffle.io import storage
from pileshuffle.names import store_writer_name
from pileshuffle.records.fingerprint import Fingerprint, total
from pileshuffle.store import layout
from pileshuffle.store.copies import MarkEarlierCopies, generation_dedup

__all__ = [
    "GENERATION_STREAM",
    "STORE_WRITERS",
    "WriterGroup",
    "writer_groups",
    "PublishGeneration",
    "stored_schema",
    "build_generation",
    "WritePileStore",
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
    """One writer of a generation and the sources it reads, in order (its data files are ``w{writer}``)."""

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


@dataclasses.dataclass(frozen=True)
class _StoreFile:
    """One written data file (its path relative to the store directory)."""

    generation: int
    pile: int
    writer: int
    path: str
    records: int
    bytes: int
    fingerprint: Fingerprint
    crc32c: str
    work_dir: str = None  # composed use: the fragments' run directory, removed after publishing
    copies: dict = None  # a dedup store: its rows that repeat an earlier live row (store.copies)

    def to_json(self) -> dict:
        entry = {
            "path": self.path,
            "pile": self.pile,
            "writer": self.writer,
            "records": self.records,
            "bytes": self.bytes,
            "crc32c": self.crc32c,
            "fingerprint": self.fingerprint.to_json(),
        }
        return entry if self.copies is None else {**entry, "copies": self.copies}


class _StoreFiles(FragmentFiles):
    """One writer's data files of a generation: one IPC stream per pile, temp then rename."""

    def __init__(self, store: str, generation: int, writer: int):
        super().__init__(
            storage.join(store, names.generation_dir_name(generation)), store_writer_name(writer)
        )
        self._store, self._generation, self._writer = store, generation, writer

    def relative(self, pile: int) -> str:
        return names.data_file_name(self._generation, pile, self._writer)

    def final_path(self, pile: int) -> str:
        return layout.join(self._store, self.relative(pile))

    def commit_files(self, work_dir=None):
        return [
            _StoreFile(
                self._generation,
                f.pile,
                self._writer,
                self.relative(f.pile),
                f.records,
                storage.size(f.path),
                f.fingerprint,
                f.crc32c,
                work_dir,
            )
            for f in self.commit()
        ]


class _WriteStoreGroup(beam.DoFn):
    """Pass 1 of one writer group into the store: emits one ``SourceStats`` per source and
    one ``_StoreFile`` per pile that received records. With the ``counts`` side input (the
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
        files = _StoreFiles(self._store, self._generation, group.writer)
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


class _WriteStorePile(beam.DoFn):
    """Composed use: copy one ``Pile`` (ShuffleToPiles' output, before any pass-2 order)
    into the generation as its single data file (writer 0): one file per pile."""

    def __init__(self, store, generation, num_piles):
        self._store, self._generation, self._num_piles = store, generation, num_piles

    def setup(self):
        prepare_worker()

    def process(self, pile):
        if pile.dedup is not None:
            raise OutputError(
                f"the store {self._store} keeps piles as pass 1 made them, duplicates included; "
                "ShuffleToPiles(dedup=...) drops them in pass 2: write its piles with WritePiles"
            )
        if pile.num_piles != self._num_piles:
            raise OutputError(
                f"the store {self._store} has {self._num_piles} piles; these records were "
                f"assigned to {pile.num_piles} (use ShuffleToPiles(num_piles={self._num_piles}))"
            )
        files = _StoreFiles(self._store, self._generation, 0)
        for fragment in pile.fragments:
            for batch in read_batches(fragment):
                files.append(pile.index, pa.Table.from_batches([batch]), Fingerprint())
        fingerprint = pile.fingerprint
        for stored in files.commit_files(pile.work_dir):
            yield dataclasses.replace(stored, fingerprint=fingerprint)


class PublishGeneration(beam.DoFn):
    """Check the generation against what was read (and, with ``refuse_copies``, that it is no
    copy of a live generation), then publish the next manifest version."""

    def __init__(
        self,
        prefix,
        base: dict,
        generation: int,
        writers: int,
        lock_token: str = None,
        input_sizes=None,
        input_identities=None,
        refuse_copies: bool = False,
    ):
        self._prefix, self._base, self._generation = prefix, base, generation
        self._writers, self._lock_token, self._sizes = writers, lock_token, dict(input_sizes or {})
        self._identities = dict(
            input_identities or {}
        )  # path -> the file's real identity (inputs.file_identity)
        self._refuse_copies = refuse_copies

    def process(self, element):
        _, items = element
        files = sorted(
            (i for i in items if isinstance(i, _StoreFile)), key=lambda f: (f.pile, f.writer)
        )
        sources = sorted((i for i in items if isinstance(i, SourceStats)), key=lambda s: s.source)
        stored = total(f.fingerprint for f in files)
        put_in = total(s.put_in for s in sources) if sources else stored  # with --balance's copies
        check_accounted(sources, put_in, stored, "add to the store", "the store files hold")
        if self._refuse_copies:
            _refuse_copy(self._prefix, self._base, stored, [s.path for s in sources])
        current = layout.manifest_versions(self._prefix)
        if current and current[-1] != self._base["version"]:
            raise layout.VersionConflict(
                storage.join(names.store_dir(self._prefix), names.store_manifest_name(current[-1]))
            )
        base = dict(self._base)
        if base["format"] == "parquet" and "schema" not in base and files:
            base["schema"] = schema_json(stored_schema(self._prefix, files[0].path))
        generation = {
            "generation": self._generation,
            "created": layout.now_iso(),
            "inputs": [self._input(s) for s in sources],
            "records": stored.records,
            "payload_bytes": stored.bytes,
            "fingerprint": stored.to_json(),
            "writers": self._writers,
            "skipped": {
                "records": sum(s.skipped_records for s in sources),
                "bytes": sum(s.skipped_bytes for s in sources),
                "problems": [p for s in sources for p in s.problems][:100],
                "blank_lines": sum(s.blank_lines for s in sources),
            },
            "files": [f.to_json() for f in files],
        }
        if any(s.classes for s in sources):
            generation["balance"] = balance_section(sources, base["options"])
        dedup = layout.store_dedup(base)
        if dedup is not None:
            generation["dedup"] = generation_dedup(dedup, self._generation, generation["files"])
        manifest = layout.next_manifest(
            base, [*base["generations"], generation], self._generation + 1
        )
        with (
            interrupt.publishing()
        ):  # Ctrl-C takes effect before or after, and no version is published after it
            layout.publish_manifest(self._prefix, manifest)
        if self._lock_token:
            layout.release_lock(self._prefix, self._lock_token)
        for work_dir in sorted({f.work_dir for f in files if f.work_dir}):
            remove_tree(work_dir)
        yield manifest

    def _input(self, source) -> dict:
        entry = {
            "path": source.path,
            "records": source.fingerprint.records,
            "bytes": self._sizes.get(source.path),
        }
        if source.path in self._identities:
            entry["identity"] = self._identities[source.path]
        return entry


def _refuse_copy(prefix: str, base: dict, stored: Fingerprint, paths: list):
    """Refuse a generation whose records are exactly a live generation's: the same records,
    bytes, hash sum and xor. Its files are other files than that generation's inputs (the
    command refuses those by identity before it reads), so they look like copies of them,
    and publishing would repeat every one of those records in every epoch."""
    if not stored.records:
        return
    for live in base["generations"]:
        if Fingerprint.from_json(live["fingerprint"]) == stored:
            inputs = [
                i["path"] for i in live["inputs"]
            ]  # none for a generation WritePileStore wrote
            raise InputError(
                "--input",
                (
                    f"{_some(paths)} hold exactly the records of live generation {live['generation']} of "
                    f"{names.store_dir(prefix)} ({stored.records:,} records, {stored.bytes:,} bytes, the same fingerprint): "
                    f"they look like copies of its inputs{f' ({_some(inputs)})' if inputs else ''}, and appending them "
                    f"would repeat those records in every epoch; nothing was published. Pass --allow_duplicate_inputs if "
                    f"you mean it, or expire generation {live['generation']} first"
                ),
            )


def _some(paths: list, shown: int = 3) -> str:
    more = f" and {len(paths) - shown} more" if len(paths) > shown else ""
    return ", ".join(paths[:shown]) + more


def stored_schema(prefix: str, relative: str):
    """The record columns' Arrow schema of a data file (with the source's metadata)."""
    from pileshuffle.names import HASH_COLUMN, KEY_COLUMN

    with storage.open_read(
        layout.join(names.store_dir(prefix), relative), storage.UNCOMPRESSED
    ) as handle:
        schema = pa.ipc.open_stream(handle).schema
    keep = [i for i, name in enumerate(schema.names) if name not in (KEY_COLUMN, HASH_COLUMN)]
    return pa.schema([schema.field(i) for i in keep], metadata=schema.metadata)


def _publish(
    items,
    prefix,
    base,
    generation,
    writers,
    lock_token=None,
    input_sizes=None,
    input_identities=None,
    refuse_copies=False,
):
    """``items`` (``_StoreFile`` and ``SourceStats``) -> the published manifest: one leaf."""
    return (
        items
        | "KeyForPublish" >> beam.ParDo(KeyByNone())
        | "GatherForPublish" >> beam.GroupByKey()
        | "PublishGeneration"
        >> beam.ParDo(
            PublishGeneration(
                prefix,
                base,
                generation,
                writers,
                lock_token,
                input_sizes,
                input_identities,
                refuse_copies,
            )
        )
    )


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
    store, balance, dedup = (
        names.store_dir(prefix),
        layout.store_balance(base),
        layout.store_dedup(base),
    )
    label, policy, keep_unlabeled = (None, None, False) if balance is None else balance
    items = (
        pipeline
        | "ListWriterGroups" >> beam.Create(groups)
        | "SpreadWriterGroups" >> beam.Reshuffle()
        | "WriteStoreGroup"
        >> beam.ParDo(
            _WriteStoreGroup(
                store,
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
    if dedup is not None:
        items = _marked_copies(items, prefix, base, generation, dedup)
    return _publish(
        items,
        prefix,
        base,
        generation,
        len(groups),
        lock_token,
        input_sizes,
        input_identities,
        refuse_copies=not allow_duplicates and dedup is None,
    )  # a dedup store hides copies


class _KeyByPile(beam.DoFn):
    """A data file keyed by its pile; anything else (``SourceStats``) under ``None``."""

    def process(self, item):
        yield (item.pile if isinstance(item, _StoreFile) else None, item)


def _marked_copies(items, prefix, base, generation, dedup):
    """A dedup store: each pile's new files with the rows that repeat an earlier live row recorded."""
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


class WritePileStore(beam.PTransform):
    """Write ``Pile`` elements (``ShuffleToPiles``' output) into the pile store at
    ``prefix`` as one new generation; returns a PCollection holding the published manifest.

    The store is created (version 1) if it does not exist, with ``format``, ``num_piles``
    and ``seed`` (what materialize and the loader report); an existing store must have the
    same format and number of piles, and no ``--balance`` (a balanced store's generations
    come from ``append``). Each pile becomes one data file (writer 0): at most
    ``num_piles`` files per generation. Records are stored in ShuffleToPiles' canonical
    fragment order with their keys; ShuffleToPiles' keys come from ``seed`` (unkeyed:
    uniform but not reproducible; ``keyed=True``: a function of the ids). The store's
    lock is taken when the pipeline is built and released when the generation is
    published (a failed pipeline leaves it; the next command in this process or after this
    process has ended takes it over). Not on Beam's DaskRunner (ShuffleToPiles refuses it).
    """

    def __init__(
        self, prefix, format, num_piles=None, seed=0, compression="auto", max_pile_bytes=64 << 20
    ):
        super().__init__()
        self._prefix = layout.clean_prefix(prefix)
        fmt = get_format(format)
        self._format, self._num_piles, self._seed = fmt.name, num_piles, int(seed)
        self._compression = fmt.output_compression(compression, [])
        self._max_pile_bytes = int(max_pile_bytes)

    def expand(self, piles):
        token = layout.StoreLock(
            self._prefix, "WritePileStore (a Beam pipeline)", same_process_is_stale=True
        ).acquire()
        base = layout.read_store_manifest(self._prefix)
        if base is None:
            if self._num_piles is None:
                raise ValueError("WritePileStore needs num_piles to create a new store")
            base = layout.new_manifest(
                self._format, self._compression, self._num_piles, self._seed, self._max_pile_bytes
            )
        if base["format"] != self._format or (
            self._num_piles is not None and base["num_piles"] != int(self._num_piles)
        ):
            layout.release_lock(self._prefix, token)
            raise OutputError(
                f"the store {names.store_dir(self._prefix)} holds {base['format']} in "
                f"{base['num_piles']} piles, not {self._format} in {self._num_piles}"
            )
        if layout.store_dedup(base) is not None:
            layout.release_lock(self._prefix, token)
            raise OutputError(
                f"the store {names.store_dir(self._prefix)} keys every record by its content to keep each "
                f"distinct one once (--dedup); WritePileStore's piles are keyed otherwise: add records "
                f"with `pileshuffle append`"
            )
        if layout.store_balance(base) is not None:
            layout.release_lock(self._prefix, token)
            raise OutputError(
                f"the store {names.store_dir(self._prefix)} balances every generation by "
                f"{base['options']['label_field']!r} ({base['options']['balance']}); WritePileStore writes "
                f"records as they come: add them with `pileshuffle append`"
            )
        generation = base["next_generation"]
        layout.remove_unpublished(self._prefix)
        items = piles | "WriteStorePile" >> beam.ParDo(
            _WriteStorePile(names.store_dir(self._prefix), generation, base["num_piles"])
        )
        return _publish(items, self._prefix, base, generation, 1, token)
