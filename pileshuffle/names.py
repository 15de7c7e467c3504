"""Every name pileshuffle gives a file on disk, and the manifests' kinds and format version.

This module is the one place these are spelled (docs/format.md describes them for other
tools). It is pure: no I/O, no Beam, no pyarrow; every layer may import it.

A shard output at prefix ``P``::

    P-00000-of-00064.tfrecord ...  shards (the suffix is the format's, plus .gz)
    P-manifest.json                written last: its presence means the output is complete
    P.pileshuffle-staging/         while a run publishes: staged shards, journals
    P.pileshuffle-lock             while a run holds the output
    .pileshuffle-work-<digest>/    a run's pile fragments (beside P, or under --temp_location)

A pile store at prefix ``P`` is the folder ``P-store/``::

    manifest-00000001.json         one per published version; the highest is current
    g000000/p00000-w00000.arrows   generation 0, pile 0, writer 0: Arrow IPC of that pile's records
    LOCK                           while a command changes the store
"""

import re

# -- manifests ----------------------------------------------------------------------------------

SHARDS_KIND = "pileshuffle-shards"  # a shard output's manifest
STORE_KIND = "pileshuffle-store"  # a store's manifest version
# MAJOR.MINOR of the manifests' schema: a MINOR adds keys old readers may ignore; a MAJOR
# changes what a key means, and a reader refuses a MAJOR newer than its own.
# 1.1: input records keyed by their place in the file (keys.position_keys), not their rank;
# 1.2: every shard and store data file listed with its CRC32C (checksums);
# 1.3: a shard output's `between_passes` (bytes written, kept in memory, shuffled between the
#      passes);
# 1.4: `--dedup`'s content keys (stream 3) and a shard output's `dedup` section;
# 1.5: a dedup store (`options.dedup`, `totals.distinct`, a generation's `dedup`, a data file's
#      `copies` and its copies file: copy_marks);
# 1.6: Parquet shards dictionary-encode only the columns whose first rows repeat
#      (formats/parquet_layout), and their pages end where the rows do, not where pass 2 cut a pile
FORMAT_VERSION = "1.6"
# stores' manifests carried `store_format: 1` before `format_version`; kept for older readers
LEGACY_STORE_FORMAT = 1


def format_problem(manifest: dict) -> str:
    """Why this pileshuffle cannot read a manifest's format ("" when it can): a
    ``format_version`` whose MAJOR is newer than ``FORMAT_VERSION``'s, or not MAJOR.MINOR.
    A manifest written before the key existed is 1.0."""
    text = str(manifest.get("format_version", "1.0"))
    major, _, minor = text.partition(".")
    if not (major.isdigit() and minor.isdigit()):
        return f"has format_version {text!r}, which is not MAJOR.MINOR"
    ours = FORMAT_VERSION.split(".")[0]
    if int(major) > int(ours):
        return (
            f"has format_version {text}, written by a newer pileshuffle (this one reads {ours}.x): "
            "upgrade pileshuffle to read it"
        )
    return ""


def manifest_header(kind: str) -> dict:
    """The keys every manifest starts with."""
    return {"kind": kind, "format_version": FORMAT_VERSION}


# -- a shard output -----------------------------------------------------------------------------

MANIFEST_SUFFIX = "-manifest.json"  # after the prefix: a shard output's manifest
# shard numbers have five digits, or as many as the count of shards has beyond 99,999 (shard_name)
SHARD_NAME = re.compile(r"^(?P<prefix>.+)-[0-9]{5,}-of-[0-9]{5,}(?:\.[^/]*)?$")  # a shard's path
SHARD_TAIL = re.compile(r"^-(\d{5,})-of-(\d{5,})(.*)$")  # what follows the prefix in a shard name
SHARD_NUMBERS = re.compile(r"-[0-9]{5,}-of-[0-9]{5,}$")  # a TFDS-style tail before an extension
# in the staging folder: what an unfinished publication creates and deletes
JOURNAL_PREFIX = "journal-"
WORK_PREFIX = ".pileshuffle-work-"  # a run's work folder, before its digest
# a path inside a run's work or staging folder, or its lock: what a run leaves while it runs, never
# input
WORK_DIRECTORY = re.compile(
    r"(?:^|/)(?:\.pileshuffle-work-[0-9a-f]+/|[^/]+\.pileshuffle-staging/|[^/]+\.pileshuffle-lock)"
)


