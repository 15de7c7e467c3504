"""The loader's seams (issue 19): a resume state applies to the one pass it resumes, every new
pass reads the next epoch unless ``set_epoch`` or a state says otherwise, a state is refused
on any output but its own, and meaningless arguments are refused where they are given."""

import collections
import json
import os
import re

import pytest
import torch
from helpers import run_shuffle, shuffled_sample
from torch.utils.data import DataLoader
from torchdata.stateful_dataloader import StatefulDataLoader

from pileshuffle.commands import sample
from pileshuffle.errors import InputError
from pileshuffle.loader import ShuffledDataset
from pileshuffle.loader.torch_resume import loader_states

pytestmark = [
    pytest.mark.filterwarnings("ignore:This DataLoader will create"),
    pytest.mark.filterwarnings("ignore:'set_vital' is deprecated"),
]

RECORDS = 15_000
BATCH = 256


@pytest.fixture(scope="module")
def output(tmp_path_factory):
    """The issue's output: 15,000 small TFRecords."""
    return shuffled_sample(
        tmp_path_factory, "tfrecord", "--num_piles=6", records=RECORDS, record_bytes=20
    )


def epoch_of(output, epoch, mix=2):
    return list(ShuffledDataset(output, seed=0, mix=mix, epoch=epoch))


def flat(batches):
    return [record for batch in batches for record in batch]


def loader_pass(loader):
    return flat(loader)


# -- a resume state applies to one pass -----------------------------------------------------------


@pytest.mark.parametrize("persistent", [False, True])
def test_a_plain_dataloader_resume_applies_to_its_own_pass_only(output, persistent):
    """The issue's report: after resuming epoch 1 from ``loader_states``, epochs 2 and 3 each
    delivered the same 13,720 records (the resumed tail) instead of their own 15,000."""
    tds = ShuffledDataset(output, seed=0, mix=2).torch(batch_size=BATCH)
    tds.set_epoch(1)
    tds.load_state_dict(loader_states(tds, 5, num_workers=2, batch_size=BATCH))
    loader = DataLoader(tds, batch_size=None, num_workers=2, persistent_workers=persistent)
    whole_1 = epoch_of(output, 1)
    uninterrupted = loader_pass(
        DataLoader(
            ShuffledDataset(output, seed=0, mix=2, epoch=1).torch(batch_size=BATCH),
            batch_size=None,
            num_workers=2,
        )
    )
    assert loader_pass(loader) == uninterrupted[5 * BATCH :]
    for e in (2, 3):
        tds.set_epoch(e)
        if not persistent:
            loader = DataLoader(tds, batch_size=None, num_workers=2)
        got = loader_pass(loader)
        assert len(got) == RECORDS and sorted(got) == sorted(whole_1)
        assert collections.Counter(got) == collections.Counter(epoch_of(output, e))
    again = loader_pass(loader if persistent else DataLoader(tds, batch_size=None, num_workers=2))
    # no set_epoch: the next one
    assert collections.Counter(again) == collections.Counter(epoch_of(output, 4))


def test_a_stateful_dataloader_resume_applies_to_its_own_pass_only(output):
    def loader(tds):
        return StatefulDataLoader(tds, batch_size=None, num_workers=2)

    first = loader(ShuffledDataset(output, seed=0, mix=2, epoch=1).torch(batch_size=BATCH))
    iterator = iter(first)
    for _ in range(5):
        next(iterator)
    state = json.loads(json.dumps(first.state_dict()))
    del iterator, first
    tds = ShuffledDataset(output, seed=0, mix=2).torch(batch_size=BATCH)
    resumed = loader(tds)
    resumed.load_state_dict(state)
    assert len(loader_pass(resumed)) == RECORDS - 5 * BATCH
    for e in (2, 3):
        tds.set_epoch(e)
        assert collections.Counter(loader_pass(resumed)) == collections.Counter(epoch_of(output, e))


