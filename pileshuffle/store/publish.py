"""A generation's publication: the step that runs once, after every data file is written.

``PublishGeneration`` checks that the files account for every record read (counts and
fingerprints), refuses (when asked) a generation that is a copy of a live one, and writes
the next manifest version, exclusively; then it releases the store's lock and removes the
composed use's work folders. Nothing is published unless every check passed. It emits from
``process`` (Beam's DaskRunner drops ``finish_bundle`` outputs).
"""

import apache_beam as beam
import pyarrow as pa

from pileshuffle import interrupt, names
from pileshuffle.engine.fragments import write_failure
from pileshuffle.engine.output_files import remove_tree, schema_json
from pileshuffle.engine.transforms.assign import SourceStats
from pileshuffle.engine.transforms.finalize import balance_section, check_accounted
from pileshuffle.engine.transforms.write import KeyByNone
from pileshuffle.errors import InputError
from pileshuffle.io import durable, storage
from pileshuffle.records.fingerprint import Fingerprint, total
from pileshuffle.store import layout
from pileshuffle.store.copies import generation_dedup
from pileshuffle.store.generation_files import StoreFile
from pileshuffle.store.lock import release_lock

__all__ = ["PublishGeneration", "stored_schema", "publish"]


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
        # path -> the file's real identity (inputs.file_identity)
        self._identities = dict(input_identities or {})
        self._refuse_copies = refuse_copies

    def process(self, element):
        _, items = element
        files = sorted(
            (i for i in items if isinstance(i, StoreFile)), key=lambda f: (f.pile, f.writer)
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
        generation = self._generation_entry(base, sources, stored, files)
        manifest = layout.next_manifest(
            base, [*base["generations"], generation], self._generation + 1
        )
        _settle(self._prefix, files)
        # Ctrl-C takes effect before or after, and no version is published after it
        with interrupt.publishing():
            layout.publish_manifest(self._prefix, manifest)
        if self._lock_token:
            release_lock(self._prefix, self._lock_token)
        for work_dir in sorted({f.work_dir for f in files if f.work_dir}):
            remove_tree(work_dir)
        yield manifest

    def _generation_entry(self, base: dict, sources: list, stored: Fingerprint, files) -> dict:
        """The generation as the manifest lists it: its inputs, totals, skipped records and
        files (and, in a balanced or dedup store, its balance or dedup section)."""
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
        return generation

    def _input(self, source) -> dict:
        entry = {
            "path": source.path,
            "records": source.fingerprint.records,
            "bytes": self._sizes.get(source.path),
        }
        if source.path in self._identities:
            entry["identity"] = self._identities[source.path]
        return entry


@interrupt.writes
def _settle(prefix: str, files: list):
    """The generation's files and their names on disk (``durable.settle``, then each folder)
    before a manifest version lists them: a version survives a crash of the machine. A write the
    disk fails only now (delayed allocation out of space) is the usual ``write_failure``."""
    directory = names.store_dir(prefix)
    paths = [layout.join(directory, f.path) for f in files]
    try:
        durable.settle_all(paths)
        for folder in sorted({storage.split(path)[0] for path in paths}):
            durable.settle_folder(folder)
    except OSError as error:
        raise write_failure(directory, error) from error


def _refuse_copy(prefix: str, base: dict, stored: Fingerprint, paths: list):
    """Refuse a generation whose records are exactly a live generation's: the same records,
    bytes, hash sum and xor. Its files are other files than that generation's inputs (the
    command refuses those by identity before it reads), so they look like copies of them,
    and publishing would repeat every one of those records in every epoch."""
    if not stored.records:
        return
    for live in base["generations"]:
        if Fingerprint.from_json(live["fingerprint"]) == stored:
            # none for a generation WritePileStore wrote
            inputs = [i["path"] for i in live["inputs"]]
            raise InputError(
                "--input",
                (
                    f"{_some(paths)} hold exactly the records of live generation "
                    f"{live['generation']} of {names.store_dir(prefix)} "
                    f"({stored.records:,} records, {stored.bytes:,} bytes, the same fingerprint): "
                    "they look like copies of its inputs"
                    f"{f' ({_some(inputs)})' if inputs else ''}, and appending them "
                    "would repeat those records in every epoch; nothing was published. "
                    "Pass --allow_duplicate_inputs if you mean it, or expire generation "
                    f"{live['generation']} first"
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


def publish(
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
    """``items`` (``StoreFile`` and ``SourceStats``) -> the published manifest: one leaf."""
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