def shard_name(prefix: str, index: int, num_piles: int, suffix: str) -> str:
    """Shard ``index`` of ``num_piles`` at ``prefix``: ``P-00003-of-00064`` + ``suffix``. Both
    numbers have five digits, or as many as ``num_piles`` has (``P-000003-of-123456``): the
    names of one output have one width, so they sort in shard order."""
    width = max(5, len(str(num_piles)))
    return f"{prefix}-{index:0{width}d}-of-{num_piles:0{width}d}{suffix}"


def manifest_path(prefix: str) -> str:
    """A shard output's manifest, ``P-manifest.json``: written last, so its presence means
    complete."""
    return f"{prefix}{MANIFEST_SUFFIX}"


def prefix_of_manifest(path: str):
    """The output prefix whose manifest ``path`` is, or None."""
    return path[: -len(MANIFEST_SUFFIX)] if path.endswith(MANIFEST_SUFFIX) else None


def staging_dir(prefix: str) -> str:
    """Where a run stages shards and journals while it publishes: ``P.pileshuffle-staging``."""
    return f"{prefix}.pileshuffle-staging"


def output_lock_path(prefix: str) -> str:
    """The lock a ``run`` to ``prefix`` holds."""
    return f"{prefix}.pileshuffle-lock"


def journal_name(token: str) -> str:
    """A publication's journal in the staging folder (the files it is renaming into place)."""
    return f"{JOURNAL_PREFIX}{token}.json"


def staged_manifest_name(token: str) -> str:
    """The staged manifest of publication ``token`` in the staging folder."""
    return f"manifest-{token}.json"


def work_dir_name(digest: str) -> str:
    """A run's work folder for its pile fragments: ``.pileshuffle-work-<digest>``."""
    return f"{WORK_PREFIX}{digest}"


def literal_pattern(path: str) -> str:
    """A glob pattern that matches ``path`` itself: its wildcard characters each in a
    character class (``[`` as ``[\\[]``), since Beam's globs have no escape."""
    return re.sub(r"([\[*?])", lambda m: "[\\[]" if m.group(1) == "[" else f"[{m.group(1)}]", path)


def shard_pattern(prefix: str) -> str:
    """A glob of every file named like a shard of ``prefix``, numbers of five digits or more (a
    glob has no repetition: what it matches beyond a shard's name, ``SHARD_TAIL`` tells apart)."""
    return f"{literal_pattern(prefix)}-[0-9][0-9][0-9][0-9][0-9]*-of-[0-9][0-9][0-9][0-9][0-9]*"


def attempt_name(path: str, token: str) -> str:
    """``path`` as one attempt writes it in a staging folder:
    ``shard-00000-of-00004-<token>.tfrecord``."""
    folder, slash, name = path.rpartition("/")
    stem, dot, suffix = name.partition(".")
    return f"{folder}{slash}{stem}-{token}{dot}{suffix}"


def temp_name(path: str, token: str) -> str:
    """Where ``path`` is written before it is renamed into place (one ``token`` per attempt)."""
    return f"{path}.tmp-{token}"


# -- columns of pile fragments and store files (Arrow IPC) ----------------------------------------

RECORD_COLUMN = "record"  # a payload, as a user sees it (bytes formats; composed runs)
# a whole TFRecord frame as read (length, CRCs, data): copied verbatim
FRAME_COLUMN = "tfrecord_frame"
LINE_COLUMN = "line"  # a JSONL line with its newline
# a WebDataset sample's raw tar bytes: its members' headers, data and padding
TAR_SAMPLE_COLUMN = "tar_sample"
KEY_COLUMN = "_pileshuffle_key"  # U, the record's uint64 sort key
HASH_COLUMN = "_pileshuffle_hash"  # the record's pass-1 fingerprint hash, carried to pass 2


# -- pile fragments (a run's work folder) --------------------------------------------------------

FRAGMENT_EXTENSION = ".arrows"  # Arrow IPC streams: pile fragments and store data files
# pass 1's runs: pile segments in pile order and their index (pileshuffle.engine.runs)
RUN_EXTENSION = ".run"


def source_writer_name(source_id: int, span_start: int = 0) -> str:
    """The name pass 1 gives the runs of a group of sources that starts with this source (the
    span of its file from byte ``span_start``)."""
    return f"s{source_id:06d}" + (f"-b{span_start:013d}" if span_start else "")


def split_writer_name(token: str, depth: int, index: int) -> str:
    """The name of the fragments an oversized pile is split into (depth: how often split)."""
    return f"{token}-d{depth}-p{index:06d}"