def test_an_in_process_resume_applies_to_its_own_pass_only(output):
    ds = ShuffledDataset(output, seed=0, mix=2, epoch=1)
    it = iter(ds)
    head = [next(it) for _ in range(2000)]
    state = ds.state_dict()
    resumed = ShuffledDataset(output, seed=0, mix=2)
    resumed.load_state_dict(state)
    assert head + list(resumed) == epoch_of(output, 1)
    assert list(resumed) == epoch_of(output, 2)  # the next pass: the next epoch, whole
    resumed.set_epoch(3)
    assert list(resumed) == epoch_of(output, 3)


def test_a_tf_resume_applies_to_its_own_pass_only(output):
    ds = ShuffledDataset(output, seed=0, mix=2)
    ds.load_state_dict(ShuffledDataset(output, seed=0, mix=2, epoch=1).state_after(2000))
    assert [r.numpy() for r in ds.tf()] == epoch_of(output, 1)[2000:]
    assert [r.numpy() for r in ds.tf()] == epoch_of(output, 2)  # a fresh ds.tf(): the next epoch
    ds.set_epoch(2)
    assert [r.numpy() for r in ds.tf()] == epoch_of(output, 2)


def test_set_epoch_of_the_loaded_states_epoch_keeps_the_state(output):
    """The usual loop calls set_epoch(e) at the start of every epoch, the resumed one too."""
    ds = ShuffledDataset(output, seed=0, mix=2)
    ds.load_state_dict(ShuffledDataset(output, seed=0, mix=2, epoch=1).state_after(2000))
    ds.set_epoch(1)
    assert list(ds) == epoch_of(output, 1)[2000:]
    tds = ShuffledDataset(output, seed=0, mix=2).torch(batch_size=BATCH)
    tds.load_state_dict(ShuffledDataset(output, seed=0, mix=2, epoch=1).state_after(2048))
    tds.set_epoch(1)
    assert (
        loader_pass(DataLoader(tds, batch_size=None, num_workers=0)) == epoch_of(output, 1)[2048:]
    )


# -- every new pass reads the next epoch ----------------------------------------------------------


def test_every_new_pass_reads_the_next_epoch_through_every_path(output):
    ds = ShuffledDataset(output, seed=0, mix=2, epoch=1)
    assert list(ds) == epoch_of(output, 1)
    assert list(ds) == epoch_of(output, 2)
    assert flat(ds.batches(500)) == epoch_of(output, 3)
    assert [r.numpy() for r in ds.tf()] == epoch_of(output, 4)  # a fresh ds.tf() per epoch
    assert [r.numpy() for r in ds.tf()] == epoch_of(output, 5)
    ds.set_epoch(1)
    assert list(ds) == epoch_of(output, 1)
    ds.set_epoch(1)  # set again after a pass: that epoch again, from its start
    assert list(ds) == epoch_of(output, 1)


@pytest.mark.parametrize("persistent,context", [(False, None), (True, None), (False, "spawn")])
def test_dataloader_passes_read_successive_epochs_without_set_epoch(output, persistent, context):
    tds = ShuffledDataset(output, seed=0, mix=2, epoch=1).torch(batch_size=BATCH)
    loader = DataLoader(
        tds,
        batch_size=None,
        num_workers=2,
        persistent_workers=persistent,
        multiprocessing_context=context,
    )
    for e in (1, 2, 3):
        assert collections.Counter(loader_pass(loader)) == collections.Counter(epoch_of(output, e))
    in_process = ShuffledDataset(output, seed=0, mix=2, epoch=1).torch(batch_size=BATCH)
    assert flat(in_process) == epoch_of(output, 1)
    assert flat(in_process) == epoch_of(output, 2)


def test_loader_states_follow_the_pass_in_progress(output):
    """Without set_epoch, the second pass is epoch 2: loader_states counts batches of that pass."""
    tds = ShuffledDataset(output, seed=0, mix=2, epoch=1).torch(batch_size=BATCH)
    loader = DataLoader(tds, batch_size=None, num_workers=2)
    loader_pass(loader)  # epoch 1
    whole = list(loader)  # epoch 2
    tds.load_state_dict(loader_states(tds, 7, num_workers=2))
    assert list(DataLoader(tds, batch_size=None, num_workers=2)) == whole[7:]


