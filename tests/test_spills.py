"""Runs larger than memory (``pileshuffle.engine.runs``' spills): a writer spills its held chunks to local disk and
merges them into one run, so parts are ``run_bytes / M`` whatever memory holds: the same records in
the same order as the run held in memory, no spill left behind, and on gs:// the objects and
requests ``plan`` counts for the larger runs."""

import dataclasses
import glob
import hashlib
import json
import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from helpers import assert_verified, manifest, run_shuffle, shards

from pileshuffle.commands import sample
from pileshuffle.commands.plan import gcs_operations
from pileshuffle.engine import runs as runs_module
from pileshuffle.engine.fragments import read_joined, read_table
from pileshuffle.engine.runs import PileRuns, auto_run_bytes, read_run_index, run_bytes_for
from pileshuffle.formats import record_hashes, record_lengths
from pileshuffle.io import storage
from pileshuffle.planning.plan import make_plan
from pileshuffle.records import keys as keymath

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30


def chunks(count, records, seed=0):
    """``count`` keyed chunks of a Parquet-like table: binary, int, and a dictionary column."""
    rng = np.random.default_rng(seed)
    for c in range(count):
        table = pa.table(
            {
                "payload": pa.array(
                    [rng.bytes(int(n)) for n in rng.integers(1, 90, records)], pa.binary()
                ),
                "i": pa.array(np.arange(c * records, (c + 1) * records)),
                "label": pa.array(
                    rng.choice(["cat", "dog", f"bird{c}"], records)
                ).dictionary_encode(),
            }
        )
        yield (
            table,
            keymath.record_keys(seed, (0, c), 0, records),
            record_hashes(table),
            record_lengths(table),
        )


def written(hold, monkeypatch, directory, piles=37, fed=None):
    """The elements of one writer's run over ``fed`` with ``hold`` bytes of memory: (elements, spills written)."""
    monkeypatch.setattr(runs_module, "MAX_HELD_BYTES", hold)
    count = []
    real = runs_module._Spills.write
    monkeypatch.setattr(
        runs_module._Spills, "write", lambda self, *a: count.append(1) or real(self, *a)
    )
    runs = PileRuns(piles, GiB, "w", directory, (0,))
    elements = [e for chunk in fed for e in runs.add(*chunk)] + list(runs.flush())
    return elements, len(count)


@pytest.mark.parametrize("mode", ["files", "shuffle"])
def test_a_run_spilled_to_disk_holds_what_the_run_held_in_memory_holds(tmp_path, monkeypatch, mode):
    """Each pile's part: the same records in the same order, count and fingerprint; one run
    object; the spill folder gone once merged (dictionary columns unified on the way)."""
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    fed = list(chunks(12, 2000))
    held_dir, spilled_dir = (
        (None, None) if mode == "shuffle" else (str(tmp_path / "a"), str(tmp_path / "b"))
    )
    held, none = written(GiB, monkeypatch, held_dir, fed=fed)
    spilled, count = written(100 * KiB, monkeypatch, spilled_dir, fed=fed)
    assert none == 0 and count >= 6
    assert [(p, f.records, f.fingerprint) for p, f in held] == [
        (p, f.records, f.fingerprint) for p, f in spilled
    ]
    assert [p for p, _ in spilled] == sorted(p for p, _ in spilled) and len(spilled) == 37
    for (_, kept), (_, merged) in zip(held, spilled):
        assert read_joined([merged]).equals(read_joined([kept]).unify_dictionaries())
        assert read_table(merged).column("label").num_chunks == 1
    if mode == "files":
        assert os.listdir(spilled_dir) == ["w-r00000.run"]
        index, _ = read_run_index(open(f"{spilled_dir}/w-r00000.run", "rb").read())
        assert index[:, 0].tolist() == [p for p, _ in spilled] and index[:, 3].tolist() == [
            f.records for _, f in spilled
        ]
    assert not glob.glob(str(tmp_path / "pileshuffle-spill-*"))


