"""ds.tf() with real tf.data on outputs of real pipeline runs: tf.train.Example payloads
written by TensorFlow go straight into tf.io.parse_example; Parquet rows become dicts of
tensors; the state after n consumed records resumes exactly although tf.data runs ahead."""

import itertools
import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tensorflow as tf
from helpers import run_shuffle, shuffled_sample

from pileshuffle.commands import sample
from pileshuffle.loader import ShuffledDataset
from pileshuffle.loader.tf import chunk_records, state_in_epoch, tf_dtype

EXAMPLES = 900
FEATURES = {
    "index": tf.io.FixedLenFeature([], tf.int64),
    "weight": tf.io.FixedLenFeature([], tf.float32),
    "text": tf.io.FixedLenFeature([], tf.string),
}


def example(i):
    return tf.train.Example(
        features=tf.train.Features(
            feature={
                "index": tf.train.Feature(int64_list=tf.train.Int64List(value=[i])),
                "weight": tf.train.Feature(float_list=tf.train.FloatList(value=[i / 8])),
                "text": tf.train.Feature(
                    bytes_list=tf.train.BytesList(value=[b"t%d" % i * (i % 7)])
                ),
            }
        )
    ).SerializeToString()


@pytest.fixture(scope="module")
def examples(tmp_path_factory):
    """tf.train.Examples written by TensorFlow's own TFRecordWriter, shuffled by a real run."""
    root = tmp_path_factory.mktemp("tf")
    os.makedirs(root / "in")
    for f in range(3):
        with tf.io.TFRecordWriter(str(root / "in" / f"part-{f}.tfrecord")) as writer:
            for i in range(f, EXAMPLES, 3):
                writer.write(example(i))
    run_shuffle(
        str(root / "in" / "*.tfrecord"), str(root / "out" / "train"), "--num_piles=5", "--seed=2"
    )
    return str(root / "out" / "train")


@pytest.fixture(scope="module")
def parquet_output(tmp_path_factory):
    return shuffled_sample(
        tmp_path_factory, "parquet", "--num_piles=3", records=500, files=2, record_bytes=60
    )


@pytest.fixture(scope="module")
def jsonl_output(tmp_path_factory):
    return shuffled_sample(
        tmp_path_factory, "jsonl", "--num_piles=3", records=400, files=2, record_bytes=50
    )


def parsed_indexes(dataset):
    """``index`` of every Example, through batch + tf.io.parse_example, in stream order."""
    parsed = dataset.batch(64).map(lambda x: tf.io.parse_example(x, FEATURES))
    return [int(i) for batch in parsed for i in batch["index"].numpy()]


def test_examples_parse_straight_from_the_records(examples):
    ds = ShuffledDataset(examples, seed=4, epoch=1)
    assert ds.tf().element_spec == tf.TensorSpec(shape=(), dtype=tf.string)
    indexes = parsed_indexes(ds.tf())
    assert sorted(indexes) == list(range(EXAMPLES))
    ds.set_epoch(1)
    assert indexes == [
        tf.train.Example.FromString(r).features.feature["index"].int64_list.value[0] for r in ds
    ]
    batch = next(iter(ds.tf().batch(32).map(lambda x: tf.io.parse_example(x, FEATURES))))
    assert batch["weight"].numpy().tolist() == [i / 8 for i in batch["index"].numpy().tolist()]
    assert [t for t in batch["text"].numpy()] == [
        b"t%d" % i * (i % 7) for i in batch["index"].numpy().tolist()
    ]


