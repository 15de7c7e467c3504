"""Mixture: several outputs interleaved by weight, on real outputs (a shard output and a pile
store), checked against plain models: the interleave's counts, each source's own epochs read
alone, and the record multisets of splits and resumes."""

import collections
import importlib.util
import json
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from helpers import run_shuffle
from hypothesis import given, settings
from hypothesis import strategies as st

from pileshuffle.commands import sample
from pileshuffle.loader import Mixture, ShuffledDataset
from pileshuffle.loader.interleave import MAX_PERIOD, Interleave, whole_weights

pytestmark = [pytest.mark.filterwarnings("ignore:This DataLoader will create")]

A_RECORDS, B_RECORDS = 3000, 1000


# -- the interleave ---------------------------------------------------------------------------------


@settings(max_examples=100, deadline=None)
@given(
    weights=st.lists(st.integers(1, 40), min_size=2, max_size=12), seed=st.integers(0, 2**64 - 1)
)
def test_every_prefix_within_one_record_and_every_window_within_two(weights, seed):
    """Less than 1 record off its share in every prefix (the Pfair windows), less than 2 in every window."""
    mix = Interleave(weights, seed)
    period = mix.period
    stream = mix.sources(0, 3 * period)
    shares = np.array(mix.weights) / period
    for source, share in enumerate(shares):
        counts = np.concatenate([[0], np.cumsum(stream == source)])
        assert np.abs(counts - share * np.arange(len(counts))).max() < 1
        bound = 1 if len(weights) == 2 else 2
        for length in range(1, min(len(stream), 200)):
            assert np.abs(counts[length:] - counts[:-length] - share * length).max() < bound
        # a period holds each source's whole number exactly
        assert counts[period] == mix.weights[source]


@settings(max_examples=40, deadline=None)
@given(
    weights=st.lists(st.integers(1, 9), min_size=1, max_size=5),
    seed=st.integers(0, 1000),
    start=st.integers(0, 500),
    length=st.integers(0, 200),
)
def test_counts_and_positions_agree_with_the_stream(weights, seed, start, length):
    mix = Interleave(weights, seed)
    stream = mix.sources(0, start + length)
    assert (mix.sources(start, start + length) == stream[start:]).all()
    for source in range(len(weights)):
        assert mix.count(source, start + length) == int((stream == source).sum())
        mine = np.flatnonzero(stream == source)
        for k, position in enumerate(mine[:20]):
            assert mix.position_of(source, k) == position


def test_weights_become_exact_whole_numbers_or_round_to_a_65536th():
    assert whole_weights([0.7, 0.2, 0.1]) == [7, 2, 1]
    assert whole_weights([3, 1]) == [3, 1]
    assert whole_weights([1 / 3, 2 / 3]) == [1, 2]
    rounded = whole_weights([1e-9, 1])
    assert sum(rounded) == MAX_PERIOD and rounded[0] == 1  # every source keeps a place
    # the seed breaks ties
    assert {tuple(Interleave([1, 1], seed).pattern) for seed in range(8)} == {
        (0, 1),
        (1, 0),
    }


@pytest.mark.parametrize(
    "weights, words",
    [
        ([1], "one weight per dataset"),
        ([1, -1], "positive"),
        ([1, float("nan")], "positive"),
        ([1, True], "positive"),
    ],
)
def test_bad_weights_are_refused(outputs, weights, words):
    with pytest.raises(ValueError, match=words):
        Mixture([outputs["a"], outputs["b"]], weights)


# -- real outputs ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    """Output ``a`` (3,000 records, shards), ``b`` (1,000 records, a pile store), and their records."""
    root = tmp_path_factory.mktemp("mixture")
    sample.write_tfrecord(str(root / "ina"), records=A_RECORDS, files=3, record_bytes=40, seed=1)
    sample.write_tfrecord(str(root / "inb"), records=B_RECORDS, files=2, record_bytes=40, seed=2)
    run_shuffle(str(root / "ina" / "*.tfrecord"), str(root / "a"), "--num_piles=7")
    run_shuffle(
        str(root / "inb" / "*.tfrecord"), str(root / "b"), "--num_piles=3", "--layout=store"
    )
    found = {"a": str(root / "a"), "b": str(root / "b")}
    found["records"] = [set(ShuffledDataset(found[name])) for name in ("a", "b")]
    assert not found["records"][0] & found["records"][1]
    return found


