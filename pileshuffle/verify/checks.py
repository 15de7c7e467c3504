"""``pileshuffle verify``: re-read input and output and prove that nothing was lost,
duplicated or corrupted.

Checks, each fact reported once, in one line (a missing or damaged shard is named once; what
follows from it, as the totals' difference, is not repeated as a fingerprint's):
- shard names are complete: ``{output}-00000-of-M`` .. ``{output}-(M-1)-of-M`` with the
  format's suffix, and nothing else under the prefix (other shard counts, temp files);
- every shard's bytes have the size and CRC32C its manifest lists;
- every shard, from the same read of its bytes, reads back whole with the format's reader
  (TFRecord: both CRCs of every record; Parquet: the file opens, every row group reads, its
  schema is the manifest's);
- the manifest matches the files: per-shard path, records and bytes, the totals (one line),
  and where those agree the output fingerprint;
- the input (re-read as the run read it, skipping corrupt records only if the run did) has
  the manifest's input fingerprint, and the output's: the same multiset of records.

``verify_shards()`` returns the problems (an empty list means the output is proven good);
``pileshuffle verify`` (``commands.verify``) prints them.
"""

import zlib

from pileshuffle.engine.output_files import read_manifest, schema_json
from pileshuffle.errors import PileshuffleError
from pileshuffle.formats import get_format, read_fingerprint
from pileshuffle.io import held_bytes, storage
from pileshuffle.io.checksums import unreadable_bytes
from pileshuffle.names import manifest_path
from pileshuffle.records.fingerprint import Fingerprint
from pileshuffle.verify.expected import InputRead, read_input, with_copies
from pileshuffle.verify.shard_entry import damage, same_fields
from pileshuffle.verify.shard_names import basename, format_of_names, sort_shard_names
from pileshuffle.verify.wording import (
    describe,
    describe_count,
    describe_difference,
    describe_recorded,
)

__all__ = ["ShardVerifier", "verify_shards"]


def _manifest_or_none(prefix: str):
    """The manifest dict, or None if there is none; raises ValueError if it is not JSON."""
    return read_manifest(prefix) if storage.exists(manifest_path(prefix)) else None


