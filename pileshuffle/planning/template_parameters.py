"""The template's parameters, defined once: ``--help``, the pipeline's option parser
(``parameters.PileshuffleOptions``), ``templates/metadata.json`` and ``parameters.check_values``
are all generated from ``PARAMETERS``. A parameter's help text is what the user reads in all of
them: tests/test_template.py holds metadata.json to it.
"""

import dataclasses

__all__ = ["Parameter", "PARAMETERS"]


@dataclasses.dataclass(frozen=True)
class Parameter:
    """One template parameter: its option (``--name``), label, help text and example (what
    ``--help`` and metadata.json show), its default (None: required) and what a value may be
    (``choices``, ``regex``, ``kind``; ``flag``: true or false, given bare; ``param_type``: what
    the Dataflow Console asks for)."""

    name: str
    label: str
    help: str
    example: str
    default: object = None
    choices: tuple = ()
    regex: str = None
    kind: type = str
    flag: bool = False
    metavar: str = "VALUE"
    # metadata.json's paramType (flags: BOOLEAN); on Dataflow paths must be gs://
    param_type: str = "TEXT"

    @property
    def optional(self) -> bool:
        return self.default is not None or self.flag

    @property
    def usage(self) -> str:
        """``--name VALUE`` as ``--help`` shows it."""
        if self.flag:
            return f"--{self.name}"
        return f"--{self.name} " + (
            "{" + ",".join(self.choices) + "}" if self.choices else self.metavar
        )


# a size as the template's parameters accept it
_SIZE_TEXT = r"[0-9]+(\.[0-9]+)?([KMGT]i?B?|[kmgt]i?b?)?"