@pytest.mark.parametrize("workers", [0, 1, 2])
def test_a_state_saved_before_the_next_passes_first_batch_is_of_that_pass(output, workers):
    """A checkpoint at batch 0 of a new pass, saved before its workers have begun (``iter``
    returns before they start) or between passes, is the start of that pass's epoch, not of
    the pass before.
    Found by the training life: the state named the finished epoch 1, and the resumed job
    re-read it as epoch 2 (83 records of epoch 2 never came)."""
    tds = ShuffledDataset(output, seed=0, mix=2).torch(batch_size=BATCH)
    loader = DataLoader(tds, batch_size=None, num_workers=workers)
    loader_pass(loader)  # epoch 0
    loader_pass(loader)  # epoch 1
    # epoch 2 has not begun here, as after `iter(loader)` before its workers have started
    state = json.loads(json.dumps(loader_states(tds, 0, num_workers=workers)))
    resumed = ShuffledDataset(output, seed=0, mix=2).torch(batch_size=BATCH)
    resumed.load_state_dict(state)
    again = loader_pass(DataLoader(resumed, batch_size=None, num_workers=workers))
    fresh = loader_pass(
        DataLoader(
            ShuffledDataset(output, seed=0, mix=2, epoch=2).torch(batch_size=BATCH),
            batch_size=None,
            num_workers=workers,
        )
    )
    assert again == fresh


# -- a state belongs to one output ----------------------------------------------------------------


def test_a_state_from_another_output_is_refused(tmp_path):
    sample.write_tfrecord(str(tmp_path / "in"), records=3000, files=2, record_bytes=30)
    prefix, pattern = str(tmp_path / "out" / "t"), str(tmp_path / "in" / "*.tfrecord")
    run_shuffle(pattern, prefix, "--num_piles=4", "--seed=1")
    ds = ShuffledDataset(prefix, seed=0)
    it = iter(ds)
    head = [next(it) for _ in range(2000)]
    state = ds.state_dict()
    for other in (["--seed=2"], ["--num_piles=5", "--seed=1"]):
        run_shuffle(pattern, prefix, "--overwrite", *other)
        with pytest.raises(ValueError, match="another output"):
            ShuffledDataset(prefix, seed=0).load_state_dict(state)
        with pytest.raises(ValueError, match="another output"):
            ShuffledDataset(prefix, seed=0).torch().load_state_dict([state])
    run_shuffle(pattern, prefix, "--overwrite", "--num_piles=4", "--seed=1")  # the same bytes again
    resumed = ShuffledDataset(prefix, seed=0)
    resumed.load_state_dict(state)
    assert sorted(head + list(resumed)) == sorted(ShuffledDataset(prefix, seed=0))


# -- meaningless arguments ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"seed": -1}, "seed"),
        ({"seed": 2**64}, "seed"),
        ({"seed": 1.5}, "seed"),
        ({"seed": "1"}, "seed"),
        ({"epoch": -1}, "epoch"),
        ({"mix": 0}, "mix"),
        ({"rank": 2, "world_size": 2}, "rank"),
        ({"world_size": 0}, "world_size"),
        ({"remainder": "keep"}, "remainder"),
        ({"columns": []}, "columns"),
        ({"columns": ["x"]}, "columns"),  # TFRecord records have no columns
    ],
)
def test_meaningless_dataset_arguments_are_refused(output, kwargs, match):
    with pytest.raises(ValueError, match=match):
        ShuffledDataset(output, **kwargs)


def test_meaningless_call_arguments_are_refused(output):
    ds = ShuffledDataset(output)
    for worker, num_workers in ((0, 0), (2, 2), (-1, 2)):
        with pytest.raises(ValueError, match="worker"):
            ds.for_worker(worker, num_workers)
    with pytest.raises(ValueError, match="epoch"):
        ds.set_epoch(-1)
    for size in (0, -3, 1.5):
        with pytest.raises(ValueError, match="batch_size"):
            ds.torch(batch_size=size)
        with pytest.raises(ValueError, match="batch_size"):
            ds.tf(batch_size=size)


