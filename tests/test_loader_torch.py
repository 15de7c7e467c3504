"""ds.torch() with the real torch DataLoader and torchdata's StatefulDataLoader, on outputs of
real pipeline runs: every record once per epoch across ranks and workers, exact resumes."""

import collections
import json
import pickle

import google_crc32c
import numpy as np
import pyarrow as pa
import pytest
import torch
from helpers import manifest, read_tfrecord_payloads, shards, shuffled_sample
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader
from torchdata.stateful_dataloader import StatefulDataLoader

from pileshuffle.loader import ShuffledDataset
from pileshuffle.loader.torch import ArrowOnArrival
from pileshuffle.loader.torch_resume import loader_states, round_robin, worker_states
from pileshuffle.records.fingerprint import Fingerprint, payload_hashes

# torch's own advice for a 2-core machine, and torchdata's call of a deprecated torch API
pytestmark = [
    pytest.mark.filterwarnings("ignore:This DataLoader will create"),
    pytest.mark.filterwarnings("ignore:'set_vital' is deprecated"),
]

RECORDS = 1001  # divisible by none of the world sizes and worker counts below
PILES = 7


@pytest.fixture(scope="module")
def output(tmp_path_factory):
    """A TFRecord output of a real run: 1001 records of varying size in 7 piles."""
    return shuffled_sample(
        tmp_path_factory,
        "tfrecord",
        f"--num_piles={PILES}",
        "--seed=5",
        records=RECORDS,
        record_bytes=60,
        vary=True,
    )


@pytest.fixture(scope="module")
def written(output):
    """The output's records as written, read back by Beam's own TFRecord codec."""
    return read_tfrecord_payloads(shards(output))


@pytest.fixture(scope="module")
def parquet_output(tmp_path_factory):
    return shuffled_sample(
        tmp_path_factory, "parquet", "--num_piles=4", records=600, files=2, record_bytes=60
    )


def flat(batches):
    """Records of a DataLoader's batches (lists of bytes) in the order they came."""
    return [record for batch in batches for record in batch]


def fingerprint(records):
    crcs = [google_crc32c.value(r) for r in records]
    return Fingerprint.of(
        payload_hashes(np.array(crcs, np.uint64), np.array([len(r) for r in records], np.uint64)),
        sum(map(len, records)),
    )


def epoch(output, *, num_workers, batch_size=16, epoch=1, **kw):
    ds = ShuffledDataset(output, seed=3, epoch=epoch, **kw)
    return flat(DataLoader(ds.torch(), batch_size=batch_size, num_workers=num_workers))


def test_epoch_is_the_manifests_multiset_through_workers(output, written):
    records = epoch(output, num_workers=2)
    assert collections.Counter(records) == collections.Counter(written)
    assert fingerprint(records) == Fingerprint.from_json(manifest(output)["output_fingerprint"])
    assert records != written  # reshuffled: not the written order
    assert records != epoch(output, num_workers=2, epoch=2)  # another epoch, another order
    assert records == epoch(output, num_workers=2)  # same seed and epoch, same order


def test_written_order_in_process(output, written):
    ds = ShuffledDataset(output, epoch=0, reshuffle=False)
    assert flat(DataLoader(ds.torch(), batch_size=10, num_workers=0)) == written


@pytest.mark.parametrize("world_size,num_workers", [(1, 3), (2, 2), (3, 2), (4, 3), (2, 5)])
def test_ranks_and_workers_are_disjoint_and_complete(output, written, world_size, num_workers):
    per_rank = []
    for rank in range(world_size):
        ds = ShuffledDataset(output, seed=3, epoch=1, rank=rank, world_size=world_size)
        records = flat(DataLoader(ds.torch(), batch_size=16, num_workers=num_workers))
        # remainder dropped: equal counts for DDP
        assert len(records) == len(ds) == RECORDS // world_size
        per_rank.append(records)
    together = [r for records in per_rank for r in records]
    assert len(set(together)) == len(together)  # disjoint (generated payloads are distinct)
    assert set(together) <= set(written)
    # complete but for the remainder
    assert len(set(written) - set(together)) == RECORDS % world_size


