"""Golden bytes: fixed runs whose output bytes must never change by accident.

Each case writes seeded sample data, runs the real pipeline and hashes every file the
output consists of (shards; for a store its pile files, then its ``materialize``). A
refactor keeps the digests; a deliberate change updates them in the same commit and says why.
Recorded at c8957d5; updated on purpose when pass 1 began to key a record by its place in its
file (``keys.position_keys``, manifest format_version 1.1) instead of its rank, so that a large
file read in spans gives the same keys: the JSONL and Parquet cases are read in 18 spans (a
unit of work is a sixteenth of this small input) and give the digests of the files read whole.
Parquet updated on purpose at format_version 1.6 (issue 56): a shard dictionary-encodes only the
columns whose first rows repeat (formats/parquet_layout; here `label`, not `index`, `weight`,
`name` or `payload`).
"""

import hashlib
import os

import pytest
from helpers import run_shuffle, shards

from pileshuffle.commands import sample

GOLDEN = {
    "tfrecord-files": "121486397396061d78c28bdad7b9a4fec138ebb5d6526da0bb9ce728c1b405f5",
    "tfrecord-shuffle": "121486397396061d78c28bdad7b9a4fec138ebb5d6526da0bb9ce728c1b405f5",
    "tfrecord-gzip": "f3c2f0de643a7ec240bd16e2db6ec824090c9a3540317ab2bd9fb7dfddcaf936",
    "jsonl": "f6740de30e197b470879e536d34eb6fedb62683e442fab552258867e5fe8085d",
    "parquet": "cf314080d89cf70d5aff399fbbd99c6ae774fac8a201c89f29ca3046d340db40",
    "store": "b840492ef7221a9bb7a6ed2bec900c7641d5958461ab5430394d16de00b0d8e0",
    "store-materialized": "121486397396061d78c28bdad7b9a4fec138ebb5d6526da0bb9ce728c1b405f5",
}


def digest(paths, root):
    """One sha256 over (name relative to ``root``, sha256 of bytes) of every path, sorted."""
    total = hashlib.sha256()
    for path in sorted(paths):
        total.update(os.path.relpath(path, root).encode() + b"\0")
        total.update(hashlib.sha256(open(path, "rb").read()).digest())
    return total.hexdigest()


def store_pile_files(prefix):
    """Every file of a store but its manifest versions (they carry times)."""
    found = []
    for folder, _, names in os.walk(f"{prefix}-store"):
        found += [os.path.join(folder, n) for n in names if "manifest" not in n and n != "LOCK"]
    return found


WRITERS = {
    "tfrecord": lambda d: sample.write_tfrecord(
        d, records=2400, files=3, record_bytes=90, seed=5, vary=True
    ),
    "jsonl": lambda d: sample.write_jsonl(d, records=2400, files=3, record_bytes=70, seed=5),
    "parquet": lambda d: sample.write_parquet(
        d, records=2400, files=3, record_bytes=70, seed=5, row_group_rows=300
    ),
}
SHARD_CASES = {
    "tfrecord-files": ("tfrecord", ["--intermediate=files"]),
    "tfrecord-shuffle": ("tfrecord", ["--intermediate=shuffle"]),
    "tfrecord-gzip": ("tfrecord", ["--compression=gzip"]),
    "jsonl": ("jsonl", []),
    "parquet": ("parquet", []),
}


def _input(tmp_path, fmt):
    WRITERS[fmt](str(tmp_path / "in"))
    return str(tmp_path / "in" / f"*.{fmt}")


@pytest.mark.parametrize("case", sorted(SHARD_CASES))
def test_shard_bytes_are_golden(tmp_path, case):
    fmt, args = SHARD_CASES[case]
    prefix = str(tmp_path / "out" / "data")
    run_shuffle(_input(tmp_path, fmt), prefix, "--seed=11", "--num_piles=5", "--quiet", *args)
    assert digest(shards(prefix), tmp_path / "out") == GOLDEN[case], case


def test_store_and_materialize_bytes_are_golden(tmp_path):
    from pileshuffle.cli import main as pileshuffle

    prefix = str(tmp_path / "out" / "data")
    run_shuffle(
        _input(tmp_path, "tfrecord"),
        prefix,
        "--seed=11",
        "--num_piles=5",
        "--layout=store",
        "--quiet",
    )
    assert digest(store_pile_files(prefix), tmp_path / "out") == GOLDEN["store"]
    materialized = str(tmp_path / "mat" / "data")
    assert pileshuffle(["materialize", "--store", prefix, "--output", materialized]) == 0
    assert digest(shards(materialized), tmp_path / "mat") == GOLDEN["store-materialized"]
