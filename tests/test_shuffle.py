"""The template pipeline end to end, on Beam's local runner: counts, multisets, readers,
determinism across modes and workers, order statistics, and the up-front errors."""

import collections
import glob
import os
import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest
from helpers import FAST, manifest, read_tfrecord_payloads, run_shuffle, shard_bytes, shards
from scipy import stats

from pileshuffle.commands import sample
from pileshuffle.errors import InputError, OutputError


def input_payloads(pattern):
    return read_tfrecord_payloads(sorted(glob.glob(pattern)))


def test_tfrecord_multiset_counts_and_tf_data_reads_it(tfrecord_input, tmp_path):
    import tensorflow as tf

    out = str(tmp_path / "out" / "train")
    result = run_shuffle(tfrecord_input, out, "--num_piles=7", "--seed=3")
    assert result["totals"]["records"] == 3000
    assert len(shards(out)) == 7 and all(p.endswith(".tfrecord") for p in shards(out))
    assert [s["records"] for s in result["shards"]] == [
        sum(1 for _ in tf.data.TFRecordDataset(p)) for p in shards(out)
    ]
    got = [bytes(r.numpy()) for r in tf.data.TFRecordDataset(shards(out))]
    assert collections.Counter(got) == collections.Counter(input_payloads(tfrecord_input))
    assert [sample.index_of(r) for r in got] != sorted(sample.index_of(r) for r in got)
    assert result["input_fingerprint"] == result["output_fingerprint"]


def test_gzip_tfrecord_in_and_out(tmp_path):
    import tensorflow as tf

    plain = sample.write_tfrecord(str(tmp_path / "plain"), records=500, files=2, record_bytes=50)
    import gzip

    for path in plain:
        with open(path, "rb") as src, gzip.open(path + ".gz", "wb") as dst:
            dst.write(src.read())
    out = str(tmp_path / "out" / "gz")
    result = run_shuffle(str(tmp_path / "plain" / "*.tfrecord.gz"), out, "--num_piles=3")
    assert result["compression"] == "gzip" and all(p.endswith(".tfrecord.gz") for p in shards(out))
    got = [bytes(r.numpy()) for r in tf.data.TFRecordDataset(shards(out), compression_type="GZIP")]
    assert sorted(got) == sorted(input_payloads(str(tmp_path / "plain" / "*.tfrecord")))
    # and plain output from gzip input when asked
    out2 = str(tmp_path / "out" / "plain")
    run_shuffle(
        str(tmp_path / "plain" / "*.tfrecord.gz"), out2, "--num_piles=3", "--compression=none"
    )
    assert sorted(read_tfrecord_payloads(shards(out2))) == sorted(got)


def test_jsonl_lines_multiset(jsonl_input, tmp_path):
    out = str(tmp_path / "out" / "lines")
    result = run_shuffle(jsonl_input, out, "--format=jsonl", "--num_piles=4")
    lines_in = b"".join(open(p, "rb").read() for p in sorted(glob.glob(jsonl_input))).splitlines()
    lines_out = b"".join(shard_bytes(out)).splitlines()
    assert collections.Counter(lines_in) == collections.Counter(lines_out)
    assert result["totals"]["records"] == len(lines_in) == 3000
    assert all(data.endswith(b"\n") for data in shard_bytes(out) if data)


def test_jsonl_last_line_without_newline_and_long_lines(tmp_path):
    src = tmp_path / "in"
    src.mkdir()
    long_line = b"x" * (3 << 20)  # longer than a read chunk in the test below
    last = b'"last-without-newline"'  # whole JSON: read (lines before it are never parsed)
    (src / "a.jsonl").write_bytes(b"one\n\ntwo\n" + long_line + b"\n" + last)
    (src / "b.jsonl").write_bytes(b"")
    out = str(tmp_path / "out" / "t")
    result = run_shuffle(str(src / "*.jsonl"), out, "--format=jsonl", "--num_piles=2")
    got = b"".join(shard_bytes(out)).split(b"\n")
    assert got[-1] == b""
    assert sorted(got[:-1]) == sorted([b"one", b"two", long_line, last])  # a blank line is none
    assert result["totals"]["records"] == 4 and result["skipped"]["blank_lines"] == 1


