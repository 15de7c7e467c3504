"""examples/preprocess_to_tfrecord.py end to end: JSONL -> tf.train.Example -> ShuffleToPiles
-> WritePiles, read back with tf.data and parsed with tf.io.parse_single_example."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest
import tensorflow as tf
from helpers import manifest, shard_bytes, shards

from pileshuffle.commands import sample

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "examples", "preprocess_to_tfrecord.py")
RECORDS = 2000
LOCAL = ["--direct_running_mode=in_memory", "--direct_num_workers=1"]


def load_example_module():
    spec = importlib.util.spec_from_file_location("preprocess_to_tfrecord", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def jsonl(tmp_path_factory):
    directory = tmp_path_factory.mktemp("examples") / "in"
    sample.write_jsonl(str(directory), records=RECORDS, files=3, record_bytes=90)
    rows = {}
    for name in sorted(os.listdir(directory)):
        with open(directory / name) as handle:
            for line in handle:
                row = json.loads(line)
                rows[row["index"]] = row["text"]
    assert len(rows) == RECORDS
    return str(directory / "*.jsonl"), rows


def parsed(output):
    """Every record of the output shards, in shard order, via tf.data and parse_single_example."""
    spec = {
        "index": tf.io.FixedLenFeature([], tf.int64),
        "text": tf.io.FixedLenFeature([], tf.string),
    }
    dataset = tf.data.TFRecordDataset(shards(output)).map(
        lambda record: tf.io.parse_single_example(record, spec)
    )
    return [(int(e["index"]), e["text"].numpy().decode()) for e in dataset]


def check_exactly_once(output, rows):
    got = parsed(output)
    assert len(got) == RECORDS
    assert {index for index, _ in got} == set(rows)  # with len == RECORDS: each row exactly once
    assert all(rows[index] == text for index, text in got)  # features survived intact
    order = [index for index, _ in got]
    assert order != sorted(order)
    assert manifest(output)["totals"]["records"] == RECORDS
    return order


@pytest.fixture(scope="module")
def keyed_run(tmp_path_factory, jsonl):
    """The script as a user runs it: keyed by the row id, files mode (fragments under --temp_location)."""
    pattern, _ = jsonl
    root = tmp_path_factory.mktemp("keyed")
    output = str(root / "out" / "train")
    done = subprocess.run(
        [
            sys.executable,
            SCRIPT,
            f"--input={pattern}",
            f"--output={output}",
            "--num_piles=5",
            "--seed=3",
            "--id_field=index",
            f"--temp_location={root / 'tmp'}",
            *LOCAL,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=str(root),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "manifest.json" in done.stdout
    return root, output


def test_script_writes_tfrecords_that_tf_data_reads_with_every_row_once(keyed_run, jsonl):
    root, output = keyed_run
    assert len(shards(output)) == 5 and all(p.endswith(".tfrecord") for p in shards(output))
    check_exactly_once(output, jsonl[1])
    # fragments removed
    assert not [n for n in os.listdir(root / "tmp") for _ in os.listdir(root / "tmp" / n)]


def test_keyed_run_is_reproducible_and_matches_in_process(tmp_path, keyed_run, jsonl):
    module = load_example_module()
    pattern, _ = jsonl
    again = str(tmp_path / "again" / "train")
    # shuffle mode this time: no --temp_location
    assert (
        module.main(
            [
                f"--input={pattern}",
                f"--output={again}",
                "--num_piles=5",
                "--seed=3",
                "--id_field=index",
                *LOCAL,
            ]
        )
        == 0
    )
    assert shard_bytes(again) == shard_bytes(keyed_run[1])


def test_unkeyed_gzip_run_delivers_every_row_once(tmp_path, jsonl):
    module = load_example_module()
    pattern, rows = jsonl
    output = str(tmp_path / "out" / "train")
    assert (
        module.main(
            [
                f"--input={pattern}",
                f"--output={output}",
                "--num_piles=3",
                "--seed=8",
                "--compression=gzip",
                f"--temp_location={tmp_path / 'tmp'}",
                *LOCAL,
            ]
        )
        == 0
    )
    assert all(p.endswith(".tfrecord.gz") for p in shards(output)) and len(shards(output)) == 3
    spec = {"index": tf.io.FixedLenFeature([], tf.int64)}
    dataset = tf.data.TFRecordDataset(shards(output), compression_type="GZIP")
    indexes = [int(tf.io.parse_single_example(r, spec)["index"]) for r in dataset]
    assert sorted(indexes) == sorted(rows)


def test_features_follow_the_json_types():
    module = load_example_module()
    fn = module.JsonToExample()
    fn.setup()
    line = json.dumps(
        {
            "i": 3,
            "b": True,
            "f": 0.5,
            "s": "é",
            "li": [1, 2],
            "lf": [1, 2.5],
            "ls": ["a", "b"],
            "n": None,
            "empty": [],
        }
    )
    (record,) = list(fn.process(line))
    features = tf.train.Example.FromString(record).features.feature
    assert list(features["i"].int64_list.value) == [3] and list(features["b"].int64_list.value) == [
        1
    ]
    assert list(features["f"].float_list.value) == [0.5] and list(
        features["lf"].float_list.value
    ) == [1.0, 2.5]
    assert list(features["s"].bytes_list.value) == ["é".encode()] and list(
        features["ls"].bytes_list.value
    ) == [b"a", b"b"]
    assert list(features["li"].int64_list.value) == [1, 2]
    assert "n" not in features and "empty" not in features
    keyed = module.JsonToExample("i")
    keyed.setup()
    assert list(keyed.process(line))[0][0] == 3
    with pytest.raises(ValueError, match="nested"):
        list(fn.process(json.dumps({"x": {"y": 1}})))
    assert list(fn.process("   ")) == []
