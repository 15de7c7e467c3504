"""ds.grain(): the loader as a Grain IterDataset, with Grain's real iterators, state API,
transformations and mp_prefetch worker processes, on real outputs."""

import collections
import itertools
import json
import subprocess
import sys

import grain
import pytest
from helpers import run_shuffle  # noqa: E402

from pileshuffle.commands import sample
from pileshuffle.loader import Mixture, ShuffledDataset

RECORDS = 3001  # divisible by no host count below


@pytest.fixture(scope="module")
def output(tmp_path_factory):
    root = tmp_path_factory.mktemp("grain")
    sample.write_tfrecord(str(root / "in"), records=RECORDS, files=3, record_bytes=40, seed=1)
    run_shuffle(str(root / "in" / "*.tfrecord"), str(root / "out"), "--num_piles=7")
    return str(root / "out")


def dataset(output, **options):
    return ShuffledDataset(output, seed=5, **options)


def test_one_process_reads_the_records_and_order_of_iter(output, tmp_path):
    assert list(dataset(output).grain()) == list(dataset(output))
    assert list(dataset(output, epoch=3, mix=2).grain()) == list(dataset(output, epoch=3, mix=2))
    sample.write_parquet(str(tmp_path / "in"), records=500, files=2, record_bytes=60)
    run_shuffle(str(tmp_path / "in" / "*.parquet"), str(tmp_path / "p"), "--num_piles=3")
    rows = list(ShuffledDataset(str(tmp_path / "p"), seed=2).grain())
    assert rows == list(ShuffledDataset(str(tmp_path / "p"), seed=2)) and isinstance(rows[0], dict)


