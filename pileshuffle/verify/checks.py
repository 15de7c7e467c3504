"""``pileshuffle verify``: re-read input and output and prove that nothing was lost,
duplicated or corrupted.

Checks, each fact reported once, in one line (a missing or damaged shard is named once; what
follows from it, as the totals' difference, is not repeated as a fingerprint's):
- shard names are complete: ``{output}-00000-of-M`` .. ``{output}-(M-1)-of-M`` with the
  format's suffix, and nothing else under the prefix (other shard counts, temp files);
- every shard's bytes have the size and CRC32C its manifest lists;
- every shard reads back whole with the format's reader (TFRecord: both CRCs of every
  record; Parquet: the file opens, every row group reads, its schema is the manifest's);
- the manifest matches the files: per-shard path, records and bytes, the totals (one line),
  and where those agree the output fingerprint;
- the input (re-read as the run read it, skipping corrupt records only if the run did) has
  the manifest's input fingerprint, and the output's: the same multiset of records.

``verify_shards()`` returns the problems (an empty list means the output is proven good);
``pileshuffle verify`` (``commands.verify``) prints them.
"""

import posixpath
import re
import zlib

from pileshuffle.engine.dedup import Dedup, distinct_fingerprint
from pileshuffle.engine.output_files import read_manifest
from pileshuffle.engine.transforms.finalize import schema_json
from pileshuffle.errors import PileshuffleError
from pileshuffle.formats import FORMATS, ReadReport, get_format, read_fingerprint
from pileshuffle.formats.base import DEFAULT_CHUNK_BYTES
from pileshuffle.io import storage
from pileshuffle.io.checksums import crc32c_mismatch, unreadable_bytes
from pileshuffle.names import SHARD_TAIL, manifest_path, shard_name, shard_pattern
from pileshuffle.records.fingerprint import Fingerprint

__all__ = ["matching_files", "ShardVerifier", "verify_shards", "copies_fingerprint"]
_MISSING_NAMED = 10  # missing shards named one a line; one more line counts the rest


def _basename(path: str) -> str:
    return (
        posixpath.basename(path.rstrip("/"))
        if "://" in path
        else path.replace("\\", "/").rsplit("/", 1)[-1]
    )


def matching_files(pattern: str) -> dict:
    """{path: size} of the files matching ``pattern`` (empty when none do)."""
    try:
        return {f.path: f.size for f in storage.match(pattern)}
    except Exception:
        return {}


_NESTED_FIELD_NAME = re.compile(r"(list<)[^<>:,]+: ")  # list<item: int64>: the item's name
_MAP_ENTRIES_NAME = re.compile(r" \('[^']*'\)")  # map<string, int64 ('m')>: the entries' name


def _type_without_nested_names(type_name: str) -> str:
    """An Arrow type's text without the names of list items and map entries, which are not
    part of the type (Arrow's equality ignores them) and which Parquet renames on a round trip
    (``list<item: int64>`` reads back as ``list<element: int64>``, ``map<string, int64>`` as
    ``map<string, int64 ('m')>``)."""
    return _MAP_ENTRIES_NAME.sub("", _NESTED_FIELD_NAME.sub(r"\1", type_name))


def _same_fields(actual, recorded) -> bool:
    """Whether a shard's fields (``schema_json``) are the manifest's: names, nullability, types."""

    def comparable(fields):
        return [
            (f["name"], _type_without_nested_names(f["type"]), f["nullable"]) for f in fields or []
        ]

    return recorded is not None and comparable(actual) == comparable(recorded)


def _manifest_or_none(prefix: str):
    """The manifest dict, or None if there is none; raises ValueError if it is not JSON."""
    return read_manifest(prefix) if storage.exists(manifest_path(prefix)) else None


def _describe(fp: Fingerprint) -> str:
    return f"{fp.records:,} records, {fp.bytes:,} bytes, hash sum {fp.hash_sum:016x} xor {fp.hash_xor:016x}"


def _count(value) -> str:
    """A count with thousands separators, as every line writes it; anything else (a damaged manifest's) as it is."""
    return f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else repr(value)


def _recorded(value) -> str:
    try:
        return _describe(Fingerprint.from_json(value))
    except Exception:
        return f"unreadable: {value!r}"