class ShardVerifier:
    """The checks of one shard output at ``prefix`` (against ``input_glob`` when given): ``run()``
    returns the problems found, each one line; none means every check passed."""

    def __init__(self, input_glob, prefix, format=None):
        self.input_glob, self.prefix, self.format = input_glob, prefix, format
        self.problems = []
        self.output_fp = self.input_fp = None
        self.num_shards = 0
        self.manifest = None
        # a line already says the output (input) is not the manifest's
        self.output_off = self.input_off = False

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
                f"no manifest at {manifest_path(self.prefix)}: the run did not finish "
                "(or wrote elsewhere)"
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
            name = format_of_names(self.prefix)
        if name is None:
            self.problem(f"no shards under {self.prefix} and no --format: nothing to verify")
            return None
        return get_format(name)

    def _check_names(self, fmt, manifest):
        """The shards' paths in order ({index: (path, size)}); reports gaps and extras."""
        names = sort_shard_names(self.prefix, fmt, manifest)
        self.problems += names.problems
        self.output_off = self.output_off or bool(names.missing)
        self.num_shards = names.total
        return names.shards

    def _check_shards(self, fmt, shards, manifest):
        """Every shard read back whole and checked against its manifest entry; then, where every
        shard read, the manifest's shard count and totals (``_check_totals``)."""
        listed = {}
        if manifest is not None:
            for index, entry in enumerate(manifest.get("shards", [])):
                listed[index] = entry
        manifest_schema = (manifest or {}).get("schema")
        output_fp = Fingerprint()
        all_read = True
        for index, (path, size) in shards.items():
            fingerprint, schema, damaged = _read_shard(fmt, path, size, listed.get(index))
            # one line per damaged shard: the checks of what it holds would repeat it
            if damaged is not None:
                self.problem(damaged)
                all_read = False
                continue
            output_fp += fingerprint
            if fmt.name == "parquet" and manifest_schema is not None and schema is not None:
                if not same_fields(schema_json(schema)["fields"], manifest_schema.get("fields")):
                    self.problem(
                        f"shard {path}: its schema {schema_json(schema)['fields']} is not the "
                        f"manifest's {manifest_schema.get('fields')}"
                    )
            if manifest is not None:
                self.problems += _entry_problems(index, path, size, fingerprint, listed.get(index))
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
        """The shards' totals against the manifest's in one line; the fingerprint where they
        agree."""
        totals = manifest.get("totals", {})
        found = {
            "records": (output_fp.records, "records"),
            "payload_bytes": (output_fp.bytes, "payload bytes"),
            "shard_bytes": (shard_bytes, "bytes in files"),
        }
        off = [name for name, (value, _) in found.items() if totals.get(name) != value]
        if off:
            which = "the shards present hold" if self.output_off else "the shards hold"
            held = ", ".join("{:,} {}".format(*found[n]) for n in off)
            listed = ", ".join(describe_count(totals.get(n)) for n in off)
            self.problem(
                f"{which} {held}; the manifest's total{'s are' if len(off) > 1 else ' is'} {listed}"
            )
        recorded = manifest.get("output_fingerprint")
        if not off and (recorded is None or Fingerprint.from_json(recorded) != output_fp):
            self.problem(
                f"output fingerprint ({describe(output_fp)}) differs from the manifest's "
                f"({describe_recorded(recorded)}): the same count but different records"
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
                f"the manifest's input fingerprint ({describe_recorded(recorded_in)}) differs "
                f"from its output fingerprint ({describe_recorded(recorded)})"
            )
            self.output_off = True

    def _check_input(self, fmt, manifest):
        from pileshuffle.engine.inputs import match_inputs

        store = (manifest or {}).get("store") or {}
        if (store.get("options") or {}).get("balance") and "balance" not in manifest:
            self.problem(
                f"materialized from the store {store['prefix']} (version {store['version']}), "
                f"whose {len(store['generations'])} generations are each balanced on their own "
                "class counts: their copies cannot be recomputed as one run's; verify the store "
                f"itself (pileshuffle verify --input ... --output {store['prefix']})"
            )
            return

        try:
            sources = match_inputs(self.input_glob, self.prefix)
        except PileshuffleError as error:
            self.problem(f"input: {error}")
            return
        skip_corrupt = bool((manifest or {}).get("options", {}).get("skip_corrupt"))
        try:
            read = read_input(fmt, sources, manifest, skip_corrupt)
        except PileshuffleError as error:
            self.problem(f"input {error}")
            return
        input_fp, distinct = read.fingerprint, read.distinct
        self.input_fp = input_fp
        if manifest is not None:
            self._check_input_as_recorded(manifest, read)
        balance = (manifest or {}).get("balance")
        if balance is not None:  # the output holds the input's records with --balance's copies
            input_fp = with_copies(fmt, sources, manifest, skip_corrupt)
        if distinct is not None:  # the output holds the first of each distinct record
            self._check_dedup_counts(manifest, input_fp, distinct)
            input_fp = distinct
        if (
            self.output_fp is not None
            and input_fp != self.output_fp
            and not (self.output_off or self.input_off)
        ):
            held = describe_difference(self.output_fp, input_fp, "the input")
            self.problem(
                f"input and output differ (the output: {held}): input {describe(input_fp)}; "
                f"output {describe(self.output_fp)}"
            )

    def _check_input_as_recorded(self, manifest: dict, read: InputRead):
        """The input as re-read against what the manifest recorded of it: its fingerprint, its
        files, the corrupt records skipped and the blank lines."""
        input_fp, per_file = read.fingerprint, read.per_file
        recorded = manifest.get("input_fingerprint")
        if "store" in manifest and "balance" in manifest:
            recorded = None  # materialized: it read the stored copies, not the input
        if recorded is not None and Fingerprint.from_json(recorded) != input_fp:
            more = describe_difference(input_fp, Fingerprint.from_json(recorded), "the run read")
            self.problem(
                f"the input now reads as {describe(input_fp)}, not as the manifest recorded "
                f"({describe_recorded(recorded)}): {more}; the input changed or the run read it "
                "wrongly"
            )
            self.input_off = True
        listed = {basename(i["path"]): i["records"] for i in manifest.get("inputs", [])}
        if listed and set(listed) != {basename(p) for p in per_file}:
            self.problem(
                f"the input files ({len(per_file):,}) are not the ones the manifest lists "
                f"({len(listed):,})"
            )
        recorded_skips = manifest.get("skipped", {}).get("records", 0)
        if recorded_skips != read.skipped:
            self.problem(
                f"reading the input skips {read.skipped:,} corrupt record(s); the manifest says "
                f"{describe_count(recorded_skips)}"
            )
        recorded_blank = manifest.get("skipped", {}).get("blank_lines")
        if recorded_blank is not None and recorded_blank != read.blank:
            self.problem(
                f"the input holds {read.blank:,} blank line(s); the manifest says "
                f"{describe_count(recorded_blank)}"
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
                    f"{describe_count(section.get(name))}"
                )