# the template's parameters, in the order --help and metadata.json show them
PARAMETERS = (
    Parameter(
        "input",
        "Input files",
        "Comma-separated file patterns to shuffle: local paths or any location Beam's FileSystems "
        "opens (gs://...); a comma inside a path is written \\,. Compression is detected from each "
        "file name (.gz).",
        "gs://my-bucket/data/train-*.tfrecord",
        regex=r"^[^\n]+$",
        metavar="PATTERNS",
        param_type="GCS_READ_FILE",
    ),
    Parameter(
        "output",
        "Output prefix",
        "Path prefix of the output: shards are {output}-00000-of-00064.tfrecord etc., plus "
        "{output}-manifest.json.",
        "gs://my-bucket/shuffled/train",
        regex=r"^[^\n,*?]+$",
        metavar="PREFIX",
        param_type="GCS_WRITE_FILE",
    ),
    Parameter(
        "format",
        "Record format",
        "Format of input and output records. auto: from the input files' extension (.tfrecord, "
        ".parquet, .jsonl, .tar, with .gz for the byte formats); every file must say the same. "
        "Give a format to read files whose names say none.",
        "parquet",
        default="auto",
        choices=("auto", "tfrecord", "parquet", "jsonl", "tar"),
    ),
    Parameter(
        "compression",
        "Output compression",
        "auto: as the input (gzip if every input is .gz; Parquet: snappy); none; gzip. Parquet "
        "also takes snappy, zstd.",
        "auto",
        default="auto",
        choices=("auto", "none", "gzip", "snappy", "zstd"),
    ),
    Parameter(
        "num_piles",
        "Number of piles",
        "Number of piles = output shards, or auto to size piles from the input and max_pile_bytes.",
        "auto",
        default="auto",
        regex=r"^(auto|[1-9][0-9]*)$",
        metavar="{auto,N}",
    ),
    Parameter(
        "max_pile_bytes",
        "Largest pile in memory",
        "Upper bound on the records of one pile held in a worker's memory (num_piles=auto plans "
        "piles of at most this with s + 6*sqrt(s) headroom; a larger pile is split again). auto: a "
        "third of what one worker thread holds (Dataflow: from the worker machine type and its "
        "threads; locally: from --memory), at least 8 piles per thread, within 64MiB and 1GiB; "
        "other runners 64MiB. Suffixes KiB, MiB, GiB; at least 1MiB with num_piles=auto.",
        "1GiB",
        default="auto",
        regex=f"^(auto|{_SIZE_TEXT})$",
        metavar="SIZE",
    ),  # as materialize's
    Parameter(
        "run_bytes",
        "Pass-1 run per writer",
        "How much of pass 1's output one writer gathers before it writes it as one pile-ordered "
        "run (files mode) or sends it as one element per pile (shuffle mode): a pile's part is "
        "about run_bytes / num_piles. auto: num_piles x 64KiB, at least 64MiB and at most 1GiB; "
        "files mode on an object store (gs://): num_piles x 256KiB, up to 32GiB, as pass 2 pays a "
        "request per part there. Memory: up to 1GiB per worker thread; a larger run is spilled to "
        "the local temp folder and merged.",
        "512MiB",
        default="auto",
        regex=f"^(auto|{_SIZE_TEXT})$",
        metavar="{auto,SIZE}",
    ),
    Parameter(
        "memory",
        "Memory budget of a local run",
        "How much memory a run on the local runner may use: what pass 1 and pass 2 hold, and pass "
        "1's runs kept in memory between the passes instead of in the temp folder (a run that does "
        "not fit goes there). auto: 60% of the memory available when it starts. The output is the "
        "same for any budget; one no larger than what the passes hold (plan's memory line) keeps "
        "every run on disk. Other runners keep runs in the temp location.",
        "8GiB",
        default="auto",
        regex=f"^(auto|{_SIZE_TEXT})$",
        metavar="{auto,SIZE}",
    ),
    Parameter(
        "seed",
        "Random seed",
        "Seed of the shuffle: the same input, seed and piles give the same bytes.",
        "42",
        default="0",
        regex=r"^[0-9]+$",
        kind=int,
        metavar="N",
    ),
    Parameter(
        "intermediate",
        "Intermediate mode",
        "files: pass 1 writes pile fragments to the temp location and only their names are grouped "
        "(bounded memory on local runners); shuffle: records are grouped in per-pile chunks by the "
        "runner (use on Dataflow's Shuffle).",
        "files",
        default="files",
        choices=("files", "shuffle"),
    ),
    Parameter(
        "layout",
        "Output layout",
        "shards: shuffled shards (both passes); store: pass 1 only, into a pile store "
        "{output}-store/ that `pileshuffle append` extends, `expire` trims and `materialize` or "
        "the loader turns into shuffled order.",
        "shards",
        default="shards",
        choices=("shards", "store"),
    ),
    Parameter(
        "overwrite",
        "Overwrite output",
        "Replace an existing output with the same prefix.",
        "true",
        flag=True,
        regex=r"^(true|false)$",
    ),
    Parameter(
        "label_field",
        "Label field (for balance)",
        "The class of every record, for --balance: a Parquet column, a JSON key, a "
        "tf.train.Example feature (TFRecord) or a member extension (tar, e.g. cls). (--label "
        "itself is Beam's: Dataflow job labels.)",
        "label",
        default="",
        regex=r"^[^\n]*$",
        metavar="FIELD",
    ),
    Parameter(
        "balance",
        "Class balance",
        "Write each --label_field class to a target count, the copies spread over the output: "
        "uniform (every class as large as the largest), sqrt (class ratios become their square "
        "roots) or CLASS=WEIGHT,... (target shares). A first pass counts the classes. Records are "
        "copied, none dropped, unless --undersample.",
        "uniform",
        default="",
        regex=r"^[^\n]*$",
        metavar="POLICY",
    ),
    Parameter(
        "undersample",
        "Undersample instead",
        "With --balance: cut large classes down (an evenly spaced subset) instead of copying small "
        "ones up.",
        "false",
        flag=True,
        regex=r"^(true|false)$",
    ),
    Parameter(
        "keep_unlabeled",
        "Keep unlabeled records",
        "With --balance: a record without the --label_field label (or whose label cannot be read) "
        "is the class null, as a null label is, instead of stopping the run.",
        "false",
        flag=True,
        regex=r"^(true|false)$",
    ),
    Parameter(
        "dedup",
        "Exact deduplication",
        "exact: write each distinct record once (the first of its copies in input order), compared "
        "by its bytes (a Parquet row by its values); duplicates meet in one pile, so it costs no "
        "extra pass. The manifest and the summary say how many were dropped. key: by the value of "
        "--dedup_key (which alone means key). none: keep every record. With --layout store: each "
        "distinct record of the store's live window once (the oldest live copy), through every "
        "append and expire.",
        "key",
        default="none",
        choices=("none", "exact", "key"),
    ),
    Parameter(
        "dedup_key",
        "Deduplicate by field",
        "Keep one record per value of this field (the first in input order): a Parquet column, a "
        "JSON key, a tf.train.Example feature (TFRecord) or a member extension (tar), compared as "
        "--label_field compares labels. A record without the field stops the run.",
        "url",
        default="",
        regex=r"^[^\n]*$",
        metavar="FIELD",
    ),
    Parameter(
        "skip_corrupt",
        "Skip corrupt records",
        "Skip corrupt TFRecord records (resynchronising at the next valid record) and report them, "
        "instead of failing; a tar shard is read up to a damaged header and the rest of it is "
        "reported skipped; a JSONL file's last line cut short (no newline, not a whole JSON value) "
        "is skipped.",
        "false",
        flag=True,
        regex=r"^(true|false)$",
    ),
    Parameter(
        "quiet",
        "No progress lines",
        "Print no progress on stderr. Without it a local run shows pass 1 (files and bytes read, "
        "MB/s, ETA) and pass 2 (piles written): a live line on a terminal, a line every few "
        "seconds otherwise.",
        "false",
        flag=True,
        regex=r"^(true|false)$",
    ),
)
