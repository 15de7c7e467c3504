"""The torch adapter takes every Parquet column type: dictionary columns (pandas categoricals) as
their values, timestamp, date and duration columns as integers of their unit, the same with and
without DataLoader workers; a null in a number column is refused naming it, in every batch alike."""

import datetime

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from helpers import run_shuffle

from pileshuffle.loader import ShuffledDataset

ROWS = 600


def columns_table(first, count, nulls_in_int=False):
    index = np.arange(first, first + count)
    start = datetime.datetime(2024, 1, 1, tzinfo=datetime.timezone.utc)
    return pa.table(
        {
            "i": pa.array(index, pa.int64()),
            "kind": pa.array([("cat", "dog", "bird")[i % 3] for i in index]).dictionary_encode(),
            "at": pa.array(
                [start + datetime.timedelta(seconds=int(i)) for i in index],
                pa.timestamp("ms", tz="UTC"),
            ),
            "day": pa.array(
                [datetime.date(2024, 1, 1) + datetime.timedelta(days=int(i)) for i in index],
                pa.date32(),
            ),
            "took": pa.array(
                [datetime.timedelta(microseconds=int(i)) for i in index], pa.duration("us")
            ),
            # strings keep their nulls
            "note": pa.array([None if i % 7 == 0 else f"n{i}" for i in index], pa.string()),
            "n": pa.array(
                [None if nulls_in_int and i == first + count - 1 else int(i) for i in index],
                pa.int32(),
            ),
        }
    )


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    made = {}
    for nulls in (False, True):
        root = tmp_path_factory.mktemp(f"columns-{nulls}")
        (root / "in").mkdir()
        for part in range(2):
            pq.write_table(
                columns_table(part * ROWS // 2, ROWS // 2, nulls and part == 1),
                root / "in" / f"p{part}.parquet",
            )
        run_shuffle(
            str(root / "in" / "*.parquet"),
            str(root / "out" / "t"),
            "--format=parquet",
            "--num_piles=3",
            "--seed=1",
        )
        made[nulls] = str(root / "out" / "t")
    return made


def epoch_of(prefix, num_workers, as_numpy=True):
    ds = ShuffledDataset(prefix, seed=2).torch(batch_size=64, as_numpy=as_numpy)
    return list(torch.utils.data.DataLoader(ds, batch_size=None, num_workers=num_workers))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_every_column_type_becomes_a_tensor_or_strings_the_same_with_and_without_workers(
    outputs, num_workers
):
    batches = epoch_of(outputs[False], num_workers)
    for batch in batches:
        for name in ("i", "at", "took", "n"):
            assert isinstance(batch[name], torch.Tensor) and batch[name].dtype in (
                torch.int64,
                torch.int32,
            ), name
        assert batch["day"].dtype == torch.int32
        assert isinstance(batch["kind"], np.ndarray) and set(batch["kind"]) <= {
            "cat",
            "dog",
            "bird",
        }
    i = torch.cat([b["i"] for b in batches])
    assert sorted(i.tolist()) == list(range(ROWS))
    at = torch.cat([b["at"] for b in batches])
    assert (at - 1_704_067_200_000 == i * 1000).all()  # milliseconds since the epoch, UTC
    assert (torch.cat([b["day"] for b in batches]) - 19_723 == i).all()  # days since 1970-01-01
    assert (torch.cat([b["took"] for b in batches]) == i).all()  # microseconds
    kinds = np.concatenate([b["kind"] for b in batches])
    assert [("cat", "dog", "bird")[k % 3] for k in i.tolist()] == kinds.tolist()
    notes = np.concatenate([b["note"] for b in batches])
    assert [None if k % 7 == 0 else f"n{k}" for k in i.tolist()] == notes.tolist()


def test_arrow_batches_cross_from_workers_with_their_dictionaries_decoded(outputs):
    alone, workers = (
        epoch_of(outputs[False], 0, as_numpy=False),
        epoch_of(outputs[False], 2, as_numpy=False),
    )
    assert {b.schema.field("kind").type for b in alone + workers} == {pa.string()}
    assert sorted(v for b in alone for v in b.column("i").to_pylist()) == list(range(ROWS))
    assert sorted(v for b in workers for v in b.column("i").to_pylist()) == list(range(ROWS))


def test_a_null_in_a_number_column_is_refused_naming_it(outputs):
    """In-process; a worker makes its batches with the same torch_ready (the test above), and a
    worker's error takes the DataLoader 10 s to report."""
    with pytest.raises(ValueError, match="column 'n' has null values"):
        epoch_of(outputs[True], 0)
    # leaving it out works
    ds = ShuffledDataset(outputs[True], seed=2, columns=["i", "note"]).torch(batch_size=64)
    assert sum(len(b["i"]) for b in torch.utils.data.DataLoader(ds, batch_size=None)) == ROWS
