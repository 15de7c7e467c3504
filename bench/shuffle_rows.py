"""The shuffle bench's rows: which rows a scale runs, the data set each reads, the number of
piles the floor and pileshuffle get, and the command each row runs."""

import fnmatch
import json
import os
import re
import shutil
import subprocess

import datagen
from measure import warm
from workspace import DATA, GB, HERE, OUT, PEERS_PY, PY, log, pileshuffle_command

SEED = 1  # every shuffling row's seed, so reruns shuffle the same way
# DuckDB out of core starts at pileshuffle's peak on these sets (Parquet 0.75-0.86 GB, JSONL 0.57-0.60 GB)
# and doubles it until DuckDB finishes (bench/duckdb_shuffle.py says which limit did). Measured
# 2026-11-26: Parquet runs out of memory at 600 MB and finishes at 800 MB; JSONL finishes at 600 MB.
DUCKDB_MEMORY_LIMIT = {"parquet": "800MB", "jsonl": "600MB"}
QUICK_DIVISOR = 50  # --quick divides every record count by this (a smoke run)
# --balance rows (issue 24's bar: at most 1.2x a plain run of the same output size): an input whose
# labels are three classes of 70/20/10 %, which --balance uniform writes as 3 x 70 % = 2.1x its
# records, and a plain set of exactly that many records of the same sizes (the same generator).
IMBALANCE = (70, 20, 10)
# ~0.5 GB in, ~1.05 GB out
BALANCED_RECORDS = {
    "jsonl": (1_000_000, 500),
    "parquet": (500_000, 1000),
}


# Issue 35's rows: 1 GB of Parquet at 16, 1,024 and 4,096 piles in both intermediate modes (4,096 piles
# over 1 GB has the records per (chunk, pile) of 10 TB in 10,000 piles); judged in shuffle_targets.
MANY_PILES, MANY_PILES_MODES = (16, 1024, 4096), ("files", "shuffle")
# Issue 38's peers beside DuckDB, each run by bench/peer_shuffle.py in the peers' venv (PEERS_PY).
PEERS = ("polars", "ray", "datasets")
PEER_KINDS = ("duckdb", "duckdb-ram", *PEERS)  # the rows that need PEERS_PY


def balanced_output_records(records, shares=IMBALANCE):
    """Records ``--balance uniform`` writes of ``records`` labelled in ``shares``: every class as large as the largest."""
    return len(shares) * records * max(shares) // sum(shares)