def test_parquet_schema_metadata_rows_and_duckdb(parquet_input, tmp_path):
    import duckdb

    out = str(tmp_path / "out" / "table")
    result = run_shuffle(parquet_input, out, "--format=parquet", "--num_piles=3", "--seed=5")
    source_schema = pq.read_schema(sorted(glob.glob(parquet_input))[0])
    for path in shards(out):
        assert pq.read_schema(path).equals(source_schema, check_metadata=True)
    table = pq.read_table(shards(out))
    assert sorted(table.column("index").to_pylist()) == list(range(3000))
    original = pq.read_table(sorted(glob.glob(parquet_input))).sort_by("index")
    assert table.sort_by("index").equals(original)
    [(count, distinct)] = duckdb.sql(
        f"select count(*), count(distinct index) from '{out}-*.parquet'"
    ).fetchall()
    assert count == distinct == 3000
    assert result["schema"]["metadata"]["source"] == "pileshuffle.sample"


def test_variable_length_records_including_empty(tmp_path):
    src = tmp_path / "in"
    from pileshuffle.formats.tfrecord import frame

    records = [
        b"",
        b"a",
        b"\x00" * 70000,
        *(bytes([i % 256]) * (i * 37 % 5000) for i in range(300)),
    ]
    (src).mkdir()
    (src / "v.tfrecord").write_bytes(b"".join(frame(r) for r in records))
    out = str(tmp_path / "out" / "v")
    run_shuffle(str(src / "*.tfrecord"), out, "--num_piles=5")
    assert sorted(read_tfrecord_payloads(shards(out))) == sorted(records)


MODES = {
    "files-in_memory": ["--intermediate=files", *FAST],
    "shuffle-in_memory": ["--intermediate=shuffle", *FAST],
    "files-multi_threading-3": [
        "--intermediate=files",
        "--direct_running_mode=multi_threading",
        "--direct_num_workers=3",
    ],
    "files-multi_processing-2": [
        "--intermediate=files",
        "--direct_running_mode=multi_processing",
        "--direct_num_workers=2",
    ],
    "shuffle-multi_processing-2": [
        "--intermediate=shuffle",
        "--direct_running_mode=multi_processing",
        "--direct_num_workers=2",
    ],
}


@pytest.mark.parametrize("fmt", ["tfrecord", "jsonl", "parquet"])
def test_same_bytes_in_every_mode_and_worker_count(fmt, tmp_path):
    sample.WRITERS[fmt](str(tmp_path / "in"), records=2000, files=3, record_bytes=60)
    pattern = str(tmp_path / "in" / "*")
    outputs = {}
    for name, args in MODES.items():
        out = str(tmp_path / name / "o")
        run_shuffle(
            pattern,
            out,
            f"--format={fmt}",
            "--num_piles=4",
            "--seed=11",
            *args[1:],
            args[0],
            runner_args=[],
        )
        outputs[name] = shard_bytes(out)
    reference = outputs.pop("files-in_memory")
    for name, data in outputs.items():
        assert data == reference, name
    other_seed = str(tmp_path / "seed12" / "o")
    run_shuffle(pattern, other_seed, f"--format={fmt}", "--num_piles=4", "--seed=12")
    assert shard_bytes(other_seed) != reference


def test_rerun_gives_same_bytes_and_overwrite_is_required(tfrecord_input, tmp_path):
    out = str(tmp_path / "out" / "r")
    run_shuffle(tfrecord_input, out, "--num_piles=3", "--seed=1")
    first = shard_bytes(out)
    # the same run: nothing to do
    assert run_shuffle(tfrecord_input, out, "--num_piles=3", "--seed=1") == manifest(out)
    with pytest.raises(OutputError, match="already exists.*--overwrite"):
        run_shuffle(tfrecord_input, out, "--num_piles=3", "--seed=2")
    run_shuffle(tfrecord_input, out, "--num_piles=3", "--seed=1", "--overwrite")
    assert shard_bytes(out) == first
    run_shuffle(tfrecord_input, out, "--num_piles=2", "--seed=1", "--overwrite")
    assert len(shards(out)) == 2  # the old 3-shard output is gone, not mixed in


