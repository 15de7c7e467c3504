"""Batches from DataLoader workers through shared memory (``pileshuffle.loader.handoff``): what
the training loop receives through workers is exactly the in-process batches of each worker's
part, in the DataLoader's round-robin order; the ring hands regions out and back in order,
wraps, grows for big batches and, when full, sends a batch inside the pickle instead."""

import multiprocessing
import os
import pickle

import numpy as np
import pyarrow as pa
import pytest
import torch
from helpers import shuffled_sample
from torch.utils.data import DataLoader

from pileshuffle.loader import ShuffledDataset
from pileshuffle.loader.batching import array_batches, list_batches
from pileshuffle.loader.handoff import RING_BYTES, ArrowOnArrival, BytesOnArrival

# 3 workers on a 2-core machine
pytestmark = [pytest.mark.filterwarnings("ignore:This DataLoader will create")]

SMALL = 4096  # a batch's pickle when its bytes went through the ring: its place, not its bytes
PLACE = 600  # the same for the test outputs' batches, a Parquet batch's schema included


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    """Real runs' outputs: records of varying size (TFRecord), lines (JSONL), rows (Parquet)."""
    return {
        "tfrecord": shuffled_sample(
            tmp_path_factory,
            "tfrecord",
            "--num_piles=5",
            "--seed=4",
            records=777,
            record_bytes=80,
            vary=True,
        ),
        "jsonl": shuffled_sample(tmp_path_factory, "jsonl", "--num_piles=3", records=500),
        "parquet": shuffled_sample(
            tmp_path_factory, "parquet", "--num_piles=4", records=600, files=2, record_bytes=60
        ),
    }


def round_robin(parts):
    """Batches as a DataLoader deals them: worker 0, 1, ..., skipping a worker once used up."""
    parts, out = [list(p) for p in parts], []
    while any(parts):
        for part in parts:
            if part:
                out.append(part.pop(0))
    return out


def in_process(output, num_workers, batch_size, **batches):
    """Each worker's part read in this process, dealt as a DataLoader deals them."""
    ds = ShuffledDataset(output, seed=3, epoch=1)
    return round_robin(
        ds.for_worker(w, num_workers).batches(batch_size, **batches) for w in range(num_workers)
    )


@pytest.mark.parametrize(
    "fmt,num_workers,drop_last",
    [("tfrecord", 2, False), ("tfrecord", 3, True), ("tfrecord", 1, False), ("jsonl", 2, True)],
)
def test_byte_batches_through_workers_are_the_in_process_batches(
    outputs, fmt, num_workers, drop_last
):
    tds = ShuffledDataset(outputs[fmt], seed=3, epoch=1).torch(batch_size=32, drop_last=drop_last)
    received = list(DataLoader(tds, batch_size=None, num_workers=num_workers))
    assert all(type(batch) is list and all(type(r) is bytes for r in batch) for batch in received)
    expected = in_process(outputs[fmt], num_workers, 32, drop_last=drop_last)
    assert received == expected  # same records, same batches, same order
    assert all(len(batch) == 32 for batch in received) or not drop_last


def test_parquet_columns_through_workers_are_the_in_process_columns(outputs):
    tds = ShuffledDataset(outputs["parquet"], seed=3, epoch=1).torch(batch_size=50)
    received = list(DataLoader(tds, batch_size=None, num_workers=2))
    expected = in_process(outputs["parquet"], 2, 50, as_numpy=True)
    assert len(received) == len(expected) and len(received[0]) == 5
    for got, want in zip(received, expected):
        assert list(got) == list(want)
        for name, column in want.items():
            # strings and binary: numpy object arrays, as in the main process
            if column.dtype == object:
                assert got[name].dtype == object and got[name].tolist() == column.tolist()
            else:
                assert isinstance(got[name], torch.Tensor) and np.array_equal(
                    got[name].numpy(), column
                )
                assert got[name].numpy().dtype == column.dtype


def test_parquet_record_batches_through_workers_keep_their_order(outputs):
    tds = ShuffledDataset(outputs["parquet"], seed=3, epoch=1).torch(batch_size=50, as_numpy=False)
    received = list(DataLoader(tds, batch_size=None, num_workers=2))
    assert [b.to_pydict() for b in received] == [
        b.to_pydict() for b in in_process(outputs["parquet"], 2, 50)
    ]


def test_array_batches_are_list_batches():
    # pieces a step boundary cuts, pieces past a batch, an empty one
    sizes = [
        64,
        40,
        24,
        50,
        50,
        10,
        0,
        3,
    ]
    tables, start = [], 0
    for n in sizes:
        tables.append(
            pa.table(
                {
                    "payload": pa.array(
                        [b"r%d-" % i * (i % 7) for i in range(start, start + n)], pa.binary_view()
                    )
                }
            )
        )
        start += n
    arrays = list(array_batches(tables, 64))
    assert [a.to_pylist() for a in arrays] == list(list_batches(tables, 64))
    assert [len(a) for a in arrays] == [64, 64, 64, 49]