def dataset_specs(scale, quick):
    """{data set key: (format, records, files, record bytes[, label shares])}: ~1 GB per format at scale 1."""
    div = QUICK_DIVISOR if quick else 1
    specs = {
        "tfrecord": ("tfrecord", 1_000_000 // div, 8, 1000),
        "parquet": ("parquet", 1_000_000 // div, 8, 1000),
        "jsonl": ("jsonl", 2_000_000 // div, 8, 500),
        "tar": ("tar", datagen.TAR_SAMPLES_PER_GB // div, 8, datagen.TAR_JPG_BYTES),
        # the tar set's samples as TFRecords (~0.5 GB): the same payload bytes without tar's headers
        "tar-as-tfrecord": (
            "tar-as-tfrecord",
            datagen.TAR_SAMPLES_PER_GB // div,
            8,
            datagen.TAR_JPG_BYTES,
        ),
    }
    for fmt, (records, record_bytes) in BALANCED_RECORDS.items():
        specs[f"{fmt}-imbalanced"] = (fmt, records // div, 8, record_bytes, IMBALANCE)
        specs[f"{fmt}-balanced-size"] = (
            fmt,
            balanced_output_records(records // div),
            8,
            record_bytes,
        )
    if scale > 1:
        specs = {
            "tfrecord-1x": specs["tfrecord"],
            "tfrecord": ("tfrecord", 1_000_000 * scale // div, 8 * scale, 1000),
        }
    return specs


def row_plan(scale):
    """(name, kind, data set key, format) in run order."""
    if scale > 1:
        return [
            ("cat-tfrecord", "cat", "tfrecord", "tfrecord"),
            ("floor-tfrecord", "floor", "tfrecord", "tfrecord"),
            ("pileshuffle-tfrecord", "pileshuffle", "tfrecord", "tfrecord"),
            ("pileshuffle-tfrecord-1x", "pileshuffle", "tfrecord-1x", "tfrecord"),
        ]
    return [
        ("cat-tfrecord", "cat", "tfrecord", "tfrecord"),
        ("floor-tfrecord", "floor", "tfrecord", "tfrecord"),
        ("pileshuffle-tfrecord", "pileshuffle", "tfrecord", "tfrecord"),
        ("beam-common-tfrecord", "beam-common", "tfrecord", "tfrecord"),
        ("cat-parquet", "cat", "parquet", "parquet"),
        ("floor-parquet", "floor", "parquet", "parquet"),
        ("pileshuffle-parquet", "pileshuffle", "parquet", "parquet"),
        ("pileshuffle-parquet-balanced", "pileshuffle", "parquet", "parquet"),
        ("duckdb-parquet", "duckdb", "parquet", "parquet"),
        ("duckdb-parquet-ram", "duckdb-ram", "parquet", "parquet"),
        *[(f"{peer}-parquet", peer, "parquet", "parquet") for peer in PEERS],
        ("cat-jsonl", "cat", "jsonl", "jsonl"),
        ("floor-jsonl", "floor", "jsonl", "jsonl"),
        ("pileshuffle-jsonl", "pileshuffle", "jsonl", "jsonl"),
        ("pileshuffle-jsonl-balanced", "pileshuffle", "jsonl", "jsonl"),
        ("duckdb-jsonl", "duckdb", "jsonl", "jsonl"),
        ("duckdb-jsonl-ram", "duckdb-ram", "jsonl", "jsonl"),
        *[(f"{peer}-jsonl", peer, "jsonl", "jsonl") for peer in PEERS],
        ("shuf-jsonl", "shuf", "jsonl", "jsonl"),
        ("cat-tar", "cat", "tar", "tar"),
        ("pileshuffle-tar", "pileshuffle", "tar", "tar"),
        ("pileshuffle-tar-as-tfrecord", "pileshuffle", "tar-as-tfrecord", "tfrecord"),
        *[
            (f"piles-{mode}-{m}", "pileshuffle", "parquet", "parquet")
            for mode in MANY_PILES_MODES
            for m in MANY_PILES
        ],
        *[
            row
            for fmt in BALANCED_RECORDS
            for row in (
                # plain, as many records as balanced out
                (
                    f"balance-{fmt}-same-output",
                    "pileshuffle",
                    f"{fmt}-balanced-size",
                    fmt,
                ),
                # --balance uniform: 2.1x the input's records
                (
                    f"balance-{fmt}",
                    "pileshuffle",
                    f"{fmt}-imbalanced",
                    fmt,
                ),
                # the same, piles sized for the output
                (
                    f"balance-{fmt}-piles",
                    "pileshuffle",
                    f"{fmt}-imbalanced",
                    fmt,
                ),
                # plain, the same input
                (
                    f"balance-{fmt}-same-input",
                    "pileshuffle",
                    f"{fmt}-imbalanced",
                    fmt,
                ),
            )
        ],
    ]


def selected(name, only):
    if not only:
        return True
    return any(name == p or fnmatch.fnmatch(name, p) or name.startswith(p + "-") for p in only)


def planned_piles(data, fmt):
    """The num_piles pileshuffle's default (auto) run chooses for this data set."""
    probe = os.path.join(OUT, "plan-probe")
    shutil.rmtree(probe, ignore_errors=True)
    os.makedirs(probe)
    result = subprocess.run(
        [
            *pileshuffle_command(),
            "plan",
            "--input",
            data["pattern"],
            "--output",
            os.path.join(probe, "train"),
            "--format",
            fmt,
            "--json",
        ],
        capture_output=True,
        text=True,
        cwd=probe,
    )
    shutil.rmtree(probe, ignore_errors=True)
    if result.returncode != 0:
        raise RuntimeError(f"pileshuffle plan failed: {result.stderr.strip()}")
    return json.loads(result.stdout)["num_piles"]


def prepare_datasets(plan, scale, quick):
    """Generate (or reuse) the planned rows' data sets, ask pileshuffle's plan for their number of
    piles and warm the page cache; returns ({key: data set}, {key: piles})."""
    specs = dataset_specs(scale, quick)
    datasets, piles = {}, {}
    referenced = {
        key
        for name, *_ in plan
        for arg in EXTRA_ARGS.get(name, ())
        for key in _PILES_OF.findall(arg)
    }
    for key in sorted({p[2] for p in plan} | referenced, key=list(specs).index):
        fmt, records, files, record_bytes, *shares = specs[key]
        datasets[key] = datagen.dataset(
            DATA, fmt, records, files, record_bytes, seed=0, log=log, shares=(shares or [None])[0]
        )
    for key, data in datasets.items():
        if key in referenced or any(p[2] == key and p[1] in ("floor", "pileshuffle") for p in plan):
            piles[key] = planned_piles(data, data["format"])
            log(
                f"{data['name']}: pileshuffle's auto plan chooses {piles[key]} piles (the floor uses the same)"
            )
    need = 3 * max(d["bytes"] for d in datasets.values())
    if shutil.disk_usage(OUT).free < need:
        log(
            f"warning: less than {need / GB:.1f} GB free under {OUT}; rows may fail for lack of disk"
        )

    log("warm-up: cat of every input to /dev/null")
    for data in datasets.values():
        warm(data["files"])
    return datasets, piles


# Rows that run pileshuffle with options of their own. The JSONL and Parquet sets' labels are 0-9,
# drawn uniformly: --balance uniform copies each class up to the largest (+0.2-0.3%), so the
# balanced run writes about the plain run's output: its time over the plain row's is --balance's
# cost where it copies almost nothing (the counting pass and the labels). balance-FORMAT: the imbalanced sets (IMBALANCE), judged
# against balance-FORMAT-same-output (bench/shuffle_targets.py).
# "{piles:KEY}" stands for the piles pileshuffle's auto plan chooses for data set KEY (extra_args).
BALANCE_ARGS = ("--label_field", "label", "--balance", "uniform")
EXTRA_ARGS = {
    "pileshuffle-jsonl-balanced": BALANCE_ARGS,
    "pileshuffle-parquet-balanced": BALANCE_ARGS,
    **{f"balance-{fmt}": BALANCE_ARGS for fmt in BALANCED_RECORDS},
    **{
        f"balance-{fmt}-piles": (*BALANCE_ARGS, "--num_piles", f"{{piles:{fmt}-balanced-size}}")
        for fmt in BALANCED_RECORDS
    },
    **{
        f"piles-{mode}-{m}": ("--num_piles", str(m), "--intermediate", mode)
        for mode in MANY_PILES_MODES
        for m in MANY_PILES
    },
}
_PILES_OF = re.compile(r"\{piles:([^}]+)\}")


def extra_args(name, piles):
    """A row's own options (EXTRA_ARGS), each "{piles:KEY}" replaced by data set KEY's planned piles."""
    return tuple(
        _PILES_OF.sub(lambda m: str(piles[m.group(1)]), arg) for arg in EXTRA_ARGS.get(name, ())
    )


def command_for(kind, fmt, data, out_dir, piles, extra=()):
    """(argv of the row, glob of its output files or None)."""
    prefix = os.path.join(out_dir, "train")
    if kind == "cat":
        return ["sh", "-c", 'exec cat "$@" > /dev/null', "sh", *data["files"]], None
    if kind == "shuf":
        target = os.path.join(out_dir, "shuffled.jsonl")
        return [
            "sh",
            "-c",
            'out="$1"; shift; cat "$@" | shuf -o "$out"',
            "sh",
            target,
            *data["files"],
        ], target
    if kind == "floor":
        return [
            PY,
            os.path.join(HERE, "floor.py"),
            "--format",
            fmt,
            "--input",
            data["pattern"],
            "--output",
            prefix,
            "--num_piles",
            str(piles),
            "--seed",
            str(SEED),
        ], prefix + "-*-of-*"
    if kind == "pileshuffle":
        return [
            *pileshuffle_command(),
            "run",
            "--input",
            data["pattern"],
            "--output",
            prefix,
            "--format",
            fmt,
            "--seed",
            str(SEED),
            *extra,
        ], prefix + "-*-of-*"
    if kind in ("duckdb", "duckdb-ram"):
        limit = ["--memory_limit", DUCKDB_MEMORY_LIMIT[fmt]] if kind == "duckdb" else []
        return [
            PEERS_PY,
            os.path.join(HERE, "duckdb_shuffle.py"),
            "--format",
            fmt,
            "--input",
            data["pattern"],
            "--output",
            prefix,
            *limit,
        ], f"{prefix}.{fmt}"
    if kind in PEERS:
        # ray: a folder of files
        output = f"{prefix}/*.{fmt}" if kind == "ray" else f"{prefix}.{fmt}"
        return [
            PEERS_PY,
            os.path.join(HERE, "peer_shuffle.py"),
            "--peer",
            kind,
            "--format",
            fmt,
            "--input",
            data["pattern"],
            "--output",
            prefix,
            "--seed",
            str(SEED),
        ], output
    if kind == "beam-common":
        return [
            PY,
            os.path.join(HERE, "beam_common.py"),
            "--input",
            data["pattern"],
            "--output",
            prefix,
        ], prefix + "-*-of-*"
    raise ValueError(kind)