def test_order_is_uniform_on_100k_records(tmp_path):
    n = 100_000
    sample.write_tfrecord(str(tmp_path / "in"), records=n, files=4, record_bytes=20)
    out = str(tmp_path / "out" / "u")
    run_shuffle(str(tmp_path / "in" / "*.tfrecord"), out, "--num_piles=16", "--seed=2")
    positions = np.array([sample.index_of(r) for r in read_tfrecord_payloads(shards(out))])
    assert sorted(positions.tolist()) == list(range(n))
    rho = stats.spearmanr(positions, np.arange(n)).statistic
    assert abs(rho) < 0.02
    # input block x output block table: uniform (chi-square does not reject)
    blocks = 10
    table = np.zeros((blocks, blocks))
    np.add.at(table, (positions * blocks // n, np.arange(n) * blocks // n), 1)
    assert stats.chi2_contingency(table).pvalue > 1e-3
    # a sorted "cats then dogs" input: cats per batch of 256 follow Binomial(256, 1/2)
    cats = (positions < n // 2).astype(int)
    per_batch = cats[: n // 256 * 256].reshape(-1, 256).sum(axis=1)
    assert abs(per_batch.mean() - 128) < 1.0
    assert 0.8 < per_batch.var() / 64 < 1.25


@pytest.fixture(scope="module")
def three_mb_input(tmp_path_factory):
    """~3 MB of TFRecords: several piles at the smallest auto --max_pile_bytes (1MiB)."""
    directory = tmp_path_factory.mktemp("three-mb") / "in"
    sample.write_tfrecord(str(directory), records=24_000, files=3, record_bytes=120, vary=True)
    return str(directory / "*.tfrecord")


def test_auto_piles_are_sized_from_input_and_cap(three_mb_input, tmp_path):
    out = str(tmp_path / "out" / "a")
    result = run_shuffle(three_mb_input, out, "--max_pile_bytes=1MiB")
    m = result["num_piles"]
    assert m > 1 and "auto" in result["options"]["num_piles_reason"]
    assert len(shards(out)) == m
    sizes = [s["bytes"] for s in result["shards"]]
    assert max(sizes) <= (1 << 20) * 1.1


def test_errors_name_the_path_and_write_nothing(tmp_path, tfrecord_input):
    out = tmp_path / "out" / "e"
    with pytest.raises(InputError, match="nope.tfrecord: does not exist"):
        run_shuffle(str(tmp_path / "nope.tfrecord"), str(out))
    with pytest.raises(InputError, match=r"none-\*.tfrecord: matches no file"):
        run_shuffle(str(tmp_path / "none-*.tfrecord"), str(out))
    (tmp_path / "empty.tfrecord").write_bytes(b"")
    with pytest.raises(InputError, match="empty.tfrecord: is empty"):
        run_shuffle(str(tmp_path / "empty.tfrecord"), str(out))
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())


def test_cli_error_is_one_line_without_traceback(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pileshuffle",
            "run",
            f"--input={tmp_path}/missing-*.jsonl",
            f"--output={tmp_path}/o",
            "--format=jsonl",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert (
        proc.stderr.strip().splitlines()[-1]
        == f"pileshuffle: error: {tmp_path}/missing-*.jsonl: matches no file"
    )
    assert "Traceback" not in proc.stderr


def test_cli_run_prints_summary(tfrecord_input, tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pileshuffle",
            "run",
            f"--input={tfrecord_input}",
            f"--output={tmp_path}/o/x",
            "--num_piles=2",
            *FAST,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "records   3,000" in proc.stdout and "MB/s" in proc.stdout and "min " in proc.stdout


def test_a_pile_of_whole_fragment_files_is_written_in_key_order(tmp_path):
    """A split pile's sub-piles are whole fragment files (not run segments): pass 2 reads them
    whole and orders the records by their keys."""
    import pyarrow as pa

    from pileshuffle.engine.fragments import Fragment, FragmentFiles
    from pileshuffle.engine.pile import Pile
    from pileshuffle.engine.transforms.shards import WriteShard
    from pileshuffle.formats import record_hashes
    from pileshuffle.names import HASH_COLUMN, KEY_COLUMN
    from pileshuffle.records.fingerprint import Fingerprint

    records = pa.table({"record": pa.array([b"a", b"bb", b"ccc"], pa.binary())})
    hashes = record_hashes(records)
    table = records.append_column(KEY_COLUMN, pa.array([3, 1, 2], pa.uint64())).append_column(
        HASH_COLUMN, pa.array(hashes, pa.uint64())
    )
    files = FragmentFiles(str(tmp_path / "fragments"), "s000000")
    files.append(0, table, Fingerprint.of(hashes, 6))
    (committed,) = files.commit()
    path, count, nbytes, fingerprint = (
        committed.path,
        committed.records,
        committed.nbytes,
        committed.fingerprint,
    )
    pile = Pile(0, 1, (Fragment((0, 0), count, nbytes, fingerprint, path=path),))
    (stats,) = list(WriteShard("jsonl", "none", str(tmp_path / "out" / "x")).process(pile))
    assert open(stats.staged_path, "rb").read() == b"bb\nccc\na\n"


def test_plan_reports_without_writing_anything(three_mb_input, tmp_path):
    import json
    import os

    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pileshuffle",
            "plan",
            f"--input={three_mb_input}",
            f"--output={tmp_path}/out/p",
            "--max_pile_bytes=1MiB",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    assert plan["files"] == 3 and plan["num_piles"] > 1 and "auto" in plan["reason"]
    assert not os.path.exists(tmp_path / "out") or os.listdir(tmp_path / "out") == []


@pytest.mark.parametrize("fmt", ["tfrecord", "jsonl", "parquet"])
def test_mean_record_size_comes_from_the_first_source_with_records(tmp_path, fmt):
    """The auto pile count's record size: a sample of the first source that has records
    (an empty first file is passed over); Parquet reads only its footer, and agrees."""
    from pileshuffle.engine.transforms.assign import Source
    from pileshuffle.formats import get_format
    from pileshuffle.planning.plan import mean_record_bytes

    writer = {
        "tfrecord": sample.write_tfrecord,
        "jsonl": sample.write_jsonl,
        "parquet": sample.write_parquet,
    }[fmt]
    writer(str(tmp_path / "in"), records=2000, files=2, record_bytes=300)
    writer(str(tmp_path / "in"), records=0, files=1, record_bytes=300, name="a-empty")
    paths = sorted(glob.glob(str(tmp_path / "in" / f"*.{fmt}")))
    assert "a-empty" in paths[0]
    sources = [Source(i, p, os.path.getsize(p)) for i, p in enumerate(paths)]
    mean = mean_record_bytes(get_format(fmt), sources)
    if fmt == "parquet":
        table = pq.read_table(paths[1])
        assert mean == pytest.approx(table.nbytes / table.num_rows, rel=0.05)
    else:
        assert 290 <= mean <= 330  # about 300 bytes each (with framing and Arrow's offsets)
    assert mean_record_bytes(get_format(fmt), sources[:1]) == 1.0  # nothing to sample


@pytest.mark.parametrize("fmt", ["tfrecord", "parquet"])
@pytest.mark.parametrize("group", [3, 256])
def test_small_piles_written_in_groups_give_the_bytes_of_one_pile_at_a_time(
    fmt, group, tmp_path, monkeypatch
):
    """The template puts G neighbouring small piles in order at once (``pile_groups``); every
    shard must be the one ``Pile.ordered`` writes alone: the same bytes with groups of 3 (the last
    group short), of 256 (all 37 piles, some empty), and with piles split again past a small
    ``--max_pile_bytes`` (written alone inside their group), in files and shuffle mode."""
    import pileshuffle.engine.transforms.graph as graph
    from pileshuffle.engine.pile_groups import PileGroup

    sample.WRITERS[fmt](str(tmp_path / "in"), records=3000, files=3, record_bytes=60)
    pattern, outputs, seen = str(tmp_path / "in" / "*"), {}, []
    real_ordered = PileGroup.ordered
    monkeypatch.setattr(
        PileGroup,
        "ordered",
        lambda self: (seen.append(len(self.piles)), (yield from real_ordered(self)))[1],
    )
    for size in (1, group):
        monkeypatch.setattr(graph, "template_group", lambda plan, size=size: size)
        for mode, extra in (("files", ["--max_pile_bytes=20000"]), ("shuffle", [])):
            out = str(tmp_path / f"{size}-{mode}" / "o")
            run_shuffle(
                pattern,
                out,
                f"--format={fmt}",
                "--num_piles=37",
                "--seed=5",
                f"--intermediate={mode}",
                *extra,
            )
            outputs[size, mode] = shard_bytes(out)
    assert seen and max(seen) == min(group, 37)  # groups ran, of the size asked
    for mode in ("files", "shuffle"):
        assert outputs[group, mode] == outputs[1, mode], mode
    assert outputs[1, "files"] == outputs[1, "shuffle"]