class ShardVerifier:
    """The checks of one shard output at ``prefix`` (against ``input_glob`` when given): ``run()``
    returns the problems found, each one line; none means every check passed."""

    def __init__(self, input_glob, prefix, format=None):
        self.input_glob, self.prefix, self.format = input_glob, prefix, format
        self.problems = []
        self.output_fp = self.input_fp = None
        self.num_shards = 0
        self.manifest = None
        self.output_off = self.input_off = (
            False  # a line already says the output (input) is not the manifest's
        )

    def problem(self, text):
        self.problems.append(text)

    def run(self):
        try:
            manifest = _manifest_or_none(self.prefix)
        except (ValueError, OSError) as error:
            self.problem(f"{manifest_path(self.prefix)} cannot be read as JSON: {error}")
            manifest = None
        self.manifest = manifest
        if manifest is None and not self.problems:
            self.problem(
                f"no manifest at {manifest_path(self.prefix)}: the run did not finish (or wrote elsewhere)"
            )
        fmt = self._format(manifest)
        if fmt is None:
            return self.problems
        shards = self._check_names(fmt, manifest)
        self._check_shards(fmt, shards, manifest)
        if self.input_glob:
            self._check_input(fmt, manifest)
        return self.problems

    def _format(self, manifest):
        declared = (manifest or {}).get("format")
        if self.format and declared and self.format != declared:
            self.problem(
                f"{manifest_path(self.prefix)} says the format is {declared}, not {self.format}"
            )
        name = self.format or declared
        if name is None:
            suffixes = {
                SHARD_TAIL.match(_basename(p)[len(_basename(self.prefix)) :]).group(3)
                for p in matching_files(shard_pattern(self.prefix))
            }
            name = next(
                (f.name for f in FORMATS.values() for s in suffixes if s.startswith(f".{f.name}")),
                None,
            )
        if name is None:
            self.problem(f"no shards under {self.prefix} and no --format: nothing to verify")
            return None
        return get_format(name)

    def _check_names(self, fmt, manifest):
        """The shards' paths in order ({index: (path, size)}); reports gaps and extras."""
        found = matching_files(shard_pattern(self.prefix))
        compression = (manifest or {}).get("compression")
        expected_suffixes = (
            {fmt.suffix(compression)} if compression else {fmt.suffix("none"), fmt.suffix("gzip")}
        )
        counts = {}
        for path in found:
            name = _basename(path)
            match = (
                SHARD_TAIL.match(name[len(_basename(self.prefix)) :])
                if name.startswith(_basename(self.prefix))
                else None
            )
            if match is None or match.group(3) not in expected_suffixes:
                self.problem(
                    f"{path}: unexpected file under the output prefix (not a {fmt.name} shard name)"
                )
                continue
            counts.setdefault(int(match.group(2)), {})[int(match.group(1))] = (path, found[path])
        declared = (manifest or {}).get("num_piles")
        if declared is not None:
            total = int(declared)
        elif counts:
            total = max(counts, key=lambda m: len(counts[m]))
        else:
            total = 0
        for other in sorted(set(counts) - {total}):
            for index, (path, _) in sorted(counts[other].items()):
                self.problem(f"{path}: shard of another run (of {other:,}, not of {total:,})")
        shards = counts.get(total, {})
        for index in sorted(set(shards) - set(range(total))):
            self.problem(f"{shards[index][0]}: shard index {index} is out of range 0..{total - 1}")
        self._missing(fmt, manifest, total, sorted(set(range(total)) - set(shards)))
        if not found and total == 0:
            self.problem(f"{self.prefix}: no shards found")
        self.num_shards = total
        return {i: shards[i] for i in range(total) if i in shards}

    def _missing(self, fmt, manifest, total: int, missing: list):
        """One line per missing shard, with what its manifest lists (one more counts any past ``_MISSING_NAMED``)."""
        listed = (manifest or {}).get("shards") or []
        suffix = fmt.suffix((manifest or {}).get("compression") or "none")
        for index in missing[:_MISSING_NAMED]:
            path = shard_name(self.prefix, index, total, suffix)
            entry = listed[index] if index < len(listed) and isinstance(listed[index], dict) else {}
            held = (
                f" (its manifest lists it with {_count(entry.get('records'))} records, "
                f"{_count(entry.get('bytes'))} bytes)"
                if entry
                else ""
            )
            self.problem(f"shard {path} is missing{held}")
        if len(missing) > _MISSING_NAMED:
            self.problem(
                f"{len(missing) - _MISSING_NAMED:,} more of the {total:,} shards are missing "
                f"({missing[_MISSING_NAMED]:05d} .. {missing[-1]:05d})"
            )
        self.output_off = self.output_off or bool(missing)

    def _check_shards(self, fmt, shards, manifest):
        listed = {}
        if manifest is not None:
            for index, entry in enumerate(manifest.get("shards", [])):
                listed[index] = entry
        manifest_schema = (manifest or {}).get("schema")
        output_fp = Fingerprint()
        all_read = True
        for index, (path, size) in shards.items():
            damage = _damage(path, size, listed.get(index))
            if (
                damage is not None
            ):  # one line per damaged shard: the checks of what it holds would repeat it
                self.problem(f"shard {path} is damaged: {damage}")
                all_read = False
                continue
            try:
                fingerprint, _, schema = read_fingerprint(fmt, path)
                if fmt.name == "parquet":
                    schema = fmt.check_source(path)  # the file's own schema, also for 0 rows
            except PileshuffleError as error:
                self.problem(f"shard {path} is damaged: {error}")
                all_read = False
                continue
            except Exception as error:  # a reader failing in an unexpected way is damage too
                self.problem(
                    f"shard {path} is damaged: cannot be read ({type(error).__name__}: {error})"
                )
                all_read = False
                continue
            output_fp += fingerprint
            if fmt.name == "parquet" and manifest_schema is not None and schema is not None:
                if not _same_fields(schema_json(schema)["fields"], manifest_schema.get("fields")):
                    self.problem(
                        f"shard {path}: its schema {schema_json(schema)['fields']} is not the manifest's "
                        f"{manifest_schema.get('fields')}"
                    )
            entry = listed.get(index)
            if manifest is None:
                continue
            if entry is None:
                self.problem(f"shard {path} is not listed in the manifest")
                continue
            if _basename(entry.get("path", "")) != _basename(path):
                self.problem(
                    f"manifest entry {index} names {entry.get('path')}, but the shard is {path}"
                )
            if entry.get("records") != fingerprint.records:
                self.problem(
                    f"shard {path} holds {fingerprint.records:,} records; the manifest says "
                    f"{_count(entry.get('records'))}"
                )
            if entry.get("bytes") != size:
                self.problem(
                    f"shard {path} is {size:,} bytes; the manifest says {_count(entry.get('bytes'))}"
                )
        self.output_fp = output_fp if all_read else None
        self.output_off = self.output_off or not all_read
        if manifest is None or not all_read:
            return
        if len(listed) != self.num_shards:
            self.problem(
                f"the manifest lists {len(listed):,} shards; {self.num_shards:,} were expected"
            )
        self._check_totals(manifest, output_fp, sum(size for _, size in shards.values()))

    def _check_totals(self, manifest: dict, output_fp: Fingerprint, shard_bytes: int):
        """The shards' totals against the manifest's in one line; the fingerprint where they agree."""
        totals = manifest.get("totals", {})
        found = {
            "records": (output_fp.records, "records"),
            "payload_bytes": (output_fp.bytes, "payload bytes"),
            "shard_bytes": (shard_bytes, "bytes in files"),
        }
        off = [name for name, (value, _) in found.items() if totals.get(name) != value]
        if off:
            which = "the shards present hold" if self.output_off else "the shards hold"
            self.problem(
                f"{which} {', '.join('{:,} {}'.format(*found[n]) for n in off)}; the manifest's "
                f"total{'s are' if len(off) > 1 else ' is'} {', '.join(_count(totals.get(n)) for n in off)}"
            )
        recorded = manifest.get("output_fingerprint")
        if not off and (recorded is None or Fingerprint.from_json(recorded) != output_fp):
            self.problem(
                f"output fingerprint ({_describe(output_fp)}) differs from the manifest's "
                f"({_recorded(recorded)}): the same count but different records"
            )
            off = True
        self.output_off = self.output_off or bool(off)
        recorded_in = manifest.get("input_fingerprint")
        if (
            recorded_in is not None
            and "balance" not in manifest
            and "dedup" not in manifest
            and Fingerprint.from_json(recorded_in) != Fingerprint.from_json(recorded or recorded_in)
        ):
            self.problem(
                f"the manifest's input fingerprint ({_recorded(recorded_in)}) differs from its output "
                f"fingerprint ({_recorded(recorded)})"
            )
            self.output_off = True

    def _check_input(self, fmt, manifest):
        from pileshuffle.engine.inputs import match_inputs

        store = (manifest or {}).get("store") or {}
        if (store.get("options") or {}).get("balance") and "balance" not in manifest:
            self.problem(
                f"materialized from the store {store['prefix']} (version {store['version']}), whose "
                f"{len(store['generations'])} generations are each balanced on their own class counts: "
                f"their copies cannot be recomputed as one run's; verify the store itself "
                f"(pileshuffle verify --input ... --output {store['prefix']})"
            )
            return

        try:
            sources = match_inputs(self.input_glob, self.prefix)
        except PileshuffleError as error:
            self.problem(f"input: {error}")
            return
        skip_corrupt = bool((manifest or {}).get("options", {}).get("skip_corrupt"))
        dedup = Dedup.from_options((manifest or {}).get("options"))
        input_fp, skipped, blank, per_file, distinct = Fingerprint(), 0, 0, {}, None
        reports = []
        try:
            if dedup is not None:
                input_fp, distinct = distinct_fingerprint(
                    _content_chunks(fmt, sources, dedup, skip_corrupt, reports, per_file)
                )
            else:
                for source in sources:
                    fingerprint, report, _ = read_fingerprint(fmt, source.path, skip_corrupt)
                    input_fp += fingerprint
                    reports.append(report)
                    per_file[source.path] = fingerprint.records
        except PileshuffleError as error:
            self.problem(f"input {error}")
            return
        skipped = sum(r.skipped_records for r in reports)
        blank = sum(r.blank_lines for r in reports)
        self.input_fp = input_fp
        if manifest is not None:
            recorded = manifest.get("input_fingerprint")
            if (
                "store" in manifest and "balance" in manifest
            ):  # materialized: it read the stored copies, not the input
                recorded = None
            if recorded is not None and Fingerprint.from_json(recorded) != input_fp:
                read = _difference(input_fp, Fingerprint.from_json(recorded), "the run read")
                self.problem(
                    f"the input now reads as {_describe(input_fp)}, not as the manifest recorded "
                    f"({_recorded(recorded)}): {read}; the input changed or the run read it wrongly"
                )
                self.input_off = True
            listed = {_basename(i["path"]): i["records"] for i in manifest.get("inputs", [])}
            if listed and set(listed) != {_basename(p) for p in per_file}:
                self.problem(
                    f"the input files ({len(per_file):,}) are not the ones the manifest lists "
                    f"({len(listed):,})"
                )
            recorded_skips = manifest.get("skipped", {}).get("records", 0)
            if recorded_skips != skipped:
                self.problem(
                    f"reading the input skips {skipped:,} corrupt record(s); the manifest says "
                    f"{_count(recorded_skips)}"
                )
            recorded_blank = manifest.get("skipped", {}).get("blank_lines")
            if recorded_blank is not None and recorded_blank != blank:
                self.problem(
                    f"the input holds {blank:,} blank line(s); the manifest says {_count(recorded_blank)}"
                )
        balance = (manifest or {}).get("balance")
        if balance is not None:  # the output holds the input's records with --balance's copies
            input_fp = _with_copies(fmt, sources, manifest, skip_corrupt)
        if distinct is not None:  # the output holds the first of each distinct record
            self._check_dedup_counts(manifest, input_fp, distinct)
            input_fp = distinct
        if (
            self.output_fp is not None
            and input_fp != self.output_fp
            and not (self.output_off or self.input_off)
        ):
            held = _difference(self.output_fp, input_fp, "the input")
            self.problem(
                f"input and output differ (the output: {held}): input {_describe(input_fp)}; "
                f"output {_describe(self.output_fp)}"
            )

    def _check_dedup_counts(self, manifest: dict, read: Fingerprint, distinct: Fingerprint):
        """The manifest's ``dedup`` counts are the input's: records read, distinct kept, dropped."""
        section = manifest.get("dedup") or {}
        found = {
            "records_read": read.records,
            "records_kept": distinct.records,
            "records_dropped": read.records - distinct.records,
        }
        for name, count in found.items():
            if section.get(name) != count:
                self.problem(
                    f"the input holds {count:,} for the manifest's dedup {name}, which says "
                    f"{_count(section.get(name))}"
                )