def mixture(outputs, weights=(0.5, 0.5), **options):
    return Mixture([outputs["a"], outputs["b"]], list(weights), seed=3, **options)


def sources_of(outputs, records):
    return [0 if r in outputs["records"][0] else 1 for r in records]


def test_stop_first_ends_where_the_first_dataset_runs_out_each_record_once(outputs):
    mix = mixture(outputs, (0.6, 0.4))
    records = list(mix)
    got = sources_of(outputs, records)
    assert len(records) == len(set(records)) == mix.records_per_epoch
    # every position reads the source the pattern names
    assert got == mix.sources_at(0, len(records)).tolist()
    counts = collections.Counter(got)
    assert counts[1] == B_RECORDS  # b (40 %) runs out first: all of it read ...
    # ... and a's share
    assert counts[0] == len(records) - B_RECORDS and abs(counts[0] - 0.6 * len(records)) <= 1
    assert set(records) >= outputs["records"][1]


def test_every_window_of_the_stream_holds_the_weights_shares_within_two_records(outputs):
    mix = mixture(outputs, (0.7, 0.3), stop="restart", records_per_epoch=4000)
    got = np.array(sources_of(outputs, list(mix)))
    cumulative = np.concatenate([[0], np.cumsum(got == 1)])
    for window in (10, 100, 256, 1000):
        held = cumulative[window:] - cumulative[:-window]
        assert np.abs(held - 0.3 * window).max() < 1  # two datasets: within one record


def test_each_dataset_is_read_in_its_own_epoch_order(outputs):
    """The mixed stream restricted to one dataset is that dataset's own epochs back to back."""
    a = ShuffledDataset(outputs["a"], seed=11)
    b = ShuffledDataset(outputs["b"], seed=12)
    mix = Mixture([a, b], [1, 3], stop="restart", records_per_epoch=5000)
    stream = list(mix) + list(mix)  # two mixture epochs
    own_b = [r for r in stream if r in outputs["records"][1]]
    b_epochs = [list(ShuffledDataset(outputs["b"], seed=12, epoch=e)) for e in range(8)]
    assert own_b == [r for epoch in b_epochs for r in epoch][: len(own_b)]
    # restarted, reshuffled: 7.5 epochs of b
    assert len(own_b) == 7500 and b_epochs[0] != b_epochs[1]
    own_a = [r for r in stream if r in outputs["records"][0]]
    a_epochs = list(ShuffledDataset(outputs["a"], seed=11)) + list(
        ShuffledDataset(outputs["a"], seed=11, epoch=1)
    )
    assert own_a == a_epochs[: len(own_a)]


def test_the_sources_piles_load_one_at_a_time_on_one_thread_each_source_in_its_own_order(
    outputs, monkeypatch
):
    """A mixture's sources share one prefetch thread (``Mixture._step_loads``): never two loads
    at once (their buffers together passed twice one output's memory), and each source loads
    the piles it would load alone for the records it gives, in its own order."""
    from pileshuffle.loader.piles import PileRef

    seen, loading, most, load = [], [0], [0], PileRef.load

    def watched(self, *args, **kwargs):
        loading[0] += 1
        most[0] = max(most[0], loading[0])
        time.sleep(0.003)  # room for a second load to overlap, were there one
        try:
            return load(self, *args, **kwargs)
        finally:
            loading[0] -= 1
            seen.append((self.files[0], self.index, threading.current_thread().name))

    monkeypatch.setattr(PileRef, "load", watched)
    a, b = ShuffledDataset(outputs["a"], seed=11), ShuffledDataset(outputs["b"], seed=12)
    # 3 chunks; 4 epochs of a, 8 of b
    mix = Mixture([a, b], [3, 2], stop="restart", records_per_epoch=20000)
    assert len(list(mix)) == 20000
    assert most[0] == 1 and {thread for *_, thread in seen} == {"pileshuffle-prefetch"}
    for name, epochs, seed in (("a", 4, 11), ("b", 8, 12)):
        alone = [
            p
            for e in range(epochs)
            for p in ShuffledDataset(outputs[name], seed=seed, epoch=e).piles_to_load()
        ]
        assert [index for path, index, _ in seen if path.startswith(outputs[name])] == alone, name


