"""``pileshuffle quality`` on real runs: records located by hash at their true input
positions, a shuffled output reported uniform and the cheaper policies (and an
unshuffled output) reported not, labels from TFRecord bytes, Parquet columns and JSON
keys, the training effect, the figures drawn once, and no matplotlib in a run."""

import json
import math
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from helpers import input_places, read_tfrecord_payloads, run_shuffle, sample_run, shards
from helpers import manifest as read_manifest
from hypothesis import given, settings
from hypothesis import strategies as st

from pileshuffle.commands import sample
from pileshuffle.commands.quality import main as quality_main
from pileshuffle.errors import InputError
from pileshuffle.formats import get_format
from pileshuffle.quality import orders, training
from pileshuffle.quality.label import Label
from pileshuffle.quality.report import ALPHA, measure

RECORDS = 20_000


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A real run: 20,000 records carrying their index, 4 files, 8 piles."""
    return sample_run(
        tmp_path_factory,
        "tfrecord",
        "--num_piles=8",
        "--seed=4",
        records=RECORDS,
        files=4,
        record_bytes=40,
    )


def inputs(pattern):
    import glob

    return sorted(glob.glob(pattern))


def label_report(fmt, pattern, out, field, compare=True):
    """The report of the run ``out`` of ``pattern`` with ``--label_field field``, batches of 50."""
    return measure(
        get_format(fmt),
        inputs(pattern),
        shards(out),
        read_manifest(out),
        label=Label(field=field),
        batch_size=50,
        compare=compare,
    )


def assert_balanced_only_when_shuffled(report, classes):
    """Every batch of the output holds the classes as a uniform order would; input order
    (written one class at a time) does not."""
    assert (
        report.summary["label"]["classes"] == classes
        and report.summary["batch_dispersion_p"] >= ALPHA
    )
    assert by_policy(report.summary)["no shuffle"]["batch_dispersion"] > 20


def by_policy(summary):
    return {p["policy"].split(" (")[0]: p for p in summary["policies"]}


def test_cli_report_compares_policies_and_draws_the_figures(finished, tmp_path):
    pattern, out = finished
    report_dir = tmp_path / "report"
    # byte 7 of the index digits is 0 for records 0..9999, 1 after: "all cats, then all dogs"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pileshuffle",
            "quality",
            f"--input={pattern}",
            f"--output={out}",
            f"--report={report_dir}",
            "--label_bytes=7:8",
            "--compare",
            "--sample=5000",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "consistent with a uniform permutation" in proc.stdout
    assert (
        proc.stdout.strip()
        .splitlines()[-1]
        .startswith(f"report written to {report_dir}: quality.json")
    )
    summary = json.loads((report_dir / "quality.json").read_text())
    assert abs(summary["records_used"] - 5000) < 4 * math.sqrt(5000)
    assert summary["records"] == RECORDS and summary["uniform"] is True
    assert abs(summary["spearman"]) < 4 / math.sqrt(summary["records_used"])
    assert summary["block_chi2_p"] >= ALPHA and summary["batch_dispersion_p"] >= ALPHA
    assert 0.7 < summary["batch_dispersion"] < 1.3
    assert summary["label"]["classes"] == 2 and summary["pileshuffle_order_reproduced"] == 1.0
    policies = by_policy(summary)
    for bad in ("no shuffle", "file order shuffled", "shuffle buffer"):
        assert policies[bad]["uniform"] is False, bad
        assert policies[bad]["block_chi2_p"] < ALPHA and policies[bad]["batch_dispersion"] > 5, bad
    for good in ("loader, mix=1", "loader, mix=4", "pileshuffle output"):
        assert policies[good]["uniform"] is True, good
    # pile-order reshuffles carry batches over (8 piles: ~8x at mix=1, ~1.25x at mix=4); a re-read output repeats them
    assert (
        policies["loader, mix=1"]["remeet_ratio"]
        > 4
        > 2
        > policies["loader, mix=4"]["remeet_ratio"]
    )
    assert policies["pileshuffle output"]["remeet"] == 1.0
    # the shuffle radius: neighbours as far apart in the input as a uniform order puts them (median 0.29 of N,
    # as many within a pile's records as uniform), or near each other (a shuffle buffer, files in order)
    uniform_median = 1 - 1 / math.sqrt(2)
    for good in ("loader, mix=1", "loader, mix=4", "pileshuffle output"):
        assert abs(policies[good]["radius_median"] - uniform_median) < 0.02, good
        assert (
            0.9 < policies[good]["radius_within_ratio"] < 1.1
            and policies[good]["radius_p"] >= ALPHA
        ), good
    assert policies["no shuffle"]["radius_median"] == 1 / RECORDS
    # neighbours are neighbours in their file
    assert policies["file order shuffled"]["radius_median"] < 0.001
    # all near: 1 / the uniform share (0.23)
    assert policies["file order shuffled"]["radius_within_ratio"] > 4
    assert (
        policies["shuffle buffer"]["radius_within_ratio"] > 2
        and policies["shuffle buffer"]["radius_p"] < ALPHA
    )
    assert "radius median" in proc.stdout and "near x uniform" in proc.stdout
    # the training effect: sorted data ruins one epoch of SGD, a uniform order does not
    best = training.BEST_ACCURACY
    assert policies["pileshuffle output"]["held_out_accuracy"] > best - 0.03
    assert policies["no shuffle"]["held_out_accuracy"] < best - 0.1
    for name in ("quality.png", "training.png"):
        data = (report_dir / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    assert "| pileshuffle output |" in (report_dir / "policies.md").read_text()


def test_located_records_sit_at_their_true_input_positions(finished):
    pattern, out = finished
    manifest = read_manifest(out)
    report = measure(get_format("tfrecord"), inputs(pattern), shards(out), manifest, sample=2000)
    (row,) = report.rows
    true_index = np.array([sample.index_of(p) for p in read_tfrecord_payloads(shards(out))])
    assert len(row.x) > 1500 and np.array_equal(row.x, true_index[row.y])
    assert report.summary["uniform"] is True and "batch_dispersion" not in report.summary


def test_an_unshuffled_output_is_reported_not_uniform(finished, tmp_path):
    """The input files copied in order as the shards of a fake run."""
    pattern, out = finished
    manifest = read_manifest(out)
    files = inputs(pattern)
    fake = []
    for i, path in enumerate(files):
        fake.append(str(tmp_path / f"o-{i:05d}-of-{len(files):05d}.tfrecord"))
        shutil.copy(path, fake[-1])
    manifest.update(
        num_piles=len(files),
        shards=[{"path": p, "records": RECORDS // 4, "bytes": 0} for p in fake],
    )
    report = measure(
        get_format("tfrecord"), files, fake, manifest, sample=3000, label=Label.parse_bytes("7:8")
    )
    summary = report.summary
    assert summary["uniform"] is False
    assert (
        summary["spearman"] > 0.99
        and summary["block_chi2_p"] < ALPHA
        and summary["batch_dispersion"] > 50
    )


def test_labels_from_json_keys_and_parquet_columns(tmp_path):
    lines = [
        json.dumps({"i": i, "animal": "cat" if i < 1500 else "dog"}) + "\n" for i in range(3000)
    ]
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl").write_text("".join(lines[:1700]))
    (tmp_path / "in" / "b.jsonl").write_text("".join(lines[1700:]))
    out = str(tmp_path / "out" / "j")
    run_shuffle(
        str(tmp_path / "in" / "*.jsonl"), out, "--format=jsonl", "--num_piles=3", "--seed=2"
    )
    assert_balanced_only_when_shuffled(
        label_report("jsonl", str(tmp_path / "in" / "*.jsonl"), out, "animal"), 2
    )
    with pytest.raises(
        ValueError, match="takes 3,000 values; label balance needs a categorical label"
    ):
        measure(
            get_format("jsonl"),
            inputs(str(tmp_path / "in" / "*.jsonl")),
            shards(out),
            read_manifest(out),
            label=Label(field="i"),
        )

    sample.write_parquet(str(tmp_path / "pq"), records=3000, files=2, record_bytes=60)
    out = str(tmp_path / "out" / "p")
    run_shuffle(str(tmp_path / "pq" / "*.parquet"), out, "--format=parquet", "--num_piles=3")
    report = measure(
        get_format("parquet"),
        inputs(str(tmp_path / "pq" / "*.parquet")),
        shards(out),
        read_manifest(out),
        label=Label(field="label"),
        batch_size=100,
    )
    assert (
        report.summary["label"]["classes"] == 10 and report.summary["batch_dispersion_p"] >= ALPHA
    )
    assert report.summary["records_used"] == 3000  # fewer records than the sample: all of them


def _example(label: int, animal: bytes) -> bytes:
    import tensorflow as tf

    return tf.train.Example(
        features=tf.train.Features(
            feature={
                "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
                "animal": tf.train.Feature(bytes_list=tf.train.BytesList(value=[animal])),
                "pixels": tf.train.Feature(float_list=tf.train.FloatList(value=[0.5] * 20)),
            }
        )
    ).SerializeToString()


def test_labels_from_tf_train_example_features_and_tar_members(tmp_path):
    from pileshuffle.formats.tfrecord import frame

    classes = [i * 4 // 2000 for i in range(2000)]  # written one class at a time
    (tmp_path / "ex").mkdir()
    for part in range(2):
        records = [
            _example(c, b"cat" if c % 2 else b"dog")
            for c in classes[part * 1000 : (part + 1) * 1000]
        ]
        (tmp_path / "ex" / f"p{part}.tfrecord").write_bytes(b"".join(frame(r) for r in records))
    out = str(tmp_path / "out" / "ex")
    run_shuffle(str(tmp_path / "ex" / "*.tfrecord"), out, "--num_piles=3", "--seed=4")
    for field, count in (("label", 4), ("animal", 2)):
        assert_balanced_only_when_shuffled(
            label_report("tfrecord", str(tmp_path / "ex" / "*.tfrecord"), out, field), count
        )
    with pytest.raises(InputError, match="has no feature 'colour'"):
        label_report("tfrecord", str(tmp_path / "ex" / "*.tfrecord"), out, "colour", compare=False)

    sample.write_tar(str(tmp_path / "tar"), records=2000, files=2, record_bytes=100, classes=5)
    out = str(tmp_path / "out" / "t")
    run_shuffle(str(tmp_path / "tar" / "*.tar"), out, "--num_piles=3", "--seed=4")
    assert_balanced_only_when_shuffled(
        label_report("tar", str(tmp_path / "tar" / "*.tar"), out, "cls"), 5
    )
    with pytest.raises(InputError, match="has no member 'jpg'"):
        label_report("tar", str(tmp_path / "tar" / "*.tar"), out, "jpg", compare=False)


def test_bad_arguments_are_one_clear_error(finished, tmp_path, capsys):
    pattern, out = finished
    common = [f"--input={pattern}", f"--report={tmp_path / 'r'}"]
    assert quality_main([*common, f"--output={out}", "--label_field=animal"]) == 2
    err = capsys.readouterr().err
    # the sample payloads are no Examples
    assert "tf.train.Example" in err and "--label_bytes" in err, err
    assert quality_main([*common, f"--output={out}", "--label_bytes=3"]) == 2
    assert "--label_bytes takes START:END" in capsys.readouterr().err
    assert quality_main([*common, f"--output={tmp_path / 'nothing'}"]) == 2
    assert "no finished output" in capsys.readouterr().err
    assert (
        quality_main(
            [f"--input={inputs(pattern)[0]}", f"--report={tmp_path / 'r'}", f"--output={out}"]
        )
        == 2
    )
    assert (
        f"hold {RECORDS // 4:,} records, the output {RECORDS:,}: pass the run's own --input"
        in capsys.readouterr().err
    )
    assert not (tmp_path / "r").exists()


@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 300), size=st.integers(1, 400), seed=st.integers(0, 2**32 - 1))
def test_shuffle_buffer_delivers_each_record_once_and_only_after_reading_it(n, size, seed):
    out = orders.shuffle_buffer(np.arange(n), size, np.random.default_rng(seed))
    assert sorted(out.tolist()) == list(range(n))
    # the t-th record out was among the first size + t read
    assert np.all(out < np.arange(n) + size)
    if size == 1:
        assert out.tolist() == list(range(n))


def test_shuffle_buffer_moves_records_as_far_as_tf_data_does():
    """Per seed, the mean |displacement| of our simulation and of tf.data's own
    ``shuffle`` (30 seeds each) agree; a buffer twice as large is told apart."""
    import tensorflow as tf
    from scipy import stats

    n, size = 2000, 100

    def mean_moves(order):
        return np.abs(orders.inverse(np.asarray(order)) - np.arange(n)).mean()

    ours = [
        mean_moves(orders.shuffle_buffer(np.arange(n), size, np.random.default_rng(s)))
        for s in range(30)
    ]
    theirs = [
        mean_moves(list(tf.data.Dataset.range(n).shuffle(size, seed=s).as_numpy_iterator()))
        for s in range(30)
    ]
    larger = [
        mean_moves(orders.shuffle_buffer(np.arange(n), 2 * size, np.random.default_rng(s)))
        for s in range(30)
    ]
    assert stats.mannwhitneyu(ours, theirs).pvalue >= ALPHA
    assert stats.mannwhitneyu(larger, theirs).pvalue < ALPHA


def test_a_run_imports_no_matplotlib(tfrecord_input, tmp_path):
    code = (
        "import sys; from pileshuffle.pipeline import run; import pileshuffle.quality.report; "
        f"run(['--input={tfrecord_input}', '--output={tmp_path}/o', '--num_piles=2', "
        "'--direct_running_mode=in_memory', '--direct_num_workers=1']); "
        "print(sorted(m for m in sys.modules if m.startswith('matplotlib')))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "[]"


@pytest.mark.parametrize("mix", [1, 4])
def test_the_loader_rows_are_the_order_the_loader_delivers(finished, mix):
    """``ShuffledDataset`` reading the run delivers epoch 2 in the order the report's
    loader rows measure (input position of every record, from its index digits)."""
    from pileshuffle.loader import ShuffledDataset

    pattern, out = finished
    manifest = read_manifest(out)
    written = orders.pileshuffle_order(input_places(inputs(pattern)), manifest["seed"])
    expected = written[
        orders.epoch_positions([s["records"] for s in manifest["shards"]], 7, 2, mix)
    ]
    delivered = [
        sample.index_of(r) for r in ShuffledDataset(out, seed=7, epoch=2, mix=mix, prefetch=False)
    ]
    assert delivered == expected.tolist()


@pytest.mark.parametrize("grown", [(), ("--max_pile_bytes=16KiB",)], ids=["piles", "sub-piles"])
def test_a_pile_store_is_measured_in_its_written_order(finished, tmp_path, grown):
    """A store (pass 1 kept, issue 13) is measured in the order ``materialize`` writes;
    generation 0 carries ``run``'s keys, so it locates every record where the run's
    shards have it; also when its piles are larger than its max_pile_bytes and are read
    in sub-piles (each record once)."""
    from pileshuffle.commands.quality import finished_output

    pattern, out = finished
    store = str(tmp_path / "store" / "s")
    run_shuffle(pattern, store, "--num_piles=8", "--seed=4", "--layout=store", *grown)
    manifest, output = finished_output(store)
    assert not isinstance(output, list)
    assert (len(output.piles) > 8) == bool(grown)
    label = Label.parse_bytes("7:8")
    from_store = measure(
        get_format("tfrecord"),
        inputs(pattern),
        output,
        manifest,
        sample=3000,
        label=label,
        compare=True,
    )
    from_shards = measure(
        get_format("tfrecord"),
        inputs(pattern),
        shards(out),
        read_manifest(out),
        sample=3000,
        label=label,
    )
    own, reference = from_store.rows[-1], from_shards.rows[0]
    assert np.array_equal(own.x, reference.x) and np.array_equal(own.y, reference.y)
    assert np.array_equal(own.labels, reference.labels)
    assert (
        from_store.summary["pileshuffle_order_reproduced"] == 1.0
        and from_store.summary["uniform"] is True
    )


def test_large_runs_train_on_every_kth_input_record_in_the_delivered_order():
    from pileshuffle.quality.report import thin, training_stride

    records = 450_001
    order = np.random.default_rng(0).permutation(records)
    stride = training_stride(records)
    thinned = thin(order, stride)
    assert stride == 3 and np.array_equal(
        np.sort(thinned), np.arange(len(range(0, records, stride)))
    )
    assert np.array_equal(thinned * stride, order[order % stride == 0])