def test_hosts_by_shard_options_are_disjoint_and_complete(output):
    whole = list(dataset(output))
    parts = [
        list(dataset(output).grain(shard_options=grain.sharding.ShardOptions(i, 3)))
        for i in range(3)
    ]
    assert [r for part in parts for r in part] == whole[: RECORDS // 3 * 3]
    assert parts[1] == list(dataset(output, rank=1, world_size=3).grain())
    with pytest.raises(ValueError, match="give one of them"):
        dataset(output, rank=0, world_size=2).grain(shard_options=grain.sharding.ShardOptions(1, 3))


def test_grains_transformations_compose_after_it(output):
    whole = list(dataset(output))
    lengths = [int(x) for batch in dataset(output).grain().map(len).batch(64) for x in batch]
    assert lengths == [len(r) for r in whole]
    assert list(dataset(output).grain().filter(lambda r: r.endswith(b"a"))) == [
        r for r in whole if r.endswith(b"a")
    ]


def test_a_state_resumes_exactly_in_a_fresh_process(output):
    it = iter(dataset(output).grain())
    [next(it) for _ in range(1234)]
    state = json.loads(json.dumps(it.get_state()))
    rest = list(it)
    script = (
        "import json, sys\nfrom pileshuffle.loader import ShuffledDataset\n"
        f"it = iter(ShuffledDataset({output!r}, seed=5).grain())\n"
        "it.set_state(json.loads(sys.stdin.read()))\n"
        "sys.stdout.write(json.dumps([r.hex() for r in it]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        input=json.dumps(state),
        capture_output=True,
        text=True,
        check=True,
    )
    assert [bytes.fromhex(h) for h in json.loads(done.stdout)] == rest


def lockstep(iterators, n):
    """``n`` records from every host, as synchronous training takes them."""
    return [next(it) for it in iterators for _ in range(n)]


def test_an_elastic_restore_from_two_hosts_to_three_and_back_to_two_loses_and_repeats_nothing(
    output,
):
    whole = collections.Counter(dataset(output))
    two = [iter(dataset(output, rank=r, world_size=2).grain()) for r in range(2)]
    taken = lockstep(two, 400)
    saved = [json.loads(json.dumps(it.get_state())) for it in two]
    three = [iter(dataset(output, rank=r, world_size=3).grain()) for r in range(3)]
    for r, it in enumerate(three):
        # each new host restores any old host's state (synchronous: all alike)
        it.set_state(saved[min(r, 1)])
    taken += lockstep(three, 250)
    saved = [json.loads(json.dumps(it.get_state())) for it in three]
    assert saved[0]["pool"] is not None  # a dealt split: restorable elastically again
    back = [iter(dataset(output, rank=r, world_size=2).grain()) for r in range(2)]
    for r, it in enumerate(back):
        it.set_state(saved[r])
    taken += [r for it in back for r in it]
    delivered = collections.Counter(taken)
    assert max(delivered.values()) == 1 and set(delivered) <= set(whole)
    # at most what each split's remainder="drop" leaves out
    assert len(whole) - len(delivered) <= 1 + 2 + 1


def test_hosts_restored_elastically_after_their_whole_share_read_nothing_more_of_the_epoch(output):
    """A seam the training life found: every old host had read its share, so nothing is left
    to deal out. The new host's part was empty, and falsy, so it read the whole epoch again."""
    three = [iter(dataset(output, rank=r, world_size=3).grain(num_epochs=None)) for r in range(3)]
    shares = [
        list(itertools.islice(it, len(dataset(output, rank=r, world_size=3))))
        for r, it in enumerate(three)
    ]
    saved = [json.loads(json.dumps(it.get_state())) for it in three]
    assert (
        saved[0]["pileshuffle"]["position"] == len(shares[0])
        and saved[0]["pileshuffle"]["epoch"] == 0
    )
    one = iter(dataset(output).grain())
    one.set_state(saved[0])
    assert list(one) == []
    endless = iter(dataset(output).grain(num_epochs=None))
    endless.set_state(saved[0])
    # then the next epoch
    assert list(itertools.islice(endless, 5)) == list(dataset(output, epoch=1))[:5]


def test_an_elastic_restore_deals_equal_parts_so_the_next_one_repeats_nothing(output):
    """A seam the mixture's training life found (2 -> 3 -> 1 hosts): the rest of two hosts'
    shares (2 x 1,100) was dealt to three hosts as 733, 733 and 734 records; each read its whole
    part, and the one host restoring took host 0's state (733 in) as every host's, so host 2's
    last record was read again. Hosts in lockstep get equal parts (one record left out)."""
    two = [iter(dataset(output, rank=r, world_size=2).grain()) for r in range(2)]
    taken = lockstep(two, 400)
    saved = [json.loads(json.dumps(it.get_state())) for it in two]
    three = [iter(dataset(output, rank=r, world_size=3).grain()) for r in range(3)]
    for r, it in enumerate(three):
        it.set_state(saved[min(r, 1)])
    parts = [list(it) for it in three]
    assert [len(part) for part in parts] == [733] * 3
    taken += [r for part in parts for r in part]
    saved = [json.loads(json.dumps(it.get_state())) for it in three]
    one = iter(dataset(output).grain())
    one.set_state(saved[0])
    taken += list(one)
    delivered = collections.Counter(taken)
    assert max(delivered.values()) == 1 and RECORDS - len(delivered) == 1 + 1


def test_mp_prefetch_workers_read_every_record_once_and_resume(output):
    options = grain.MultiprocessingOptions(num_workers=2)
    whole = collections.Counter(dataset(output))
    it = iter(dataset(output).grain().mp_prefetch(options))
    head = [next(it) for _ in range(700)]
    state = json.loads(json.dumps(it.get_state()))
    rest = list(it)
    assert collections.Counter(head + rest) == whole
    again = iter(dataset(output).grain().mp_prefetch(options))
    again.set_state(state)
    assert list(again) == rest


def test_each_new_iterator_reads_the_next_epoch_and_set_epoch_wins(output):
    gds = dataset(output).grain()
    first, second = list(gds), list(gds)
    assert first == list(dataset(output)) and second == list(dataset(output, epoch=1))
    gds.set_epoch(7)
    assert list(gds) == list(dataset(output, epoch=7))
    endless = iter(dataset(output).grain(num_epochs=None))
    records = [next(endless) for _ in range(2 * RECORDS + 10)]
    assert records[RECORDS : 2 * RECORDS] == second
    state = endless.get_state()
    assert state["pileshuffle"]["epoch"] == 2 and state["pileshuffle"]["position"] == 10


def test_a_mixture_reads_through_grain(output, tmp_path):
    sample.write_tfrecord(str(tmp_path / "in"), records=500, files=1, record_bytes=40, seed=2)
    run_shuffle(str(tmp_path / "in" / "*.tfrecord"), str(tmp_path / "b"), "--num_piles=2")
    mixture = Mixture([output, str(tmp_path / "b")], [0.8, 0.2], seed=1)
    assert list(mixture.grain()) == list(Mixture([output, str(tmp_path / "b")], [0.8, 0.2], seed=1))


def test_a_state_of_another_worker_count_is_refused(output):
    options = grain.MultiprocessingOptions(num_workers=2)
    it = iter(dataset(output).grain().mp_prefetch(options))
    [next(it) for _ in range(10)]
    worker_state = it.get_state()
    inner = json.loads(json.dumps(worker_state))
    one = iter(dataset(output).grain())
    with pytest.raises(ValueError, match="keep the number of workers"):
        one.set_state(_a_worker_state(inner))


def _a_worker_state(state):
    """The first of our states inside Grain's mp_prefetch state."""
    if isinstance(state, dict):
        if "pileshuffle" in state:
            return state
        for value in state.values():
            found = _a_worker_state(value)
            if found is not None:
                return found
    if isinstance(state, list):
        for value in state:
            found = _a_worker_state(value)
            if found is not None:
                return found
    return None


def test_the_jax_example_in_docs_runs_as_written(tmp_path):
    """docs/loader.md's JAX example, on `pileshuffle generate` records shuffled into out/train."""
    import os
    import re

    docs = open(
        os.path.join(
            os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "loader.md"
        )
    ).read()
    section = docs[docs.index("## JAX: `ds.grain()`") :]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    sample.write_tfrecord(str(tmp_path / "in"), records=5000, files=2, record_bytes=40)
    run_shuffle(
        str(tmp_path / "in" / "*.tfrecord"), str(tmp_path / "out" / "train"), "--num_piles=4"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "3072 records, each once" in done.stdout


def test_grains_own_checkpoint_handler_saves_and_restores_it(output, tmp_path):
    """grain.checkpoint.CheckpointHandler (what Orbax's Grain handler is) writes the iterator's
    state as process_0-of-1.json and restores it into a new iterator: the rest follows exactly."""
    from etils import epath

    handler = grain.checkpoint.CheckpointHandler()
    it = iter(dataset(output).grain().map(len).batch(10))
    [next(it) for _ in range(17)]
    handler.save(epath.Path(tmp_path), item=it)
    rest = [x.tolist() for x in it]
    saved = json.loads((tmp_path / "process_0-of-1.json").read_text())
    assert saved["pileshuffle"]["position"] == 170
    again = handler.restore(
        epath.Path(tmp_path), item=iter(dataset(output).grain().map(len).batch(10))
    )
    assert [x.tolist() for x in again] == rest