def run_name(writer: str, run: int) -> str:
    """The ``run``-th run pass 1's ``writer`` (a group of sources, a bundle) writes
    (``pileshuffle.engine.runs``)."""
    return f"{writer}-r{run:05d}{RUN_EXTENSION}"


def fragment_name(writer: str, pile: int) -> str:
    """The fragment file of ``pile`` that ``writer`` (a source or a split) writes."""
    return f"{writer}-p{pile:06d}{FRAGMENT_EXTENSION}"


# -- a --balance run's class codes (in its work folder: the counting pass writes, pass 1 reads) --

CLASS_CODES_DIR = "classes"  # in the work folder


def class_codes_names(source_id: int) -> tuple:
    """``(codes, classes, lines)``: the files of one source's labels as the counting pass read them,
    each record's class code (uint32), the classes in code order (JSON) and, for JSONL, each
    line's length (uint32)."""
    return f"s{source_id:06d}.codes", f"s{source_id:06d}.classes.json", f"s{source_id:06d}.lines"


# -- a pile store ------------------------------------------------------------------------------

STORE_SUFFIX = "-store"  # after the prefix: a pile store's folder
STORE_LOCK_NAME = "LOCK"  # in the store's folder while a command changes the store
# a manifest version's file name (group 1: the version)
STORE_MANIFEST_NAME = re.compile(r"^manifest-(\d{8})\.json$")
STORE_MANIFEST_GLOB = "manifest-*.json"  # every manifest version in the store's folder
GENERATION_DIR = re.compile(r"^g(\d{6})$")  # a generation's folder name (group 1: the generation)
# any path inside a store
STORE_FILE = re.compile(r"-store/(g\d{6}/|manifest-\d{8}\.json$|\.manifest-|LOCK)")


def store_dir(prefix: str) -> str:
    """The folder of the pile store at ``prefix``: ``P-store``."""
    return f"{prefix}{STORE_SUFFIX}"


def store_manifest_name(version: int) -> str:
    """The name of manifest ``version`` in a store's folder (the highest is current)."""
    return f"manifest-{version:08d}.json"


def generation_dir_name(generation: int) -> str:
    """The folder of one store generation's data files: ``g000000``."""
    return f"g{generation:06d}"


def store_writer_name(writer: int) -> str:
    """The part of a store data file's name that names its writer: ``w00000``."""
    return f"w{writer:05d}"


def data_file_name(generation: int, pile: int, writer: int) -> str:
    """A store data file's path relative to the store folder (as its manifest lists it)."""
    writer_name = store_writer_name(writer)
    return f"{generation_dir_name(generation)}/p{pile:05d}-{writer_name}{FRAGMENT_EXTENSION}"


def is_store_file(path: str) -> bool:
    """Whether ``path`` is inside a pile store's folder (data, manifest or lock)."""
    return STORE_FILE.search(path.replace("\\", "/")) is not None


__all__ = [
    "SHARDS_KIND",
    "STORE_KIND",
    "FORMAT_VERSION",
    "LEGACY_STORE_FORMAT",
    "format_problem",
    "manifest_header",
    "MANIFEST_SUFFIX",
    "SHARD_NAME",
    "SHARD_TAIL",
    "SHARD_NUMBERS",
    "JOURNAL_PREFIX",
    "WORK_PREFIX",
    "WORK_DIRECTORY",
    "shard_name",
    "manifest_path",
    "prefix_of_manifest",
    "staging_dir",
    "output_lock_path",
    "journal_name",
    "staged_manifest_name",
    "work_dir_name",
    "literal_pattern",
    "shard_pattern",
    "temp_name",
    "attempt_name",
    "RECORD_COLUMN",
    "FRAME_COLUMN",
    "LINE_COLUMN",
    "TAR_SAMPLE_COLUMN",
    "KEY_COLUMN",
    "HASH_COLUMN",
    "FRAGMENT_EXTENSION",
    "RUN_EXTENSION",
    "source_writer_name",
    "split_writer_name",
    "run_name",
    "fragment_name",
    "CLASS_CODES_DIR",
    "class_codes_names",
    "STORE_SUFFIX",
    "STORE_LOCK_NAME",
    "STORE_MANIFEST_NAME",
    "STORE_MANIFEST_GLOB",
    "GENERATION_DIR",
    "STORE_FILE",
    "store_dir",
    "store_manifest_name",
    "generation_dir_name",
    "store_writer_name",
    "data_file_name",
    "is_store_file",
]
