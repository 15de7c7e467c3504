"""The template's parameters, defined once: the CLI, the pipeline's option parser and
``templates/metadata.json`` are all generated from ``PARAMETERS``."""

import dataclasses

from apache_beam.options.pipeline_options import PipelineOptions

from pileshuffle.transforms.shuffle import DEFAULT_MAX_PILE_BYTES


@dataclasses.dataclass(frozen=True)
class Parameter:
    name: str
    label: str
    help: str
    example: str
    default: object = None
    choices: tuple = ()
    regex: str = None
    kind: type = str
    flag: bool = False

    @property
    def optional(self) -> bool:
        return self.default is not None or self.flag


def parse_bytes(text) -> int:
    """'256MiB', '1G', '1048576' -> bytes."""
    text = str(text).strip()
    units = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mb": 1 << 20, "mib": 1 << 20,
             "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30, "t": 1 << 40, "tb": 1 << 40, "tib": 1 << 40}
    number = text.rstrip("bBkKmMgGtTiI")
    unit = text[len(number):].lower()
    if unit not in units or not number:
        raise ValueError(f"not a size: {text!r} (try 128MiB)")
    return int(float(number) * units[unit])


def parse_flag(text) -> bool:
    return str(text).lower() in ("1", "true", "yes", "on", "")


PARAMETERS = (
    Parameter("input", "Input files",
              "Comma-separated file patterns to shuffle: local paths or any location Beam's FileSystems opens (gs://...). "
              "Compression is detected from each file name (.gz).",
              "gs://my-bucket/data/train-*.tfrecord", regex=r"^[^\n]+$"),
    Parameter("output", "Output prefix",
              "Path prefix of the output: shards are {output}-00000-of-00064.tfrecord etc., plus {output}-manifest.json.",
              "gs://my-bucket/shuffled/train", regex=r"^[^\n,*?]+$"),
    Parameter("format", "Record format", "Format of input and output records.", "tfrecord",
              default="tfrecord", choices=("tfrecord", "parquet", "jsonl")),
    Parameter("compression", "Output compression",
              "auto: as the input (gzip if every input is .gz; Parquet: snappy); none; gzip. Parquet also takes snappy, zstd.",
              "auto", default="auto", choices=("auto", "none", "gzip", "snappy", "zstd")),
    Parameter("num_piles", "Number of piles",
              "Number of piles = output shards, or auto to size piles from the input and max_pile_bytes.", "auto",
              default="auto", regex=r"^(auto|[1-9][0-9]*)$"),
    Parameter("max_pile_bytes", "Largest pile in memory",
              "Upper bound on the records of one pile held in a worker's memory (auto plans piles of at most this with "
              "s + 6*sqrt(s) headroom; a larger pile is split again). Suffixes KiB, MiB, GiB.",
              "128MiB", default=f"{DEFAULT_MAX_PILE_BYTES >> 20}MiB", regex=r"^[0-9]+(\.[0-9]+)?([KMGT]i?B?|[kmgt]i?b?)?$"),
    Parameter("seed", "Random seed", "Seed of the shuffle: the same input, seed and piles give the same bytes.", "42",
              default="0", regex=r"^-?[0-9]+$", kind=int),
    Parameter("intermediate", "Intermediate mode",
              "files: pass 1 writes pile fragments to the temp location and only their names are grouped (bounded memory "
              "on local runners); shuffle: records are grouped in per-pile chunks by the runner (use on Dataflow's Shuffle).",
              "files", default="files", choices=("files", "shuffle")),
    Parameter("layout", "Output layout",
              "shards: shuffled shards (both passes); store: pass 1 only, into a pile store {output}-store/ that "
              "`pileshuffle append` extends, `expire` trims and `materialize` or the loader turns into shuffled order.",
              "shards", default="shards", choices=("shards", "store")),
    Parameter("overwrite", "Overwrite output", "Replace an existing output with the same prefix.", "true",
              flag=True, regex=r"^(true|false)$"),
    Parameter("skip_corrupt", "Skip corrupt records",
              "Skip corrupt TFRecord records (resynchronising at the next valid record) and report them, instead of failing.",
              "false", flag=True, regex=r"^(true|false)$"),
)


class PileshuffleOptions(PipelineOptions):
    """Beam pipeline options of the template (Beam's own options, such as --runner and
    --temp_location, come from Beam)."""

    @classmethod
    def _add_argparse_args(cls, parser):
        for parameter in PARAMETERS:
            if parameter.flag:
                parser.add_argument(f"--{parameter.name}", nargs="?", const=True, default=False, type=parse_flag,
                                    help=parameter.help)
            else:
                parser.add_argument(f"--{parameter.name}", default=parameter.default, help=parameter.help,
                                    choices=parameter.choices or None, required=False)


def template_metadata() -> dict:
    """The flex template's metadata.json, from ``PARAMETERS``."""
    parameters = []
    for p in PARAMETERS:
        entry = {
            "name": p.name,
            "label": p.label,
            "helpText": f"{p.help} Example: {p.example}",
            "isOptional": p.optional,
        }
        if p.choices:
            entry["regexes"] = ["^(" + "|".join(p.choices) + ")$"]
        elif p.regex:
            entry["regexes"] = [p.regex]
        parameters.append(entry)
    return {
        "name": "pileshuffle",
        "description": "Globally shuffle TFRecord, Parquet or JSONL files with a seeded 2-pass pile shuffle "
                       "(uniform random order, deterministic for a seed).",
        "parameters": parameters,
    }