def test_a_run_is_cut_at_its_size_and_every_run_is_merged(tmp_path, monkeypatch):
    """Spills hold one run only: a writer whose input is three runs long writes three, each merged."""
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    monkeypatch.setattr(runs_module, "MAX_HELD_BYTES", 100 * KiB)
    runs = PileRuns(16, 400 * KiB, "w", str(tmp_path / "r"), (0,))
    fed = list(chunks(15, 1000))
    elements = [e for chunk in fed for e in runs.add(*chunk)] + list(runs.flush())
    assert runs.runs == len(os.listdir(tmp_path / "r")) >= 3
    assert sum(f.records for _, f in elements) == 15_000
    values = sorted(v for _, f in elements for v in read_table(f).column("i").to_pylist())
    assert values == list(range(15_000)) and not glob.glob(str(tmp_path / "pileshuffle-spill-*"))


def test_a_writer_that_fails_mid_run_leaves_no_spill(tmp_path):
    """The spills of a writer that never flushes go with its process (and with the writer)."""
    script = f"""
import sys, gc
sys.path.insert(0, {os.path.dirname(__file__)!r})
from test_spills import chunks
from pileshuffle.engine import runs
runs.MAX_HELD_BYTES = 50_000
writer = runs.PileRuns(16, 1 << 30, "w", None, (0,))
for chunk in chunks(4, 1000):
    writer.add(*chunk)
import glob, tempfile
print(len(glob.glob(tempfile.gettempdir() + "/pileshuffle-spill-*/*.spill")))
if sys.argv[1] == "drop":
    del writer
    gc.collect()
    print(len(glob.glob(tempfile.gettempdir() + "/pileshuffle-spill-*")))
else:
    raise RuntimeError("the worker failed here")
"""
    for how in ("drop", "fail"):
        spill_root = tmp_path / how
        spill_root.mkdir()
        done = subprocess.run(
            [sys.executable, "-c", script, how],
            capture_output=True,
            text=True,
            env={**os.environ, "TMPDIR": str(spill_root)},
        )
        said = done.stdout.split()
        assert said[0] == "4", done.stderr  # spilled, four times
        assert (said[1:] == ["0"]) if how == "drop" else ("the worker failed here" in done.stderr)
        assert os.listdir(spill_root) == []


def test_run_sizes_give_parts_of_256_kib_on_an_object_store_and_bound_what_a_merge_holds():
    # local: held in memory, as before
    assert run_bytes_for("auto", 16) == auto_run_bytes(16) == 64 * MiB
    assert run_bytes_for("auto", 100_000) == GiB
    # 100 TB's piles: runs spilled, parts of 256 KiB
    remote = run_bytes_for("auto", 95_157, remote=True)
    assert remote == 95_157 * 256 * KiB and remote > runs_module.MAX_HELD_BYTES
    assert run_bytes_for("auto", 200_000, remote=True) == 32 * GiB
    # 16 parts of 512 MiB would be held 3 times by the merge
    assert run_bytes_for(8 * GiB, 16) == GiB
    assert run_bytes_for(8 * GiB, 1024) == 8 * GiB and run_bytes_for(300 * MiB, 1) == 300 * MiB


def digests(prefix):
    return {
        os.path.basename(p): hashlib.sha256(open(p, "rb").read()).hexdigest()
        for p in shards(prefix)
    }


@pytest.fixture(scope="module")
def small_files(tmp_path_factory):
    """48 JSONL files of 500 records of ~120 bytes: units of work of 3 files (3 chunks) each."""
    directory = tmp_path_factory.mktemp("spill_in")
    sample.write_jsonl(str(directory), records=24_000, files=48, record_bytes=120)
    return str(directory)