def test_a_long_epoch_is_planned_as_it_is_read(outputs, monkeypatch):
    """An epoch of 10 million positions holds thousands of epochs of each small source: the
    first batch must not wait for all of them to be planned (it took 0.8 s when it did)."""
    planned, plan = [], ShuffledDataset._step_loads

    def counting(self, ranges):
        planned.append(self.epoch)
        return plan(self, ranges)

    monkeypatch.setattr(ShuffledDataset, "_step_loads", counting)
    batches = mixture(outputs, stop="restart", records_per_epoch=10_000_000).batches(256)
    next(batches)
    # the first chunk (8,192 positions) reads 4,096 records of each: 2 epochs of a, 5 of b; the
    # prefetch thread is at most 2 loads past it, one more epoch of each at most
    assert len(planned) <= 2 + 5 + 2, len(planned)
    batches.close()


def test_epochs_differ_and_the_same_seed_gives_the_same_stream(outputs):
    mix = mixture(outputs)
    first, second = list(mix), list(mix)
    assert first != second  # stop="first": epoch e reads every dataset's own epoch e
    # all of b, each time
    assert set(first) & outputs["records"][1] == set(second) & outputs["records"][1]
    assert list(mixture(outputs)) == first
    assert list(mixture(outputs, epoch=1)) == second


