"""ShuffleToPiles and WritePiles composed into a user's own Beam pipeline."""

import collections
import glob
import json

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from helpers import manifest, read_tfrecord_payloads, shard_bytes, shards

from pileshuffle import ShuffleToPiles, WritePiles


def run_pipeline(build, *args):
    options = PipelineOptions(["--direct_running_mode=in_memory", *args])
    with beam.Pipeline(runner=FnApiRunner(), options=options) as p:
        build(p)


def preprocess(line: bytes) -> bytes:
    row = json.loads(line)
    return json.dumps({"id": row["id"], "text": row["text"].upper()}, sort_keys=True).encode()


ROWS = [json.dumps({"id": i, "text": f"row {i}"}).encode() for i in range(5000)]


@pytest.mark.parametrize("temp", [True, False], ids=["files", "shuffle"])
def test_preprocess_then_shuffle_then_write(tmp_path, temp):
    out = str(tmp_path / "out" / "pre")
    temp_location = str(tmp_path / "tmp") if temp else None
    run_pipeline(
        lambda p: (
            p
            | beam.Create(ROWS, reshuffle=False)
            | beam.Map(preprocess)
            | ShuffleToPiles(num_piles=5, seed=1, temp_location=temp_location)
            | WritePiles(out, format="tfrecord")
        )
    )
    got = read_tfrecord_payloads(shards(out))
    assert collections.Counter(got) == collections.Counter(preprocess(r) for r in ROWS)
    ids = [json.loads(r)["id"] for r in got]
    assert ids != sorted(ids)
    assert manifest(out)["totals"]["records"] == 5000 and len(shards(out)) == 5
    if temp:
        assert not glob.glob(str(tmp_path / "tmp" / "*" / "*"))  # fragments removed


def test_keyed_input_is_reproducible(tmp_path):
    outputs = []
    for attempt, workers in enumerate([1, 2]):
        out = str(tmp_path / f"k{attempt}" / "keyed")
        run_pipeline(
            lambda p: (
                p
                | beam.Create(list(enumerate(ROWS)))
                | beam.MapTuple(lambda i, line: (i, preprocess(line)))
                | ShuffleToPiles(num_piles=3, seed=9, keyed=True)
                | WritePiles(out, format="jsonl")
            ),
            f"--direct_num_workers={workers}",
            "--direct_running_mode=multi_threading",
        )
        outputs.append(shard_bytes(out))
    assert outputs[0] == outputs[1]
    lines = b"".join(outputs[0]).splitlines()
    assert sorted(lines) == sorted(preprocess(r) for r in ROWS)


def test_arrow_batches_to_parquet(tmp_path):
    schema = pa.schema([("id", pa.int64()), ("x", pa.float32())], metadata={"owner": "me"})
    batches = [
        pa.record_batch(
            [pa.array(range(i, i + 100)), pa.array([float(i)] * 100, pa.float32())], schema=schema
        )
        for i in range(0, 3000, 100)
    ]
    out = str(tmp_path / "out" / "tab")
    run_pipeline(
        lambda p: (
            p
            | beam.Create(batches)
            | ShuffleToPiles(num_piles=4, seed=2)
            | WritePiles(out, format="parquet")
        )
    )
    table = pq.read_table(shards(out))
    assert sorted(table.column("id").to_pylist()) == list(range(3000))
    assert table.column("id").to_pylist() != list(range(3000))
    assert pq.read_schema(shards(out)[0]).metadata[b"owner"] == b"me"


def test_bad_element_type_is_a_clear_error(tmp_path):
    with pytest.raises(Exception, match="ShuffleToPiles takes bytes or pyarrow"):
        run_pipeline(
            lambda p: (
                p
                | beam.Create([{"a": 1}])
                | ShuffleToPiles(num_piles=2)
                | WritePiles(str(tmp_path / "o"), format="jsonl")
            )
        )
