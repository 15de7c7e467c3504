"""Golden bytes: fixed runs whose output bytes must never change by accident.

Each case writes seeded sample data, runs the real pipeline and hashes every file the
output consists of (shards; for a store its pile files, then its ``materialize``). The
digests below were recorded at commit c8957d5, before the house refactor: a refactor
keeps them; a deliberate format change updates them in the same commit and says why.
"""

import hashlib
import os

import pytest

from pileshuffle import sample
from helpers import run_shuffle, shards

GOLDEN = {
    "tfrecord-files": "2d42d284668259b42f8447d55507f1d68543a7f2ce33490b62cbbe476e5aed2b",
    "tfrecord-shuffle": "2d42d284668259b42f8447d55507f1d68543a7f2ce33490b62cbbe476e5aed2b",
    "tfrecord-gzip": "b33926b8c150015a2511c094e78f099c1f1387d95d865cc13a8ff7ad117f9275",
    "jsonl": "fb3ce4e630261d1c277afa34c22884b2770539fe1258368090d4a0c9f688e552",
    "parquet": "092f40098583c98def2f12147ab1a4ca89c62d5b974017611c411fe18cb588cd",
    "store": "de0f77c4a3644c4657e9feebc1cd3893eaaf866939f5e2b18f5b403e4458670b",
    "store-materialized": "2d42d284668259b42f8447d55507f1d68543a7f2ce33490b62cbbe476e5aed2b",
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
    "tfrecord": lambda d: sample.write_tfrecord(d, records=2400, files=3, record_bytes=90, seed=5, vary=True),
    "jsonl": lambda d: sample.write_jsonl(d, records=2400, files=3, record_bytes=70, seed=5),
    "parquet": lambda d: sample.write_parquet(d, records=2400, files=3, record_bytes=70, seed=5, row_group_rows=300),
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
    run_shuffle(_input(tmp_path, "tfrecord"), prefix, "--seed=11", "--num_piles=5", "--layout=store", "--quiet")
    assert digest(store_pile_files(prefix), tmp_path / "out") == GOLDEN["store"]
    materialized = str(tmp_path / "mat" / "data")
    assert pileshuffle(["materialize", "--store", prefix, "--output", materialized]) == 0
    assert digest(shards(materialized), tmp_path / "mat") == GOLDEN["store-materialized"]