def test_ranks_are_disjoint_and_complete_and_batches_are_the_records(outputs):
    whole = list(mixture(outputs))
    parts = [list(mixture(outputs, rank=r, world_size=3)) for r in range(3)]
    assert [r for part in parts for r in part] == whole[: len(whole) // 3 * 3]
    batches = [r for batch in mixture(outputs).batches(256) for r in batch]
    assert batches == whole
    numpy = [r for batch in mixture(outputs).batches(100, as_numpy=True) for r in batch["record"]]
    assert numpy == whole


def test_a_state_resumes_exactly_in_a_fresh_process(outputs, tmp_path):
    mix = mixture(outputs, (0.7, 0.3), stop="restart", records_per_epoch=2500)
    list(mix)  # epoch 0
    it = iter(mix)
    head = [next(it) for _ in range(777)]
    state = mix.state_dict()
    rest = list(it)
    script = (
        f"import json, sys; from pileshuffle.loader import Mixture\n"
        f"m = Mixture([{outputs['a']!r}, {outputs['b']!r}], [0.7, 0.3], seed=3, stop='restart', "
        f"records_per_epoch=2500)\n"
        f"m.load_state_dict(json.loads(sys.stdin.read()))\n"
        f"sys.stdout.write(json.dumps([r.hex() for r in m]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        input=json.dumps(state),
        capture_output=True,
        text=True,
        check=True,
    )
    assert [bytes.fromhex(h) for h in json.loads(done.stdout)] == rest
    assert len(head) + len(rest) == 2500 and state["epoch"] == 1


def test_an_elastic_resume_from_two_ranks_to_three_loses_and_repeats_nothing(outputs):
    options = dict(weights=(0.7, 0.3), stop="restart", records_per_epoch=4001)
    whole = collections.Counter(mixture(outputs, **options))
    two = [mixture(outputs, rank=r, world_size=2, **options) for r in range(2)]
    iterators = [iter(m) for m in two]
    taken = [next(iterators[0]) for _ in range(400)] + [next(iterators[1]) for _ in range(1111)]
    states = json.loads(json.dumps([m.state_dict() for m in two]))
    three = [mixture(outputs, rank=r, world_size=3, **options) for r in range(3)]
    for m in three:
        m.load_state_dict(states)
    rest = [r for m in three for r in m]
    delivered = collections.Counter(taken + rest)
    assert delivered <= whole  # b's records come twice in this epoch: a multiset, not a set
    # what the two splits' remainder="drop" leaves out
    assert sum((whole - delivered).values()) <= 1 + 2
    assert max(whole.values()) == 2  # b (1,000 records) is read 1,200 times: restarted once


def test_the_next_epoch_after_a_resume_is_the_uninterrupted_next_epoch(outputs):
    mix = mixture(outputs)
    it = iter(mix)
    [next(it) for _ in range(10)]
    state = mix.state_dict()
    resumed = mixture(outputs)
    resumed.load_state_dict(state)
    list(resumed)
    assert list(resumed) == list(mixture(outputs, epoch=1))


def test_torch_workers_and_a_stateful_dataloader_resume(outputs):
    from torch.utils.data import DataLoader
    from torchdata.stateful_dataloader import StatefulDataLoader

    whole = list(mixture(outputs))
    through_workers = [
        r
        for batch in DataLoader(
            mixture(outputs).torch(batch_size=64), batch_size=None, num_workers=2
        )
        for r in batch
    ]
    assert collections.Counter(through_workers) == collections.Counter(whole)

    def loader():
        return StatefulDataLoader(
            mixture(outputs).torch(batch_size=50), batch_size=None, num_workers=2
        )

    first = loader()
    it = iter(first)
    head = [r for _ in range(7) for r in next(it)]
    saved = first.state_dict()
    rest = [r for batch in it for r in batch]
    again = loader()
    again.load_state_dict(saved)
    assert [r for batch in again for r in batch] == rest
    assert collections.Counter(head + rest) == collections.Counter(whole)


def test_tf_data_reads_the_same_records(outputs):
    whole = list(mixture(outputs))
    assert [r for r in mixture(outputs).tf().as_numpy_iterator()] == whole
    batches = [
        r for b in mixture(outputs).tf(batch_size=32).as_numpy_iterator() for r in b.tolist()
    ]
    assert batches == whole


def test_parquet_and_jsonl_mix_too_and_their_columns_must_agree(tmp_path):
    for fmt in ("jsonl", "parquet"):
        for name, seed in (("x", 1), ("y", 2)):
            sample.WRITERS[fmt](
                str(tmp_path / f"{fmt}-{name}"), records=400, files=2, record_bytes=60, seed=seed
            )
            run_shuffle(
                str(tmp_path / f"{fmt}-{name}" / f"*.{fmt}"),
                str(tmp_path / f"{fmt}{name}"),
                "--num_piles=3",
            )
    lines = list(Mixture([str(tmp_path / "jsonlx"), str(tmp_path / "jsonly")], [1, 1]))
    assert len(lines) == len(set(lines)) == 800
    rows = list(
        Mixture(
            [str(tmp_path / "parquetx"), str(tmp_path / "parquety")],
            [1, 3],
            stop="restart",
            records_per_epoch=1000,
        )
    )
    assert len(rows) == 1000 and isinstance(rows[0], dict)
    batch = next(
        Mixture([str(tmp_path / "parquetx"), str(tmp_path / "parquety")], [1, 1]).batches(64)
    )
    assert batch.num_rows == 64
    narrow = ShuffledDataset(str(tmp_path / "parquety"), columns=["index"])
    with pytest.raises(ValueError, match="same columns"):
        Mixture([str(tmp_path / "parquetx"), narrow], [1, 1])
    with pytest.raises(ValueError, match="one format"):
        Mixture([str(tmp_path / "parquetx"), str(tmp_path / "jsonlx")], [1, 1])


def test_a_parquet_mixture_reads_each_output_in_its_own_order_where_the_pattern_says(tmp_path):
    """Parquet rows are gathered from many pile tables at once (``piles._gather``): every position
    holds the next row of the source the pattern names, in that source's own epoch order."""
    for name, seed in (("x", 1), ("y", 2)):
        sample.WRITERS["parquet"](
            str(tmp_path / f"in-{name}"), records=400, files=2, record_bytes=60, seed=seed
        )
        run_shuffle(
            str(tmp_path / f"in-{name}" / "*.parquet"), str(tmp_path / name), "--num_piles=3"
        )

    def own(name, seed, epochs):
        return [
            tuple(r.values())
            for e in range(epochs)
            for r in ShuffledDataset(str(tmp_path / name), seed=seed, epoch=e)
        ]

    x, y = own("x", 11, 2), own("y", 12, 3)
    assert not set(x) & set(y)

    def mixture():
        return Mixture(
            [
                ShuffledDataset(str(tmp_path / "x"), seed=11),
                ShuffledDataset(str(tmp_path / "y"), seed=12),
            ],
            [1, 3],
            stop="restart",
            records_per_epoch=1000,
        )

    mix = mixture()
    rows = [tuple(r.values()) for r in mix]
    got = [0 if r in set(x) else 1 for r in rows]
    assert got == mix.sources_at(0, 1000).tolist()
    assert [r for r, s in zip(rows, got) if s == 0] == x[: got.count(0)]
    assert [r for r, s in zip(rows, got) if s == 1] == y[: got.count(1)]
    assert [tuple(r.values()) for b in mixture().batches(64) for r in b.to_pylist()] == rows


def test_states_of_another_mixture_or_of_a_dataset_are_refused(outputs):
    mix = mixture(outputs)
    state = mix.state_dict()
    with pytest.raises(ValueError, match="weights"):
        mixture(outputs, (0.7, 0.3)).load_state_dict(state)
    with pytest.raises(ValueError, match="a Mixture state, not a ShuffledDataset's"):
        ShuffledDataset(outputs["a"]).load_state_dict(state)
    with pytest.raises(ValueError, match="a ShuffledDataset state, not a Mixture's"):
        mix.load_state_dict(ShuffledDataset(outputs["a"]).state_dict())
    swapped = Mixture([outputs["b"], outputs["a"]], [0.5, 0.5], seed=3)
    with pytest.raises(ValueError, match="dataset 0"):
        swapped.load_state_dict(state)


def test_a_split_dataset_is_refused_as_a_source(outputs):
    with pytest.raises(ValueError, match="unsplit"):
        Mixture([ShuffledDataset(outputs["a"], rank=1, world_size=2), outputs["b"]], [1, 1])
    with pytest.raises(ValueError, match="stop must be"):
        mixture(outputs, stop="longest")


def test_a_mixture_of_gcs_outputs_reads_as_the_local_one(gcs, tmp_path):
    """The same runs written locally and to gs:// (the emulator) mix into the same stream."""
    prefixes = {"local": [], "remote": []}
    for name, seed, records, layout in (
        ("a", 1, A_RECORDS, "shards"),
        ("b", 2, B_RECORDS, "store"),
    ):
        sample.write_tfrecord(
            str(tmp_path / name), records=records, files=2, record_bytes=40, seed=seed
        )
        for where, root in (("local", str(tmp_path / "out")), ("remote", gcs)):
            run_shuffle(
                str(tmp_path / name / "*.tfrecord"),
                f"{root}/{name}",
                "--num_piles=3",
                f"--layout={layout}",
            )
            prefixes[where].append(f"{root}/{name}")
    remote, local = (
        Mixture(prefixes[where], [0.7, 0.3], seed=3, stop="restart", records_per_epoch=2000)
        for where in ("remote", "local")
    )
    assert list(remote) == list(local)
    assert list(remote) == list(local)  # and the next epoch
    if importlib.util.find_spec("grain"):  # the Grain adapter reads gs:// as locally
        assert list(remote.grain()) == list(local.grain())
    from pileshuffle.commands.quality import main as quality_main
    from pileshuffle.io import storage

    mixture_flag = "--mixture=" + ",".join(
        f"{p}={w}" for p, w in zip(prefixes["remote"], (0.7, 0.3))
    )
    assert (
        quality_main(
            [mixture_flag, f"--report={gcs}/report", "--stop=restart", "--records_per_epoch=2000"]
        )
        == 0
    )
    section = storage.read_json(f"{gcs}/report/mixture.json")
    assert (
        section["mixture"]["records_per_epoch"] == 2000
        and section["mixture"]["datasets"][1]["weight"] == 0.3
    )


def test_quality_reports_each_datasets_share_per_window_against_its_weight(
    outputs, tmp_path, capsys
):
    from pileshuffle.commands.quality import main as quality_main

    report = tmp_path / "report"
    assert (
        quality_main(
            [
                f"--mixture={outputs['a']}=0.9,{outputs['b']}=0.1",
                f"--report={report}",
                "--stop=restart",
                "--records_per_epoch=20000",
                "--batch_size=64",
                "--seed=3",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "mixture: epoch 0, 20,000 positions" in out and "mixture.json" in out
    section = json.loads((report / "mixture.json").read_text())["mixture"]
    rare = section["datasets"][1]
    assert rare["weight"] == 0.1 and abs(rare["share"] - 0.1) < 1e-3
    # 6.4 per batch of 64
    assert rare["mixture"]["min_per_batch"] >= 6 and rare["mixture"]["max_per_batch"] <= 7
    # two datasets: within one
    assert rare["mixture"]["max_deviation"] < 1 < rare["coin_flips"]["max_deviation"]
    assert rare["mixture"]["batches_without"] == 0
    assert quality_main([f"--mixture={outputs['a']}=x", f"--report={report}"]) == 2
    assert "is not PREFIX=WEIGHT" in capsys.readouterr().err