def _difference(found: Fingerprint, than: Fingerprint, what: str) -> str:
    """How ``found`` differs from ``than`` (``what``: the records ``than`` counts), in records."""
    more = found.records - than.records
    return (
        f"{more:,} record(s) more than {what}"
        if more > 0
        else f"{-more:,} record(s) fewer than {what}"
        if more < 0
        else "the same count but different records"
    )


def _content_chunks(fmt, sources, dedup, skip_corrupt: bool, reports: list, per_file: dict):
    """``(content hashes, record hashes, lengths)`` of every chunk of ``sources`` in input order, as
    a ``--dedup`` run keys them (``Dedup.file_contents``); each file's ``ReadReport`` appended to ``reports``."""
    from pileshuffle.formats import record_lengths

    for source in sources:
        report, records = ReadReport(), 0
        for table, hashes, contents in dedup.file_contents(fmt, source.path, skip_corrupt, report):
            yield contents, hashes, record_lengths(table)
            records += table.num_rows
        reports.append(report)
        per_file[source.path] = records


def _damage(path: str, size: int, entry) -> str:
    """How a shard's bytes differ from the CRC32C its manifest ``entry`` lists (and its size, then), else None."""
    if entry is None or entry.get("crc32c") is None:
        return None
    try:
        data = storage.read_buffer(path)
    except (OSError, zlib.error, ValueError) as error:  # pyarrow's errors are OSError or ValueError
        return unreadable_bytes(path, error).removeprefix("is damaged: ")
    mismatch = crc32c_mismatch(data, entry["crc32c"])
    if mismatch is not None and entry.get("bytes") not in (None, size):
        return f"it is {size:,} bytes where its manifest lists {entry['bytes']:,}"
    return mismatch