@pytest.mark.parametrize("chunk", [8192, 64])  # 64: batches cut across the generator's chunks
def test_batches_are_the_same_records(examples, chunk, monkeypatch):
    monkeypatch.setattr("pileshuffle.loader.tf.CHUNK_RECORDS", chunk)
    ds = ShuffledDataset(examples, seed=4, epoch=1)
    batched = ds.tf(batch_size=50, drop_last=True)
    # static, as batch(drop_remainder=True)
    assert batched.element_spec == tf.TensorSpec(shape=(50,), dtype=tf.string)
    assert ds.tf(batch_size=50).element_spec == tf.TensorSpec(shape=(None,), dtype=tf.string)
    sizes = [int(b.shape[0]) for b in batched]
    assert sizes == [50] * (EXAMPLES // 50)
    ds.set_epoch(1)
    batches = [b.numpy().tolist() for b in ds.tf(batch_size=50)]
    ds.set_epoch(1)
    records = list(ds)
    assert batches == [records[i : i + 50] for i in range(0, EXAMPLES, 50)]


def test_split_by_rank(examples):
    parts = [
        parsed_indexes(ShuffledDataset(examples, seed=4, rank=r, world_size=4).tf())
        for r in range(4)
    ]
    assert all(len(p) == EXAMPLES // 4 for p in parts)
    assert sorted(i for p in parts for i in p) == list(range(EXAMPLES))


@pytest.mark.parametrize("consumed", [0, 1, 255, 600, EXAMPLES])
def test_state_after_consumed_records_resumes_exactly(examples, consumed):
    full = [r.numpy() for r in ShuffledDataset(examples, seed=4, epoch=3).tf()]
    ds = ShuffledDataset(examples, seed=4, epoch=3)
    stream = iter(ds.tf().prefetch(400))  # runs ahead of what the loop has consumed
    head = [next(stream).numpy() for _ in range(consumed)]
    state = json.loads(json.dumps(ds.state_after(consumed)))  # n alone, not the iterator's position
    resumed = ShuffledDataset(examples, seed=4, epoch=0)
    resumed.load_state_dict(state)
    assert head + [r.numpy() for r in resumed.tf()] == full


def test_parquet_rows_are_dicts_of_tensors(parquet_output):
    ds = ShuffledDataset(parquet_output, seed=1, epoch=1)
    spec = ds.tf().element_spec
    assert spec == {
        "index": tf.TensorSpec((), tf.int64),
        "label": tf.TensorSpec((), tf.int32),
        "weight": tf.TensorSpec((), tf.float64),
        "name": tf.TensorSpec((), tf.string),
        "payload": tf.TensorSpec((), tf.string),
    }
    rows = [{k: v.numpy() for k, v in row.items()} for row in ds.tf()]
    ds.set_epoch(1)
    expected = list(ds)
    assert [r["index"] for r in rows] == [e["index"] for e in expected]
    assert [r["name"].decode() for r in rows] == [e["name"] for e in expected]
    assert [r["payload"] for r in rows] == [e["payload"] for e in expected]
    assert [r["weight"] for r in rows] == [e["weight"] for e in expected]
    batches = list(
        ShuffledDataset(parquet_output, seed=1, epoch=1, columns=["index", "label"]).tf(
            batch_size=128
        )
    )
    assert set(batches[0]) == {"index", "label"} and batches[0]["label"].dtype == tf.int32
    assert sorted(i for b in batches for i in b["index"].numpy().tolist()) == list(range(500))


def test_jsonl_lines_are_strings(jsonl_output):
    ds = ShuffledDataset(jsonl_output, seed=1, epoch=2)
    lines = [r.numpy() for r in ds.tf()]
    ds.set_epoch(2)
    assert lines == list(ds)
    assert sorted(json.loads(line)["index"] for line in lines) == list(range(400))


def test_nested_parquet_columns_are_refused_by_name():
    assert tf_dtype(pa.field("x", pa.int16())) == tf.int16
    with pytest.raises(TypeError, match="'tags'.*columns="):
        tf_dtype(pa.field("tags", pa.list_(pa.string())))


def test_every_pass_reads_the_next_epoch_unless_set(examples):
    def epoch_of(e):
        return list(ShuffledDataset(examples, seed=4, epoch=e))

    ds = ShuffledDataset(examples, seed=4, epoch=1)
    passes = [r.numpy() for r in ds.tf().repeat(3)]
    assert passes == epoch_of(1) + epoch_of(2) + epoch_of(3)  # .repeat() reshuffles
    records = ds.tf()
    ds.set_epoch(7)
    assert [r.numpy() for r in records] == epoch_of(7)
    ds.set_epoch(1)
    assert [r.numpy() for r in records] == epoch_of(1)  # set_epoch between passes chooses


def test_state_in_an_epoch_a_repeating_pipeline_has_left(examples):
    ds = ShuffledDataset(examples, seed=4, epoch=1)
    stream = iter(ds.tf(batch_size=100).repeat().prefetch(20))
    consumed = 0
    while consumed < EXAMPLES + 300:  # into epoch 2; the generator may be in epoch 3 already
        consumed += int(next(stream).shape[0])
    epoch, n = 1 + consumed // EXAMPLES, consumed % EXAMPLES
    state = state_in_epoch(ds, epoch, n)
    resumed = ShuffledDataset(examples, seed=4)
    resumed.load_state_dict(state)
    assert [r.numpy() for r in resumed.tf()] == list(ShuffledDataset(examples, seed=4, epoch=2))[n:]


def test_state_in_an_epoch_resumed_elastically_continues_its_redealt_split(examples):
    """One rank reads 100 records, three ranks resume its state elastically (each its share of
    the redealt rest), each reads 50 and saves ``state_in_epoch``; resumed from those states
    the three read the rest: over the epoch every record once (found by test_life_training:
    the state was computed on the standard split, which ``set_epoch`` restored, and 11 records
    of 301 were never read)."""
    first = ShuffledDataset(examples, seed=4, epoch=1)
    seen = [r.numpy() for r in itertools.islice(first.tf(), 100)]
    saved = [first.state_after(100)]
    states = []
    for rank in range(3):
        elastic = ShuffledDataset(examples, seed=4, epoch=1, rank=rank, world_size=3)
        elastic.load_state_dict(saved)
        seen += [r.numpy() for r in itertools.islice(elastic.tf(), 50)]
        states.append(state_in_epoch(elastic, 1, 50))
    for rank in range(3):
        resumed = ShuffledDataset(examples, seed=4, epoch=1, rank=rank, world_size=3)
        resumed.load_state_dict(states[rank])
        seen += [r.numpy() for r in resumed.tf()]
    # the redeal may drop < world_size
    assert len(seen) == len(set(seen)) and EXAMPLES - len(seen) < 3


def test_parquet_nulls_are_refused_by_column(tmp_path):
    os.makedirs(tmp_path / "in")
    table = pa.table(
        {
            "index": pa.array(range(60)),
            "maybe": pa.array([None if i == 40 else i for i in range(60)]),
        }
    )
    pq.write_table(table, str(tmp_path / "in" / "a.parquet"))
    run_shuffle(
        str(tmp_path / "in" / "*.parquet"),
        str(tmp_path / "out" / "train"),
        "--format=parquet",
        "--num_piles=2",
    )
    assert len(list(ShuffledDataset(str(tmp_path / "out" / "train"), columns=["index"]).tf())) == 60
    with pytest.raises(
        tf.errors.InvalidArgumentError, match="column .maybe. of .*train.* has null values"
    ):
        list(ShuffledDataset(str(tmp_path / "out" / "train")).tf())


def test_wide_records_come_in_smaller_chunks(parquet_output, tmp_path):
    assert chunk_records(ShuffledDataset(parquet_output)) == 8192  # ~60-byte rows
    # 1 MiB records
    sample.write_tfrecord(str(tmp_path / "in"), records=20, files=1, record_bytes=1 << 20)
    run_shuffle(
        str(tmp_path / "in" / "*.tfrecord"), str(tmp_path / "out" / "train"), "--num_piles=2"
    )
    wide = ShuffledDataset(str(tmp_path / "out" / "train"))
    assert chunk_records(wide) == 8  # 8 MiB per generator step, not 8,192 MiB
    assert len([r for r in wide.tf()]) == 20
