"""The loader bench's data: bench/datagen.py's records (TFRecord, Parquet: 1,000,000 x 1,000 bytes
per GB; tar: its ~1 GB of WebDataset samples) shuffled once by ``pileshuffle run`` into piles of
~64 MB, cached under bench/.data/."""

import json
import os
import shutil
import subprocess

from loader_measure import child_env
from loader_rows import SEED
from workspace import DATA, PY, REPO, log

QUICK_DIVISOR = 50  # --quick divides every record count by this (a smoke run)
PILES_PER_GB = 16  # ~64 MB piles (16 x 62,500 x 1,000-byte records per GB)


def shuffled_output(fmt, scale, quick, seed=SEED):
    """The prefix of a finished ``pileshuffle run --seed seed`` output of the bench data (made once)."""
    import datagen

    div = QUICK_DIVISOR if quick else 1
    per_gb, record_bytes = (
        (datagen.TAR_SAMPLES_PER_GB, datagen.TAR_JPG_BYTES) if fmt == "tar" else (1_000_000, 1000)
    )
    piles = max(1, PILES_PER_GB * scale // div)
    source = datagen.dataset(
        DATA, fmt, per_gb * scale // div, 8 * scale, record_bytes, seed=0, log=log
    )
    directory = os.path.join(
        DATA, f"loader-{source['name']}-p{piles}" + (f"-s{seed}" if seed != SEED else "")
    )
    prefix = os.path.join(directory, "train")
    if not os.path.exists(prefix + "-manifest.json"):
        shutil.rmtree(directory, ignore_errors=True)
        os.makedirs(directory)
        log(f"shuffling {source['name']} into {piles} piles ...")
        subprocess.run(
            [
                PY,
                "-m",
                "pileshuffle",
                "run",
                "--input",
                source["pattern"],
                "--output",
                prefix,
                "--format",
                fmt,
                "--num_piles",
                str(piles),
                "--seed",
                str(seed),
            ],
            check=True,
            cwd=REPO,
            env=child_env(),
        )
    with open(prefix + "-manifest.json") as handle:
        manifest = json.load(handle)
    files = [os.path.join(directory, os.path.basename(s["path"])) for s in manifest["shards"]]
    return {
        "prefix": prefix,
        "format": fmt,
        "files": files,
        "records": manifest["totals"]["records"],
        "bytes": sum(os.path.getsize(f) for f in files),
        "piles": len(files),
    }


def mixture_data(data, scale, quick, half=False):
    """``data`` with a second output of the same records (another run seed) for the mixture rows:
    ``prefixes`` both outputs, ``files`` both outputs' shards (both warmed); records and bytes
    both outputs' (an epoch of the mixture reads an epoch of each), or with ``half`` one
    output's (that row delivers one output's worth)."""
    second = shuffled_output(data["format"], scale, quick, seed=SEED + 1)
    mixed = {
        **data,
        "prefixes": [data["prefix"], second["prefix"]],
        "files": data["files"] + second["files"],
    }
    if not half:
        mixed.update(
            records=data["records"] + second["records"], bytes=data["bytes"] + second["bytes"]
        )
    return mixed


def arrayrecord_data(data):
    """``data`` with ``arrayrecord``: its shards' records written once as ArrayRecord files
    (one per shard, beside it), for Grain's own random-access shuffle; ``files`` those files."""
    from array_record.python.array_record_module import ArrayRecordWriter

    from pileshuffle.loader import ShuffledDataset

    paths = [os.path.splitext(path)[0] + ".array_record" for path in data["files"]]
    if not all(os.path.exists(p) for p in paths):
        log("writing the shards' records as ArrayRecord ...")
        for pile, path in zip(ShuffledDataset(data["prefix"]).output.piles, paths):
            writer = ArrayRecordWriter(path + ".tmp", "group_size:1")
            for payload in pile.load().slice(0, pile.records).column(0).to_pylist():
                writer.write(payload)
            writer.close()
            os.replace(path + ".tmp", path)
    return {
        **data,
        "arrayrecord": paths,
        "files": paths,
        "bytes": sum(os.path.getsize(p) for p in paths),
    }


def plan_data(plan, scale, quick):
    """``(outputs, reads)``: each format's shuffled output that ``plan``'s rows read, and what each
    row reads by name (``measure_row``'s ``data``): the output, with a second output for the
    mixture rows and as ArrayRecord files for the ArrayRecord row (each made once per format)."""
    outputs = {fmt: shuffled_output(fmt, scale, quick) for fmt in sorted({row[3] for row in plan})}
    special = {
        "mixture": lambda data: mixture_data(data, scale, quick),
        "mixture-half": lambda data: mixture_data(data, scale, quick, half=True),
        "arrayrecord-shuffle": arrayrecord_data,
    }
    made, reads = {}, {}
    for name, kind, _, fmt in plan:
        if kind in special and (kind, fmt) not in made:
            made[kind, fmt] = special[kind](outputs[fmt])
        reads[name] = made.get((kind, fmt), outputs[fmt])
    return outputs, reads