@pytest.mark.parametrize("mode", ["files", "shuffle"])
def test_spilled_runs_give_the_same_shards(small_files, tmp_path, monkeypatch, mode):
    """A real run whose writers spill every chunk and merge writes the bytes of one that holds its runs."""
    pattern = f"{small_files}/*.jsonl"
    args = ["--num_piles=512", "--run_bytes=4MiB", f"--intermediate={mode}", "--seed=5"]
    run_shuffle(pattern, str(tmp_path / "held" / "t"), *args)
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    monkeypatch.setattr(runs_module, "MAX_HELD_BYTES", 32 * KiB)
    made = []
    real = runs_module._Spills.write
    monkeypatch.setattr(
        runs_module._Spills, "write", lambda self, *a: made.append(1) or real(self, *a)
    )
    run_shuffle(pattern, str(tmp_path / "spilled" / "t"), *args)
    assert len(made) >= 40  # 16 units of 3 chunks, nearly every chunk spilled
    assert digests(tmp_path / "spilled" / "t") == digests(tmp_path / "held" / "t")
    assert manifest(str(tmp_path / "spilled" / "t"))["totals"]["records"] == 24_000
    assert not glob.glob(str(tmp_path / "pileshuffle-spill-*"))
    assert_verified(pattern, str(tmp_path / "spilled" / "t"))


def test_spilled_runs_on_gs_make_the_objects_and_requests_plan_counts(
    small_files, gcs, tmp_path, monkeypatch
):
    """On gs:// files mode's runs are spilled and merged: one object per run however little memory
    holds, the requests ``plan`` counts, the bytes of the local run."""
    from test_gcs_operations import storage_operations_seen

    # runs uploaded, not kept in memory
    args = [
        "--format=jsonl",
        "--num_piles=64",
        "--run_bytes=4MiB",
        "--intermediate=files",
        "--seed=5",
        "--memory=1MiB",
    ]
    local = str(tmp_path / "local" / "t")
    run_shuffle(f"{small_files}/*.jsonl", local, *args)
    source = f"{gcs}/in"
    for path in sorted(glob.glob(f"{small_files}/*.jsonl")):
        with open(path, "rb") as src:
            with storage.open_write(f"{source}/{os.path.basename(path)}") as dst:
                dst.write(src.read())
    plan = make_plan(PipelineOptions([f"--input={source}/*.jsonl", f"--output={gcs}/out/t", *args]))
    assert plan.work_dir.startswith("gs://") and plan.run_bytes == 4 * MiB
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    monkeypatch.setattr(runs_module, "MAX_HELD_BYTES", 32 * KiB)
    seen = storage_operations_seen(monkeypatch)
    run_shuffle(f"{source}/*.jsonl", f"{gcs}/out/t", *args)
    class_a, class_b = gcs_operations(plan)["total"]
    assert (seen.count("A"), seen.count("B") + 1) == (class_a, class_b)
    with storage.open_read(f"{gcs}/out/t-manifest.json") as handle:
        remote = json.load(handle)
    assert [s["crc32c"] for s in remote["shards"]] == [
        s["crc32c"] for s in manifest(local)["shards"]
    ]
    assert not glob.glob(str(tmp_path / "pileshuffle-spill-*"))


def test_plan_says_what_a_writer_spills(small_files, tmp_path):
    from pileshuffle.commands.plan import plan_json

    options = PipelineOptions(
        [f"--input={small_files}/*.jsonl", f"--output={tmp_path}/o/t", "--num_piles=64"]
    )
    plan = make_plan(options)
    assert plan.spilled_per_writer == 0 and plan.held_per_writer == plan.run_bytes
    large = dataclasses.replace(
        plan,
        run_bytes=4 * GiB,
        input_bytes=plan.input_bytes * 10_000,
        estimated_bytes=plan.estimated_bytes * 10_000,
        sources=[dataclasses.replace(s, size=s.size * 10_000) for s in plan.sources],
    )
    assert large.held_per_writer == GiB and large.spilled_per_writer > GiB
    assert plan_json(large, options)["spilled_per_writer"] == large.spilled_per_writer