def _with_copies(fmt, sources, manifest: dict, skip_corrupt: bool) -> Fingerprint:
    """The fingerprint of the input's records each as many times as ``--balance`` copies it,
    recomputed from the input as the run did (``copies_fingerprint``)."""
    from pileshuffle.engine.balance import from_manifest_options

    field, policy, keep_unlabeled = from_manifest_options(manifest.get("options", {}))
    return copies_fingerprint(
        fmt, sources, field, policy, int(manifest.get("seed") or 0), skip_corrupt, keep_unlabeled
    )


def copies_fingerprint(
    fmt,
    sources,
    field: str,
    policy,
    seed: int,
    skip_corrupt: bool = False,
    keep_unlabeled: bool = False,
) -> Fingerprint:
    """The fingerprint of ``sources``' records (``Source``s, ids = ranks as pass 1 numbered
    them) each as many times as ``policy`` copies it: their classes counted, then each
    record's copies, as pass 1 computes them (for a shard output, and a store's generation)."""
    from pileshuffle.engine.transforms.assign import INPUT_STREAM, copies_balance, keyed_chunks

    balance = copies_balance(fmt, sources, field, policy, seed, skip_corrupt, keep_unlabeled)
    total = Fingerprint()
    for source in sources:
        for _, _, hashes, lengths, _ in keyed_chunks(
            fmt,
            source,
            seed,
            (INPUT_STREAM, source.id),
            DEFAULT_CHUNK_BYTES,
            skip_corrupt,
            ReadReport(),
            balance,
        ):
            total += Fingerprint.of(hashes, int(lengths.sum()))
    return total


def verify_shards(input_glob, output_prefix: str, format=None) -> list:
    """Problems found with the shard output at ``output_prefix`` (and its input): none = every check passed."""
    return ShardVerifier(input_glob, output_prefix, format).run()