def test_more_ranks_than_records_say_what_they_would_yield(tmp_path_factory):
    prefix = shuffled_sample(
        tmp_path_factory, "jsonl", "--num_piles=2", records=5, files=1, record_bytes=20
    )
    with pytest.raises(ValueError, match="world_size 8.*5 records.*remainder='pad'"):
        ShuffledDataset(prefix, rank=0, world_size=8)
    padded = [
        list(ShuffledDataset(prefix, rank=r, world_size=8, remainder="pad")) for r in range(8)
    ]
    assert all(len(p) == 1 for p in padded) and len({r for p in padded for r in p}) == 5
    torch.manual_seed(0)  # keeps the DataLoader quiet about unused seeds in this test


def test_a_folder_or_a_shard_given_for_the_output_says_what_to_give(output):
    import os

    with pytest.raises(Exception, match="this is a folder: give the output's prefix"):
        ShuffledDataset(os.path.dirname(output))
    shard = sorted(p for p in os.listdir(os.path.dirname(output)) if "-of-" in p)[0]
    with pytest.raises(Exception, match=r"give the output's prefix \(.*data\), not a shard"):
        ShuffledDataset(os.path.join(os.path.dirname(output), shard))


def test_a_store_state_refused_after_an_append_names_the_version_it_was_saved_on(tmp_path):
    from pileshuffle.cli import main

    sample.write_tfrecord(str(tmp_path / "a"), records=800, files=2, record_bytes=20)
    sample.write_tfrecord(
        str(tmp_path / "b"), records=300, files=1, record_bytes=20, seed=1, name="day2"
    )
    prefix = str(tmp_path / "store" / "t")
    run_shuffle(str(tmp_path / "a" / "*.tfrecord"), prefix, "--layout=store", "--num_piles=3")
    ds = ShuffledDataset(prefix, seed=0)
    it = iter(ds)
    head = [next(it) for _ in range(100)]
    state = ds.state_dict()
    assert (
        main(
            ["append", f"--store={prefix}", f"--input={tmp_path / 'b' / '*.tfrecord'}", *FAST_ARGS]
        )
        == 0
    )
    with pytest.raises(
        ValueError,
        match=r"another output.*still readable: ShuffledDataset\('.*manifest-00000001\.json'\)",
    ):
        ShuffledDataset(prefix, seed=0).load_state_dict(state)
    old = ShuffledDataset(f"{prefix}-store/manifest-00000001.json", seed=0)
    old.load_state_dict(state)
    assert sorted(head + list(old)) == sorted(
        ShuffledDataset(f"{prefix}-store/manifest-00000001.json", seed=0)
    )


FAST_ARGS = ["--direct_running_mode=in_memory", "--direct_num_workers=1"]


def test_a_shard_with_records_added_after_the_run_is_refused(tmp_path_factory):
    import glob

    prefix = shuffled_sample(
        tmp_path_factory, "jsonl", "--num_piles=2", records=50, files=1, record_bytes=20
    )
    shard = sorted(glob.glob(f"{prefix}-*-of-*.jsonl"))[0]
    with open(shard, "ab") as handle:
        handle.write(b'{"extra": 1}\n')
    with pytest.raises(
        Exception, match=r"is [\d,]+ bytes where its manifest lists [\d,]+: changed after"
    ):
        list(ShuffledDataset(prefix, reshuffle=False))


def test_a_jsonl_shard_cut_inside_a_line_is_refused_by_name_alone_and_in_a_mixture(
    tmp_path_factory,
):
    """Cut inside its last line, a JSONL shard still reads as many lines (a last line needs no
    newline): only its size, which the manifest lists, says it changed."""
    import glob

    from pileshuffle.loader import Mixture

    prefix = shuffled_sample(
        tmp_path_factory, "jsonl", "--num_piles=2", records=50, files=1, record_bytes=20
    )
    shard = sorted(glob.glob(f"{prefix}-*-of-*.jsonl"))[1]
    size = os.path.getsize(shard)
    os.truncate(shard, size - 3)
    cut = re.escape(
        f"{shard}: is {size - 3:,} bytes where its manifest lists {size:,}: changed after it was written"
    )
    with pytest.raises(InputError, match=cut):
        list(ShuffledDataset(prefix))
    with pytest.raises(InputError, match=cut):
        list(Mixture([prefix, prefix], [1, 1]))