def _read_shard(fmt, path: str, size: int, entry) -> tuple:
    """``(fingerprint, schema, None)`` of the shard at ``path`` read back whole, from one read of
    its bytes (``held_bytes``: its CRC32C, then its records; a Parquet file's own schema), or
    ``(None, None, line)``: the one line saying how it is damaged (its bytes against its manifest
    ``entry``, or what its reader found)."""
    try:
        data = storage.read_buffer(path)
    except (OSError, zlib.error, ValueError) as error:  # pyarrow's are OSError or ValueError
        cause = unreadable_bytes(path, error).removeprefix("is damaged: ")
        return None, None, f"shard {path} is damaged: {cause}"
    damaged = damage(data, size, entry)
    if damaged is not None:
        return None, None, f"shard {path} is damaged: {damaged}"
    try:
        with held_bytes.held(path, data):
            fingerprint, _, schema = read_fingerprint(fmt, path)
            if fmt.name == "parquet":
                schema = fmt.check_source(path)  # the file's own schema, also for 0 rows
    except PileshuffleError as error:
        return None, None, f"shard {path} is damaged: {error}"
    except Exception as error:  # a reader failing in an unexpected way is damage too
        cause = f"cannot be read ({type(error).__name__}: {error})"
        return None, None, f"shard {path} is damaged: {cause}"
    return fingerprint, schema, None


def _entry_problems(index: int, path: str, size: int, fingerprint: Fingerprint, entry) -> list:
    """The lines where the manifest's ``entry`` (None: the shard is not listed) does not say what
    the shard ``index`` at ``path`` is: its path, its records and its size."""
    if entry is None:
        return [f"shard {path} is not listed in the manifest"]
    problems = []
    if basename(entry.get("path", "")) != basename(path):
        problems.append(
            f"manifest entry {index} names {entry.get('path')}, but the shard is {path}"
        )
    if entry.get("records") != fingerprint.records:
        problems.append(
            f"shard {path} holds {fingerprint.records:,} records; the manifest says "
            f"{describe_count(entry.get('records'))}"
        )
    if entry.get("bytes") != size:
        problems.append(
            f"shard {path} is {size:,} bytes; the manifest says "
            f"{describe_count(entry.get('bytes'))}"
        )
    return problems


def verify_shards(input_glob, output_prefix: str, format=None) -> list:
    """Problems found with the shard output at ``output_prefix`` (and its input): none = every
    check passed."""
    return ShardVerifier(input_glob, output_prefix, format).run()