def records(count, seed, size=1000):
    rng = np.random.default_rng(seed)
    return [rng.bytes(int(n)) for n in rng.integers(0, 2 * size, count)]


def batch(count, seed, size=1000):
    """A sliced ``large_binary`` array (offsets not starting at 0), as ``array_batches`` yields."""
    return pa.array(records(count + 5, seed, size), pa.large_binary()).slice(5)


def _send_from_child(conn):
    """The worker's side: pickle first and send after (the ring fills and then overflows into
    pickles), then one at a time on the parent's word (the ring wraps), then big batches."""
    first = [pickle.dumps(BytesOnArrival(batch(256, s), ring=True)) for s in range(24)]
    for message in first:
        conn.send_bytes(message)
    for s in range(100, 200):
        conn.recv_bytes()
        conn.send_bytes(pickle.dumps(BytesOnArrival(batch(256, s), ring=True)))
    for s in range(200, 203):
        conn.recv_bytes()
        # > 1/8 of the ring: a bigger ring
        conn.send_bytes(pickle.dumps(BytesOnArrival(batch(1200, s), ring=True)))
    arrow = pa.record_batch({"index": np.arange(300), "payload": pa.array(records(300, 9))}).slice(
        7, 250
    )
    conn.recv_bytes()
    conn.send_bytes(pickle.dumps(ArrowOnArrival(arrow, ring=True)))
    conn.close()


@pytest.mark.skipif(not hasattr(os, "memfd_create"), reason="shared memory rings need memfd_create")
def test_the_ring_hands_out_releases_wraps_grows_and_overflows_into_pickles():
    parent, child = multiprocessing.Pipe()
    process = multiprocessing.get_context("fork").Process(
        target=_send_from_child, args=(child,), daemon=True
    )
    process.start()
    try:
        sizes = []
        # all pickled before any arrived: 16 fit the ring, the rest travel inside
        for s in range(24):
            message = parent.recv_bytes()
            sizes.append(len(message))
            assert pickle.loads(message) == batch(256, s).to_pylist()
        fit = sum(n < SMALL for n in sizes)  # ~258 KB each (random sizes) in 4 MiB
        assert RING_BYTES // 300_000 <= fit <= RING_BYTES // 200_000 and all(
            n < SMALL for n in sizes[: fit - 2]
        )
        assert all(n > 100_000 for n in sizes if n >= SMALL)
        # 100 x ~256 KB through a 4 MiB ring: six laps, then a bigger ring
        for s in range(100, 203):
            parent.send_bytes(b"next")
            message = parent.recv_bytes()
            assert len(message) < SMALL
            assert pickle.loads(message) == batch(256 if s < 200 else 1200, s).to_pylist()
        parent.send_bytes(b"next")
        message = parent.recv_bytes()
        arrow = pa.record_batch(
            {"index": np.arange(300), "payload": pa.array(records(300, 9))}
        ).slice(7, 250)
        assert len(message) < SMALL + 1000 and pickle.loads(message).equals(arrow)
    finally:
        process.join(30)
        process.kill()  # a child left waiting by a failed assertion
    assert process.exitcode == 0


def test_pickled_outside_a_worker_a_batch_carries_its_bytes():
    array = batch(100, 1)
    message = pickle.dumps(BytesOnArrival(array))
    assert (
        len(message) > sum(map(len, array.to_pylist()))
        and pickle.loads(message) == array.to_pylist()
    )
    assert (
        list(BytesOnArrival(array)) == array.to_pylist()
        and BytesOnArrival(array)[3] == array[3].as_py()
    )
    assert pickle.loads(pickle.dumps(BytesOnArrival(array.slice(7, 0), ring=True))) == []
    empty_records = pa.array([b"", b""], pa.large_binary())
    assert pickle.loads(pickle.dumps(BytesOnArrival(empty_records, ring=True))) == [b"", b""]


def pickled_and_payload_bytes(batch):
    """In the worker: how long the batch's pickle is, and how many bytes it holds."""
    held = sum(map(len, batch)) if isinstance(batch, BytesOnArrival) else batch.batch.nbytes
    return len(pickle.dumps(batch)), held


@pytest.mark.skipif(not hasattr(os, "memfd_create"), reason="shared memory rings need memfd_create")
@pytest.mark.parametrize("fmt", ["tfrecord", "parquet"])
def test_worker_batches_cross_as_their_place_in_shared_memory(outputs, fmt):
    tds = ShuffledDataset(outputs[fmt], seed=3, epoch=1).torch(batch_size=64)
    sizes = list(
        DataLoader(tds, batch_size=None, num_workers=2, collate_fn=pickled_and_payload_bytes)
    )
    # batches of 64 records of ~80 bytes (Parquet: ~56 a row)
    assert sum(held > 3000 for _, held in sizes) >= 8
    assert all(pickled < PLACE for pickled, _ in sizes)  # not their bytes