def test_ranks_pad_to_equal_counts(output, written):
    counts = collections.Counter()
    for rank in range(4):
        ds = ShuffledDataset(output, seed=3, rank=rank, world_size=4, remainder="pad")
        records = flat(DataLoader(ds.torch(), batch_size=16, num_workers=2))
        assert len(records) == len(ds) == -(-RECORDS // 4)
        counts.update(records)
    assert set(counts) == set(written)  # complete; the padding repeats a few records
    assert sum(counts.values()) - RECORDS == 4 * (-(-RECORDS // 4)) - RECORDS


def stream(loader, limit=None):
    """Batches of ``loader`` (lists of bytes), stopping after ``limit`` batches."""
    out = []
    for batch in loader:
        out.append(list(batch))
        if limit is not None and len(out) == limit:
            break
    return out


# 100 of 101: worker 0 is done, worker 1 not
@pytest.mark.parametrize(
    "num_workers,batched,stop",
    [(2, False, 9), (3, True, 17), (0, False, 30), (2, True, 1), (2, False, 100)],
)
def test_stateful_dataloader_resumes_exactly(output, num_workers, batched, stop):
    def loader():
        ds = ShuffledDataset(output, seed=3, epoch=1, world_size=1)
        if batched:  # batches made in the worker, DataLoader batch_size=None
            return StatefulDataLoader(
                ds.torch(batch_size=10), batch_size=None, num_workers=num_workers
            )
        return StatefulDataLoader(ds.torch(), batch_size=10, num_workers=num_workers)

    whole = stream(loader())
    first = loader()
    head = stream(first, stop)
    # a checkpoint on disk is JSON, or torch.save
    state = json.loads(json.dumps(first.state_dict()))
    del first
    again = loader()
    again.load_state_dict(state)
    assert head + stream(again) == whole


@settings(
    max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(num_workers=st.integers(0, 3), batch_size=st.integers(1, 90), data=st.data())
def test_stateful_dataloader_resumes_at_any_batch(output, num_workers, batch_size, data):
    def loader():
        ds = ShuffledDataset(output, seed=3, epoch=2, mix=2)
        return StatefulDataLoader(
            ds.torch(batch_size=batch_size), batch_size=None, num_workers=num_workers
        )

    whole = stream(loader())
    stop = data.draw(st.integers(1, len(whole)), label="batches before the checkpoint")
    first = loader()
    assert stream(first, stop) == whole[:stop]
    again = loader()
    again.load_state_dict(first.state_dict())
    assert stream(again) == whole[stop:]


def test_stateful_dataloader_next_epoch_after_resume(output):
    ds = ShuffledDataset(output, seed=3, epoch=1)
    loader = StatefulDataLoader(ds.torch(), batch_size=10, num_workers=2)
    iterator = iter(loader)
    for _ in range(5):
        next(iterator)
    state = loader.state_dict()
    resumed_ds = ShuffledDataset(output, seed=3, epoch=1)
    tds = resumed_ds.torch()
    resumed = StatefulDataLoader(tds, batch_size=10, num_workers=2)
    resumed.load_state_dict(state)
    stream(resumed)  # the rest of epoch 1
    tds.set_epoch(2)
    assert flat(stream(resumed)) == epoch(output, num_workers=2, batch_size=10, epoch=2)


@pytest.mark.parametrize(
    "before,after",
    [((1, 2), (1, 3)), ((1, 3), (1, 1)), ((2, 2), (1, 3)), ((1, 2), (3, 2)), ((2, 0), (1, 2))],
)
def test_resume_with_other_workers_and_ranks_loses_and_repeats_nothing(
    output, written, before, after
):
    """(world_size, num_workers) changes between checkpoint and resume: every rank's
    StatefulDataLoader state is gathered (as DDP's all_gather_object would), and each new
    rank loads the whole list."""
    (old_world, old_workers), (new_world, new_workers) = before, after
    seen, states = [], []
    for rank in range(old_world):
        ds = ShuffledDataset(output, seed=3, epoch=1, rank=rank, world_size=old_world)
        loader = StatefulDataLoader(
            ds.torch(batch_size=8), batch_size=None, num_workers=old_workers
        )
        seen += flat(stream(loader, 7 + rank))
        states += worker_states(json.loads(json.dumps(loader.state_dict())))
    assert len(states) == old_world * max(1, old_workers)
    for rank in range(new_world):
        tds = ShuffledDataset(output, seed=3, epoch=1, rank=rank, world_size=new_world).torch(
            batch_size=8
        )
        tds.load_state_dict(states)
        seen += flat(stream(StatefulDataLoader(tds, batch_size=None, num_workers=new_workers)))
    assert len(seen) == len(set(seen))  # nothing repeated
    dropped = RECORDS % old_world  # the first split's remainder is never read
    assert len(seen) == RECORDS - dropped and set(seen) <= set(written)  # nothing lost


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    num_workers=st.integers(0, 3),
    batch_size=st.integers(1, 70),
    batched=st.booleans(),
    data=st.data(),
)
def test_plain_dataloader_resumes_from_the_number_of_batches(
    output, num_workers, batch_size, batched, data
):
    def tds():
        ds = ShuffledDataset(output, seed=3, epoch=1)
        return ds.torch(batch_size=batch_size) if batched else ds.torch()

    def loader(dataset):
        return DataLoader(
            dataset, batch_size=None if batched else batch_size, num_workers=num_workers
        )

    whole = stream(loader(tds()))
    taken = data.draw(st.integers(0, len(whole)), label="batches taken")
    resumed = tds()
    resumed.load_state_dict(
        loader_states(resumed, taken, num_workers=num_workers, batch_size=batch_size)
    )
    assert stream(loader(resumed)) == whole[taken:]


@pytest.mark.parametrize("taken", [0, 5, 16, 31])
def test_plain_dataloader_resume_on_one_rank_of_several(output, taken):
    """Each rank rebuilds only its own workers' states from its own batch count."""

    def tds():
        return ShuffledDataset(output, seed=3, epoch=1, rank=1, world_size=3).torch(batch_size=11)

    whole = stream(DataLoader(tds(), batch_size=None, num_workers=2))
    resumed = tds()
    resumed.load_state_dict(loader_states(resumed, taken, num_workers=2))
    assert stream(DataLoader(resumed, batch_size=None, num_workers=2)) == whole[taken:]


@pytest.mark.parametrize("taken", [1, 4])
def test_plain_dataloader_resumes_exactly_after_an_elastic_resume(output, written, taken):
    """Two ranks without workers stop; two ranks of two workers resume elastically (their
    ranges are the redealt tails, not the standard split's); each saves its own workers'
    states by ``loader_states`` and resumes them exactly: the rest is the uninterrupted
    rest, and over the epoch nothing is lost or repeated (found by test_life_training: the
    redealt ranges were not recognised as the rank's own, and half of each was dealt away)."""

    def tds(rank):
        return ShuffledDataset(output, seed=3, epoch=1, rank=rank, world_size=2).torch(batch_size=8)

    seen, states = [], []
    for rank in range(2):
        first = tds(rank)
        seen += flat(stream(DataLoader(first, batch_size=None, num_workers=0), 3))
        states += json.loads(json.dumps(loader_states(first, 3, num_workers=0)))
    for rank in range(2):
        elastic = tds(rank)
        elastic.load_state_dict(states)
        whole = stream(DataLoader(elastic, batch_size=None, num_workers=2))
        elastic = tds(rank)
        elastic.load_state_dict(states)
        seen += flat(stream(DataLoader(elastic, batch_size=None, num_workers=2), taken))
        resumed = tds(rank)
        resumed.load_state_dict(
            json.loads(json.dumps(loader_states(elastic, taken, num_workers=2)))
        )
        rest = stream(DataLoader(resumed, batch_size=None, num_workers=2))
        assert rest == whole[taken:]
        seen += flat(rest)
    assert len(seen) == len(set(seen)) and set(seen) <= set(written)
    assert len(seen) >= RECORDS - 2  # each split may leave out fewer than world_size records


def test_round_robin_skips_workers_that_are_done():
    assert round_robin(0, [2, 3]) == ([0, 0], 0)
    assert round_robin(3, [2, 3]) == ([2, 1], 1)
    assert round_robin(4, [2, 3]) == ([2, 2], 1)  # worker 0 is done: worker 1's turn again
    assert round_robin(5, [2, 3, 1]) == ([2, 2, 1], 1)
    assert round_robin(6, [2, 3, 1]) == ([2, 3, 1], 0)
    with pytest.raises(ValueError, match="only 6"):
        round_robin(7, [2, 3, 1])


@pytest.mark.parametrize("num_workers", [0, 2])
def test_parquet_batches_become_tensors(parquet_output, num_workers):
    ds = ShuffledDataset(parquet_output, seed=1, epoch=1, columns=["index", "weight", "name"])
    batches = list(DataLoader(ds.torch(batch_size=50), batch_size=None, num_workers=num_workers))
    assert all(type(b) is dict for b in batches)
    assert (
        isinstance(batches[0]["index"], torch.Tensor) and batches[0]["index"].dtype == torch.int64
    )
    assert batches[0]["weight"].dtype == torch.float64
    indexes = np.concatenate([b["index"].numpy() for b in batches])
    assert sorted(indexes.tolist()) == list(range(600))
    names = [n for b in batches for n in b["name"]]
    assert names == [f"item-{i}" for i in indexes.tolist()]  # columns stay aligned


def test_parquet_record_batches_cross_workers_as_their_own_bytes(parquet_output):
    ds = ShuffledDataset(parquet_output, seed=1, epoch=1, reshuffle=False)
    batches = list(
        DataLoader(ds.torch(batch_size=50, as_numpy=False), batch_size=None, num_workers=2)
    )
    assert all(isinstance(b, pa.RecordBatch) for b in batches)
    received = pa.Table.from_batches(batches).sort_by("index")  # workers' batches interleave
    assert received.equals(pa.Table.from_batches(list(ds.batches(50))).sort_by("index"))
    sliced = next(iter(ds.batches(50)))  # a zero-copy slice of a whole loaded pile
    assert len(pickle.dumps(ArrowOnArrival(sliced))) < 2 * sliced.nbytes + 10_000


@pytest.mark.parametrize(
    "persistent_workers,context", [(False, None), (True, None), (True, "spawn")]
)
def test_set_epoch_reaches_the_workers(output, persistent_workers, context):
    """Persistent workers keep their own copy of the dataset between epochs: set_epoch in
    the main process must reach them all the same (also when workers are spawned, as on macOS)."""
    tds = ShuffledDataset(output, seed=3).torch()
    loader = DataLoader(
        tds,
        batch_size=16,
        num_workers=2,
        persistent_workers=persistent_workers,
        multiprocessing_context=context,
    )
    for e in (1, 2):
        tds.set_epoch(e)
        assert flat(loader) == epoch(output, num_workers=2, epoch=e)


def test_a_collate_fn_of_ones_own_gets_the_numpy_columns(parquet_output):
    def collate(batch):  # runs in the worker
        return {name: column[:3] for name, column in batch.items()}

    ds = ShuffledDataset(parquet_output, seed=1, epoch=1, columns=["index", "name"])
    batches = list(
        DataLoader(ds.torch(batch_size=50), batch_size=None, num_workers=2, collate_fn=collate)
    )
    assert isinstance(batches[0]["index"], np.ndarray) and len(batches[0]["index"]) == 3
