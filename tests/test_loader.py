"""The training loader (issue 12, core): outputs of real pipeline runs and hand-built pile
stores read back as epochs; order, splitting, resuming, formats, memory."""

import gzip
import json
import os
import subprocess
import sys

import google_crc32c
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import manifest, read_tfrecord_payloads, run_shuffle, shards, shuffled_sample
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pileshuffle.commands import sample
from pileshuffle.errors import InputError
from pileshuffle.loader import NoOutputError, ShuffledDataset, epoch_order, open_output
from pileshuffle.loader.order import EpochOrder
from pileshuffle.loader.piles import PileRef
from pileshuffle.records import keys as keymath
from pileshuffle.records.fingerprint import Fingerprint, payload_hashes, row_hashes, row_lengths

SETTINGS = settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def _output(factory, fmt, *args, records=3000, piles=7, **write):
    return shuffled_sample(
        factory, fmt, f"--num_piles={piles}", "--seed=5", *args, records=records, **write
    )


@pytest.fixture(scope="module")
def tfrecord_out(tmp_path_factory):
    return _output(tmp_path_factory, "tfrecord", record_bytes=120, vary=True)


@pytest.fixture(scope="module")
def gzip_out(tmp_path_factory):
    return _output(
        tmp_path_factory, "tfrecord", "--compression=gzip", records=1000, piles=4, record_bytes=60
    )


@pytest.fixture(scope="module")
def jsonl_out(tmp_path_factory):
    return _output(tmp_path_factory, "jsonl", record_bytes=80)


@pytest.fixture(scope="module")
def parquet_out(tmp_path_factory):
    return _output(tmp_path_factory, "parquet", record_bytes=80, row_group_rows=500)


def fingerprint(records, schema=None) -> Fingerprint:
    """Of bytes payloads or of Parquet row dicts (of ``schema``), as the manifest computes it."""
    if records and isinstance(records[0], dict):
        table = pa.Table.from_pylist(records, schema=schema)
        return Fingerprint.of(row_hashes(table), int(row_lengths(table).sum()))
    crcs = np.array([google_crc32c.value(r) for r in records], dtype=np.uint64)
    lengths = np.array([len(r) for r in records], dtype=np.uint64)
    return Fingerprint.of(payload_hashes(crcs, lengths), int(lengths.sum()))


def written_records(prefix, fmt):
    """The shards' records in order, read by independent readers (Beam's TFRecord codec,
    gzip + split, pyarrow.parquet)."""
    paths = shards(prefix)
    if fmt == "tfrecord":
        if paths[0].endswith(".gz"):
            plain = []
            for path in paths:
                with gzip.open(path, "rb") as handle, open(path + ".plain", "wb") as out:
                    out.write(handle.read())
                plain.append(path + ".plain")
            found = read_tfrecord_payloads(plain)
            for path in plain:
                os.remove(path)
            return found
        return read_tfrecord_payloads(paths)
    if fmt == "jsonl":
        return [line for path in paths for line in open(path, "rb").read().split(b"\n")[:-1]]
    return [row for path in paths for row in pq.read_table(path).to_pylist()]


FORMATS = ["tfrecord_out", "gzip_out", "jsonl_out", "parquet_out"]


def test_import_needs_no_beam_tensorflow_torch_or_grain():
    code = (
        "import sys, pileshuffle.loader; "
        "print(sorted(m for m in ('apache_beam', 'tensorflow', 'torch', 'grain', 'jax') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


NOT_INSTALLED = """
import sys

class NotInstalled:  # as on a training host without them
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("apache_beam", "tensorflow", "torch"):
            raise ImportError(f"No module named {name!r}")

sys.meta_path.insert(0, NotInstalled())
from pileshuffle.loader import ShuffledDataset
ds = ShuffledDataset(sys.argv[1], seed=1, mix=2, rank=1, world_size=2)
part = ds.for_worker(1, 2)
state = part.state_after(10)
records = sum(len(b) for b in part.batches(100))
part.load_state_dict(state)
print(records, sum(1 for _ in part), len(part))
"""


@pytest.mark.parametrize("name", ["tfrecord_out", "parquet_out"])
def test_reading_works_without_beam_tensorflow_or_torch_installed(name, request):
    prefix = request.getfixturevalue(name)
    done = subprocess.run(
        [sys.executable, "-c", NOT_INSTALLED, prefix], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["750", "740", "750"]


@pytest.mark.parametrize("name", FORMATS)
def test_written_order_without_reshuffle_is_the_shards_in_order(name, request):
    prefix = request.getfixturevalue(name)
    ds = ShuffledDataset(prefix, reshuffle=False)
    fmt = ds.format
    expected = written_records(prefix, fmt)
    assert list(ds) == expected
    # every epoch, and by manifest path
    ds = ShuffledDataset(prefix + "-manifest.json", reshuffle=False, epoch=3)
    assert list(ds) == expected


@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("mix", [1, 3])
def test_every_epoch_is_the_manifests_multiset_in_a_new_order(name, mix, request):
    prefix = request.getfixturevalue(name)
    expected = Fingerprint.from_json(manifest(prefix)["output_fingerprint"])
    ds = ShuffledDataset(prefix, seed=11, mix=mix)
    epochs = []
    for epoch in range(3):
        ds.set_epoch(epoch)
        records = list(ds)
        assert len(records) == len(ds) == expected.records
        assert fingerprint(records, ds.schema) == expected
        epochs.append(records)
    written = written_records(prefix, ds.format)
    assert len({json.dumps(e, default=repr) for e in epochs + [written]}) == 4  # all orders differ
    again = ShuffledDataset(prefix, seed=11, mix=mix, epoch=2)
    assert list(again) == epochs[2]  # same seed and epoch: same order
    assert list(ShuffledDataset(prefix, seed=12, mix=mix, epoch=2)) != epochs[2]


@pytest.mark.parametrize("name", FORMATS)
def test_batches_hold_the_records_in_order(name, request):
    prefix = request.getfixturevalue(name)
    ds = ShuffledDataset(prefix, seed=2, mix=2)
    records = list(ds)
    ds.set_epoch(0)  # each pass reads the next epoch unless set_epoch says otherwise
    batches = list(ds.batches(256))
    assert [len(b) for b in batches] == [256] * (len(records) // 256) + [len(records) % 256]
    if ds.format == "parquet":
        assert all(isinstance(b, pa.RecordBatch) and b.schema == ds.schema for b in batches)
        assert [row for b in batches for row in b.to_pylist()] == records
        ds.set_epoch(0)
        arrays = list(ds.batches(100, as_numpy=True, drop_last=True))
        assert (
            np.concatenate([a["index"] for a in arrays]).tolist()
            == [r["index"] for r in records][: len(arrays) * 100]
        )
    else:
        assert all(isinstance(b, list) and isinstance(b[0], bytes) for b in batches)
        assert [r for b in batches for r in b] == records
        ds.set_epoch(0)
        arrays = list(ds.batches(100, as_numpy=True, drop_last=True))
        assert all(a["record"].dtype == object and len(a["record"]) == 100 for a in arrays)
        assert [r for a in arrays for r in a["record"]] == records[: len(arrays) * 100]


def test_parquet_columns_are_selected(parquet_out):
    ds = ShuffledDataset(parquet_out, columns=["label", "index"], seed=4)
    assert ds.schema.names == ["label", "index"]
    batch = next(iter(ds.batches(10)))
    assert batch.schema.names == ["label", "index"]
    ds.set_epoch(0)
    full = [(r["label"], r["index"]) for r in ShuffledDataset(parquet_out, seed=4)]
    assert [(r["label"], r["index"]) for r in ds] == full
    with pytest.raises(InputError, match="no column"):
        ShuffledDataset(parquet_out, columns=["nope"])


def test_the_epoch_order_arrays_say_where_every_record_is(tfrecord_out):
    written = written_records(tfrecord_out, "tfrecord")
    sizes = [s["records"] for s in manifest(tfrecord_out)["shards"]]
    starts = np.concatenate(([0], np.cumsum(sizes)))
    for mix in (1, 2, 9):  # 9 > the 7 piles: every step reads a window of all of them
        ds = ShuffledDataset(tfrecord_out, seed=9, mix=mix, epoch=4)
        pile, index = epoch_order(sizes, seed=9, epoch=4, mix=mix)
        assert list(ds) == [written[i] for i in (starts[pile] + index).tolist()]


@given(
    sizes=st.lists(st.integers(0, 40), min_size=1, max_size=12),
    mix=st.integers(1, 5),
    seed=st.integers(0, 2**64 - 1),
    epoch=st.integers(0, 1000),
    reshuffle=st.booleans(),
)
@SETTINGS
def test_the_epoch_order_is_a_permutation_of_every_record(sizes, mix, seed, epoch, reshuffle):
    pile, index = epoch_order(sizes, seed, epoch, mix, reshuffle)
    pairs = sorted(zip(pile.tolist(), index.tolist()))
    assert pairs == [(p, i) for p, size in enumerate(sizes) for i in range(size)]
    if not reshuffle:
        assert list(zip(pile.tolist(), index.tolist())) == pairs
    order = EpochOrder(tuple(sizes), seed, epoch, mix, reshuffle)
    width, starts = order.width, order.step_starts
    # pile rank j is read over steps j .. j+K-1 only
    for rank, p in enumerate(order.pile_order.tolist()):
        where = np.flatnonzero(pile == p)
        assert len(where) == sizes[p]
        if len(where):
            assert (
                starts[rank] <= where.min()
                and where.max() < starts[min(rank + width, order.num_steps)]
            )
    # a step reads slice step-j of pile ranks j in (step-K, step]
    for step in range(order.num_steps):
        stretch = pile[starts[step] : starts[step + 1]]
        expected = {
            int(order.pile_order[j]): np.subtract(*order.slice_bounds(j, step)[::-1])
            for j in order.step_ranks(step)
        }
        assert {p: int((stretch == p).sum()) for p in expected} == expected and len(stretch) == sum(
            expected.values()
        )


SPLITS = [(1, 1), (2, 1), (3, 1), (1, 3), (2, 2), (3, 4), (7, 3)]


@pytest.mark.parametrize("remainder", ["drop", "pad"])
def test_splits_are_disjoint_complete_and_equal_per_rank(tfrecord_out, remainder):
    total = manifest(tfrecord_out)["totals"]["records"]  # 3000
    full = list(ShuffledDataset(tfrecord_out, seed=3, epoch=1))
    for world_size, workers in SPLITS + [(11, 2)]:  # 3000 = 11 * 272 + 8
        per_rank = []
        for rank in range(world_size):
            ds = ShuffledDataset(
                tfrecord_out, seed=3, epoch=1, rank=rank, world_size=world_size, remainder=remainder
            )
            parts = [ds.for_worker(w, workers) for w in range(workers)]
            records = [r for part in parts for r in part]
            assert sum(len(p) for p in parts) == len(ds) == len(records)
            per_rank.append(records)
        assert len({len(r) for r in per_rank}) == 1  # equal per rank
        flat = [r for records in per_rank for r in records]
        if remainder == "drop":
            assert len(per_rank[0]) == total // world_size
            # contiguous, in global order, disjoint
            assert flat == full[: total - total % world_size]
        else:
            each = -(-total // world_size)
            assert len(per_rank[0]) == each
            assert flat == (full + full)[: each * world_size]  # pads by repeating the start


def test_no_consumer_loads_more_than_its_share_plus_mix_plus_one_piles(
    tmp_path_factory, monkeypatch
):
    prefix = _output(tmp_path_factory, "tfrecord", records=4000, piles=40, record_bytes=40)
    loaded = _count_loads(monkeypatch)
    for mix in (1, 3):
        for world_size, workers in ((3, 2), (4, 3)):
            loads = []
            for rank in range(world_size):
                ds = ShuffledDataset(
                    prefix, seed=1, mix=mix, rank=rank, world_size=world_size, prefetch=False
                )
                for worker in range(workers):
                    part = ds.for_worker(worker, workers)
                    planned = part.piles_to_load()
                    loaded.clear()
                    list(part)
                    ((a, b),) = part.ranges
                    share = (b - a) / (part.order.total / 40)
                    assert loaded == planned and len(loaded) == len(set(loaded)) <= share + mix + 1
                    loads += loaded
            consumers = world_size * workers
            assert len(loads) <= 40 + (consumers - 1) * mix  # each pile once, plus K per boundary


def _count_loads(monkeypatch):
    """The piles (indices) loaded from now on, by the real loader, in order."""
    seen, load = [], PileRef.load

    def counting(self, *args, **kwargs):
        seen.append(self.index)
        return load(self, *args, **kwargs)

    monkeypatch.setattr(PileRef, "load", counting)
    return seen


@pytest.mark.parametrize("name", ["tfrecord_out", "parquet_out"])
@given(data=st.data())
@SETTINGS
def test_resuming_at_any_record_continues_the_uninterrupted_stream(name, request, data):
    prefix = request.getfixturevalue(name)
    mix = data.draw(st.sampled_from([1, 2, 7]))
    world_size = data.draw(st.integers(1, 3))
    rank = data.draw(st.integers(0, world_size - 1))
    kwargs = dict(
        seed=7, epoch=data.draw(st.integers(0, 5)), mix=mix, rank=rank, world_size=world_size
    )
    ds = ShuffledDataset(prefix, **kwargs)
    stream = list(ds)
    stop = data.draw(st.integers(0, len(stream)))
    ds = ShuffledDataset(prefix, **kwargs)
    it = iter(ds)
    consumed = [next(it) for _ in range(stop)]
    state = json.loads(json.dumps(ds.state_dict()))
    assert state == ds.state_after(stop)
    it.close()
    resumed = ShuffledDataset(prefix, **{**kwargs, "epoch": 0})
    resumed.load_state_dict(state)
    resumed.set_epoch(kwargs["epoch"])  # the usual call at an epoch's start keeps the position
    assert consumed + list(resumed) == stream
    after = ShuffledDataset(prefix, **kwargs)
    after.load_state_dict(state)
    size = data.draw(st.integers(1, 300))
    assert (
        consumed
        + [r for b in after.batches(size) for r in (b.to_pylist() if name == "parquet_out" else b)]
        == stream
    )


def test_a_finished_epoch_is_followed_by_the_next_and_state_is_checked(tfrecord_out):
    ds = ShuffledDataset(tfrecord_out, seed=1)
    first = list(ds)
    assert ds.state_dict()["position"] == len(ds)
    assert list(ds) == list(ShuffledDataset(tfrecord_out, seed=1, epoch=1)) != first
    ds.set_epoch(0)
    assert list(ds) == first
    other = ShuffledDataset(tfrecord_out, seed=2)
    with pytest.raises(ValueError, match="seed"):
        other.load_state_dict(ds.state_dict())
    ranked = ShuffledDataset(tfrecord_out, seed=1, rank=1, world_size=2)
    with pytest.raises(ValueError, match="consumer"):
        ranked.load_state_dict(ds.state_dict())


def _consume_split(prefix, world_size, workers, stops, **kwargs):
    """Consumers of a (world_size, workers) split each read ``stops[i]`` records (capped):
    returns (records read, their states)."""
    read, states, i = [], [], 0
    for rank in range(world_size):
        ds = ShuffledDataset(prefix, rank=rank, world_size=world_size, **kwargs)
        for worker in range(workers):
            part = ds.for_worker(worker, workers)
            it = iter(part)
            for _ in range(min(stops[i % len(stops)], len(part))):
                read.append(next(it))
            it.close()
            states.append(json.loads(json.dumps(part.state_dict())))
            i += 1
    return read, states


@given(data=st.data())
@SETTINGS
def test_resuming_with_another_split_loses_and_repeats_nothing(jsonl_out, data):
    before = (data.draw(st.integers(1, 4)), data.draw(st.integers(1, 3)))
    after = (data.draw(st.integers(1, 4)), data.draw(st.integers(1, 3)))
    kwargs = dict(seed=5, epoch=2, mix=data.draw(st.sampled_from([1, 3])))
    stops = data.draw(st.lists(st.integers(0, 1200), min_size=1, max_size=12))
    read, states = _consume_split(jsonl_out, *before, stops, **kwargs)
    rest, lengths = [], []
    for rank in range(after[0]):
        ds = ShuffledDataset(jsonl_out, rank=rank, world_size=after[0], **kwargs)
        ds.load_state_dict(states)
        for worker in range(after[1]):
            part = ds.for_worker(worker, after[1])
            left = len(part) - part.position  # len(): the consumer's whole sequence this epoch
            records = list(part)
            assert len(records) == left
            rest += records
        lengths.append(len(ds))
    total = 3000 - 3000 % before[0]  # the first split dropped its remainder
    everything = list(ShuffledDataset(jsonl_out, **kwargs))[:total]
    assert sorted(read + rest) == sorted(everything)  # nothing lost, nothing repeated
    assert max(lengths) - min(lengths) <= 1
    remaining = sorted(set(everything) - set(read), key=everything.index)
    assert rest == remaining  # dealt out contiguously in global order


def test_resuming_the_same_split_from_all_states_is_exact(tfrecord_out):
    kwargs = dict(seed=8, epoch=1, mix=2)
    uninterrupted = {}
    for rank in range(2):
        ds = ShuffledDataset(tfrecord_out, rank=rank, world_size=2, **kwargs)
        for worker in range(3):
            uninterrupted[rank, worker] = list(ds.for_worker(worker, 3))
    read, states = _consume_split(tfrecord_out, 2, 3, [5, 200, 0, 499, 17, 300], **kwargs)
    for rank in range(2):
        ds = ShuffledDataset(tfrecord_out, rank=rank, world_size=2, **kwargs)
        ds.load_state_dict(states)
        for worker in range(3):
            state = states[rank * 3 + worker]
            rest = list(ds.for_worker(worker, 3))
            assert uninterrupted[rank, worker][state["position"] :] == rest
    padded = ShuffledDataset(tfrecord_out, remainder="pad", world_size=7, rank=6, **kwargs)
    rest = list(padded)
    pad_states = [
        ShuffledDataset(tfrecord_out, remainder="pad", world_size=7, rank=r, **kwargs).state_after(
            10
        )
        for r in range(7)
    ]
    again = ShuffledDataset(tfrecord_out, remainder="pad", world_size=7, rank=6, **kwargs)
    again.load_state_dict(pad_states)
    assert list(again) == rest[10:]


def test_an_unfinished_or_missing_output_is_refused(tmp_path, tfrecord_out):
    with pytest.raises(
        NoOutputError, match="no finished output.*data-manifest.json.*unfinished run"
    ):
        ShuffledDataset(str(tmp_path / "data"))
    copy = tmp_path / "copy"
    os.makedirs(copy)
    for path in shards(tfrecord_out):  # shards without their manifest: a run that did not finish
        os.link(path, copy / os.path.basename(path))
    with pytest.raises(NoOutputError, match=str(copy / "data")):
        ShuffledDataset(str(copy / "data"))


@pytest.fixture(scope="module")
def fixed_out(tmp_path_factory):
    """Records of one length: frames found by the vectorized path."""
    return _output(tmp_path_factory, "tfrecord", records=600, piles=3, record_bytes=50)


@pytest.mark.parametrize("name", ["tfrecord_out", "fixed_out"])
def test_a_corrupt_frame_is_refused_naming_file_and_offset(tmp_path, name, request):
    prefix = request.getfixturevalue(name)
    copy = tmp_path / "copy"
    os.makedirs(copy)
    for path in shards(prefix) + [prefix + "-manifest.json"]:
        with open(path, "rb") as src, open(copy / os.path.basename(path), "wb") as dst:
            dst.write(src.read())
    victim = shards(str(copy / "data"))[2]
    data = bytearray(open(victim, "rb").read())
    (length,) = np.frombuffer(bytes(data[:8]), "<u8")
    second = 12 + int(length) + 4
    data[second + 20] ^= 0xFF  # inside the second record's payload
    open(victim, "wb").write(bytes(data))
    with pytest.raises(InputError) as caught:
        list(ShuffledDataset(str(copy / "data"), reshuffle=False))
    assert str(caught.value).startswith(
        f"{victim} at byte offset {second}: corrupt record: the data"
    )
    data[second + 20] ^= 0xFF
    data[second + 3] ^= 0x01  # its length field
    open(victim, "wb").write(bytes(data))
    with pytest.raises(
        InputError, match=f"at byte offset {second}: corrupt record: the length field"
    ):
        list(ShuffledDataset(str(copy / "data"), reshuffle=False))
    open(victim, "wb").write(bytes(data[:-3]))
    with pytest.raises(InputError, match=f"{victim} at byte offset"):
        list(ShuffledDataset(str(copy / "data"), reshuffle=False))


# --- pile stores, built by hand as SPEC.md fixes them ---------------------------------------


def _frame(payload: bytes) -> bytes:
    from pileshuffle.records.crc import mask_crcs

    header = len(payload).to_bytes(8, "little")
    crc = lambda b: int(mask_crcs(np.array([google_crc32c.value(b)]))[0]).to_bytes(4, "little")  # noqa: E731
    return header + crc(header) + payload + crc(payload)


def build_store(
    prefix, fmt, num_piles=3, generations=((0, 2, 120), (1, 1, 80)), seed=0, max_pile_bytes=1 << 20
):
    """A store with records ``g<gen>-w<writer>-<i>`` in several generations and files per pile,
    some keys shared between files. Returns {pile: records in written order}."""
    rng = np.random.default_rng(seed)
    directory = f"{prefix}-store"
    entries, everything = [], {p: [] for p in range(num_piles)}
    for generation, writers, count in generations:
        files = []
        for writer in range(writers):
            payloads = [
                b"g%d-w%d-%04d" % (generation, writer, i) + b"x" * int(rng.integers(0, 30))
                for i in range(count)
            ]
            keys = rng.integers(0, 2**64, count, dtype=np.uint64)
            # equal keys: the sort must be stable
            keys[: count // 10] = keys[count // 10 : 2 * (count // 10)]
            piles = keymath.pile_of(keys, num_piles)
            for pile in range(num_piles):
                chosen = np.flatnonzero(piles == pile)
                # canonical order is not key order
                chosen = chosen[np.argsort(rng.random(len(chosen)))]
                records = [payloads[i] for i in chosen]
                if fmt == "parquet":
                    table = pa.table(
                        {
                            "name": pa.array([r.decode() for r in records]),
                            "size": pa.array([len(r) for r in records], pa.int64()),
                        }
                    )
                # payloads, as WritePileStore keeps a bytes PCollection
                elif generation % 2 and fmt != "parquet":
                    table = pa.table({"record": pa.array(records, pa.binary())})
                else:
                    column = "tfrecord_frame" if fmt == "tfrecord" else "line"
                    stored = [_frame(r) if fmt == "tfrecord" else r + b"\n" for r in records]
                    table = pa.table({column: pa.array(stored, pa.binary())})
                table = table.append_column("_pileshuffle_key", pa.array(keys[chosen], pa.uint64()))
                table = table.append_column(
                    "_pileshuffle_hash", pa.array(np.zeros(len(chosen), np.uint64))
                )
                path = f"g{generation:06d}/p{pile:05d}-w{writer:05d}.arrows"
                os.makedirs(f"{directory}/g{generation:06d}", exist_ok=True)
                with pa.ipc.new_stream(f"{directory}/{path}", table.schema) as out:
                    half = len(table) // 2  # two record batches: chunked columns
                    out.write_table(table.slice(0, half))
                    out.write_table(table.slice(half))
                files.append(
                    {
                        "path": path,
                        "pile": pile,
                        "writer": writer,
                        "records": len(chosen),
                        "bytes": os.path.getsize(f"{directory}/{path}"),
                    }
                )
                everything[pile].append((keys[chosen], records))
        fp = {"records": count * writers, "bytes": 0, "hash_sum": "0", "hash_xor": "0"}
        entries.append(
            {
                "generation": generation,
                "created": "2026-11-23T20:00:00Z",
                "inputs": [],
                "records": count * writers,
                "payload_bytes": 0,
                "fingerprint": fp,
                "files": files,
            }
        )
    manifest = {
        "kind": "pileshuffle-store",
        "store_format": 1,
        "version": 2,
        "pileshuffle_version": "0.1.0",
        "format": fmt,
        "compression": "none",
        "num_piles": num_piles,
        "seed": seed,
        "max_pile_bytes": max_pile_bytes,
        "generations": entries[::-1],
        "totals": {},
    }
    with open(f"{directory}/manifest-00000002.json", "w") as out:
        json.dump(manifest, out)
    with open(f"{directory}/manifest-00000001.json", "w") as out:  # an older version: not current
        json.dump({**manifest, "version": 1, "generations": entries[:1]}, out)
    expected = {}
    for pile, parts in everything.items():
        keys = np.concatenate([k for k, _ in parts])
        records = [r for _, rs in parts for r in rs]
        expected[pile] = [records[i] for i in np.argsort(keys, kind="stable")]
    return expected


@pytest.mark.parametrize("fmt", ["tfrecord", "jsonl", "parquet"])
def test_a_store_reads_as_piles_sorted_by_key_and_sub_piles_agree(tmp_path, fmt):
    expected = build_store(str(tmp_path / "data"), fmt)
    output = open_output(str(tmp_path / "data"))
    assert output.kind == "store" and output.format == fmt and len(output.piles) == 3

    def rows(block):
        table = block.slice(0, block.num_rows)
        if fmt == "parquet":
            return [name.encode() for name in table.column("name").to_pylist()]
        return table.column(0).to_pylist()

    for pile in output.piles:
        assert pile.keyed and pile.records == len(expected[pile.index])
        assert rows(pile.load()) == expected[pile.index]
        for ways in (2, 5):
            assert [r for s in range(ways) for r in rows(pile.load((s, ways)))] == expected[
                pile.index
            ]
    ds = ShuffledDataset(str(tmp_path / "data"), reshuffle=False)
    flat = [r for p in range(3) for r in expected[p]]
    got = list(ds)
    assert (got if fmt != "parquet" else [r["name"].encode() for r in got]) == flat
    shuffled = list(ShuffledDataset(str(tmp_path / "data-store"), seed=3))
    assert len(shuffled) == len(flat) and shuffled != got
    old = ShuffledDataset(str(tmp_path / "data-store" / "manifest-00000001.json"), reshuffle=False)
    assert len(old) == 240  # that version's generations only


def test_a_corrupt_store_frame_is_refused(tmp_path):
    build_store(str(tmp_path / "data"), "tfrecord", generations=((0, 1, 60),))
    path = tmp_path / "data-store" / "g000000" / "p00001-w00000.arrows"
    table = pa.ipc.open_stream(pa.memory_map(str(path))).read_all()
    frames = table.column("tfrecord_frame").to_pylist()
    frames[0] = frames[0][:14] + bytes([frames[0][14] ^ 1]) + frames[0][15:]
    table = table.set_column(0, "tfrecord_frame", pa.array(frames, pa.binary()))
    with pa.ipc.new_stream(str(path), table.schema) as out:
        out.write_table(table)
    with pytest.raises(InputError, match=f"{path} at byte offset 0: corrupt record: the data"):
        list(ShuffledDataset(str(tmp_path / "data"), reshuffle=False))


MEMORY_PROBE = """
import sys, tracemalloc, pyarrow as pa
from pileshuffle.loader import ShuffledDataset

def rss():
    return int(open("/proc/self/statm").read().split()[1]) * 4096

def mapped_piles():  # local TFRecord piles are memory-mapped while loaded
    return len({line.split()[-1] for line in open("/proc/self/maps") if line.rstrip().endswith(".tfrecord")})

prefix, mix, prefetch = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
ds = ShuffledDataset(prefix, seed=1, mix=mix, prefetch=prefetch)
tracemalloc.start()
pool = pa.default_memory_pool()
base, arrow_peak, rss_peak, piles_peak = rss(), 0, 0, 0
for batch in ds.batches(64):
    arrow_peak = max(arrow_peak, pool.bytes_allocated())
    rss_peak = max(rss_peak, rss())
    if ds.format == "tfrecord":
        piles_peak = max(piles_peak, mapped_piles())
print(rss_peak - base, piles_peak, arrow_peak + tracemalloc.get_traced_memory()[1])
"""


@pytest.mark.parametrize("fmt", ["tfrecord", "parquet"])
def test_memory_stays_within_mix_plus_one_piles_and_a_batch(tmp_path_factory, fmt):
    """Whatever the output's size (here 15 TFRecord piles of 8 MB, or 6 Parquet piles of
    32 MB), sampled at every batch: a TFRecord reader maps exactly the K piles it reads and
    the next one (K without prefetch; the old groups of K mapped 2K); peak allocations
    (Arrow's pool + tracemalloc) and RSS growth stay within those piles, one more for a
    load's transients and 12 MB. RSS may exceed that by a constant: TFRecord, 20 MB (the
    payloads' bytes, library code first run while reading, the prefetch thread's malloc
    arena: measured 15-22 MB); Parquet, whose piles are decoded into Arrow's pool, which
    keeps freed pages for a while, 128 MB (measured: about 90)."""
    records, piles_count = (120000, 15) if fmt == "tfrecord" else (192000, 6)
    prefix = _output(tmp_path_factory, fmt, records=records, piles=piles_count, record_bytes=1000)
    pile_bytes = max(s["bytes"] for s in manifest(prefix)["shards"])
    whole = sum(s["bytes"] for s in manifest(prefix)["shards"])
    retained = (20 if fmt == "tfrecord" else 128) << 20
    for mix, prefetch in ((1, True), (4, True), (4, False)):
        done = subprocess.run(
            [sys.executable, "-c", MEMORY_PROBE, prefix, str(mix), str(int(prefetch))],
            capture_output=True,
            text=True,
            check=True,
        )
        rss_growth, mapped, allocated = map(int, done.stdout.split())
        piles = mix + 1 if prefetch else mix  # the K piles being read and the next one
        bound = (piles + 1) * pile_bytes + (12 << 20)  # + a load's transients; code pages, a batch
        assert rss_growth <= bound + retained, (mix, prefetch, rss_growth, bound + retained)
        assert allocated <= bound, (mix, prefetch, allocated, bound)
        assert rss_growth > mix * pile_bytes / 2  # the probe sees the loaded piles
        if fmt == "tfrecord":
            assert mapped == piles, (mix, prefetch, mapped)
            if mix == 1:
                # so the bound says memory does not grow with the output
                assert bound + retained < whole / 2


@given(keys=st.lists(st.integers(0, 2**64 - 1) | st.integers(0, 3), max_size=300))
@SETTINGS
def test_sort_by_key_is_the_stable_sort(keys):
    from pileshuffle.loader.order import sort_by_key

    keys = np.array(keys, dtype=np.uint64)
    assert sort_by_key(keys).tolist() == np.argsort(keys, kind="stable").tolist()


@given(
    total=st.integers(0, 500),
    world_size=st.integers(1, 9),
    workers=st.integers(1, 5),
    remainder=st.sampled_from(["drop", "pad"]),
    cuts=st.lists(st.integers(0, 500), max_size=20),
)
@SETTINGS
def test_split_arithmetic_covers_every_position_once(total, world_size, workers, remainder, cuts):
    from pileshuffle.loader import split

    shares = [split.rank_share(total, r, world_size, remainder) for r in range(world_size)]
    parts = [split.part(s, w, workers) for s in shares for w in range(workers)]
    flat = [p for ranges in parts for a, b in ranges for p in range(a, b)]
    assert len({split.length(s) for s in shares}) <= 1
    if remainder == "drop":
        assert flat == list(range(total - total % world_size))
    else:
        assert (
            flat == [p % total for p in range(len(flat))]
            and len(flat) == -(-total // world_size) * world_size
        )
    states = [
        (ranges, min(c, split.length(ranges))) for ranges, c in zip(parts, cuts + [0] * len(parts))
    ]
    remaining = split.union(r for ranges, done in states for r in split.tail(ranges, done))
    dealt = [split.redeal(remaining, r, 3, "drop") for r in range(3)]
    assert [p for d in dealt for a, b in d for p in range(a, b)] == [
        p for a, b in remaining for p in range(a, b)
    ]


def prefetch_threads() -> set:
    import threading

    return {thread for thread in threading.enumerate() if thread.name == "pileshuffle-prefetch"}


def test_an_abandoned_iteration_stops_its_prefetch_thread(tfrecord_out):
    earlier = prefetch_threads()  # other tests' abandoned iterations may still be ending theirs
    ds = ShuffledDataset(tfrecord_out, seed=1)
    batches = ds.batches(10)
    next(batches)
    [thread] = prefetch_threads() - earlier  # one prefetch thread per iteration
    batches.close()  # the thread ends after the load it may be doing; nothing waits for it
    thread.join(timeout=120)  # against a hang only
    assert not thread.is_alive()
    assert len(list(ds)) == 3000  # and the next iteration reads the whole epoch


@pytest.mark.parametrize("fmt", ["tfrecord", "parquet"])
def test_empty_piles_are_read_as_nothing(tmp_path_factory, fmt):
    prefix = _output(tmp_path_factory, fmt, records=12, piles=16, record_bytes=60)
    sizes = [s["records"] for s in manifest(prefix)["shards"]]
    assert 0 in sizes
    written = written_records(prefix, fmt)
    for mix in (1, 3):
        for world_size in (1, 5):
            got = []
            for rank in range(world_size):
                ds = ShuffledDataset(
                    prefix, seed=2, mix=mix, rank=rank, world_size=world_size, remainder="pad"
                )
                got += [r for w in range(2) for r in ds.for_worker(w, 2)]
            assert len(got) == -(-12 // world_size) * world_size
            key = (lambda r: r["index"]) if fmt == "parquet" else (lambda r: r)
            assert sorted(map(key, got[:12])) == sorted(map(key, written))


@pytest.mark.parametrize("name", ["tfrecord_out", "gzip_out", "parquet_out"])
def test_any_pyarrow_filesystem_reads_the_same(name, request):
    """Through a non-local pyarrow.fs (as gs:// or s3:// would be): one read per file, paths
    relative to that file system."""
    import pyarrow.fs as pafs

    prefix = request.getfixturevalue(name)
    root = os.path.dirname(os.path.dirname(prefix))
    subtree = pafs.SubTreeFileSystem(root, pafs.LocalFileSystem())
    remote = ShuffledDataset("out/data", filesystem=subtree, seed=6, mix=2)
    local = ShuffledDataset(prefix, seed=6, mix=2)
    assert remote.format == local.format and remote.schema == local.schema
    assert list(remote) == list(local)
    with pytest.raises(NoOutputError, match="elsewhere"):
        ShuffledDataset("out/elsewhere", filesystem=subtree)


# --- the README's "Training on the output" examples, run as written ------------------------


def readme_examples(section="## Training on the output"):
    """The python code blocks of one README section, as written there."""
    import re

    readme = open(
        os.path.join(os.path.dirname(__file__), "..", "README.md"), encoding="utf-8"
    ).read()
    body = readme[readme.index(section) :]
    body = body[: body.index("\n## ", len(section))]
    return re.findall(r"```python\n(.*?)```", body, flags=re.S)


README_TORCH, README_RESUME, README_TF = readme_examples()


@pytest.fixture(scope="module")
def examples_out(tmp_path_factory):
    """tf.train.Examples (TensorFlow's own writer), shuffled by a real run."""
    import tensorflow as tf

    root = tmp_path_factory.mktemp("readme")
    os.makedirs(root / "in")
    with tf.io.TFRecordWriter(str(root / "in" / "part-0.tfrecord")) as writer:
        for i in range(3000):
            feature = {
                "index": tf.train.Feature(int64_list=tf.train.Int64List(value=[i])),
                "text": tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"x" * (i % 50)])),
            }
            writer.write(
                tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()
            )
    run_shuffle(
        str(root / "in" / "*.tfrecord"), str(root / "out" / "train"), "--num_piles=6", "--seed=1"
    )
    return str(root / "out" / "train")


def test_the_readme_torch_examples_run(examples_out):
    scope = {"rank": 1, "world_size": 2}
    exec(README_TORCH.replace("out/train", examples_out), scope)
    whole = [list(b) for b in scope["loader"]]
    assert sum(len(b) for b in whole) == 1500  # this rank's half of epoch 1
    scope["train"].set_epoch(0)
    from torchdata.stateful_dataloader import StatefulDataLoader

    uninterrupted = [
        list(b) for b in StatefulDataLoader(scope["train"], batch_size=None, num_workers=2)
    ]
    scope["train"].set_epoch(0)
    exec(README_RESUME, scope)
    head = uninterrupted[:4]
    assert head + [list(b) for b in scope["loader"]] == uninterrupted


def test_the_readme_tf_example_runs(examples_out):
    import tensorflow as tf

    scope = {}
    exec(README_TF.replace("out/train", examples_out), scope)
    spec = {"index": tf.io.FixedLenFeature([], tf.int64)}
    rest = [
        int(i)
        for b in scope["ds"].tf(batch_size=256).map(lambda x: tf.io.parse_example(x, spec))
        for i in b["index"].numpy()
    ]
    everything = [
        int(tf.io.parse_example([r], spec)["index"][0])
        for r in ShuffledDataset(examples_out, seed=0)
    ]
    assert rest == everything[512:]


@pytest.mark.parametrize("fmt", ["tfrecord", "jsonl", "parquet"])
def test_a_store_written_by_the_store_writer_reads_as_runs_shards(tmp_path, fmt):
    """``run --layout store`` then the loader with ``reshuffle=False`` gives exactly the order
    ``run`` writes."""
    sample.WRITERS[fmt](str(tmp_path / "in"), records=2000, files=3, record_bytes=70)
    pattern = str(tmp_path / "in" / f"*.{fmt}")
    run_shuffle(
        pattern,
        str(tmp_path / "store" / "train"),
        f"--format={fmt}",
        "--num_piles=5",
        "--seed=3",
        "--layout=store",
    )
    run_shuffle(
        pattern, str(tmp_path / "run" / "train"), f"--format={fmt}", "--num_piles=5", "--seed=3"
    )
    store = ShuffledDataset(str(tmp_path / "store" / "train"), reshuffle=False)
    assert store.output.kind == "store"
    assert list(store) == list(ShuffledDataset(str(tmp_path / "run" / "train"), reshuffle=False))


def test_resuming_padded_ranks_with_another_world_size_pads_from_the_rest(jsonl_out):
    kwargs = dict(seed=5, epoch=1, remainder="pad")
    # 3000 = 7 * 429 - 3
    read, states = _consume_split(jsonl_out, 7, 1, [100, 0, 429, 37, 250, 5, 429], **kwargs)
    everything = list(ShuffledDataset(jsonl_out, **kwargs))
    rest = []
    for rank in range(4):
        ds = ShuffledDataset(jsonl_out, rank=rank, world_size=4, **kwargs)
        ds.load_state_dict(states)
        rest.append(list(ds))
    assert len({len(r) for r in rest}) == 1  # equal per rank again
    flat = [r for records in rest for r in records]
    assert set(read) | set(flat) == set(everything)  # nothing lost
    remaining = [r for r in everything if r not in set(read)]
    # global order, padded from the start of the rest
    assert flat == (remaining + remaining)[: len(flat)]


@pytest.mark.parametrize("fmt", ["tfrecord", "parquet"])
def test_grown_store_piles_are_read_in_sub_piles_in_the_same_order(tmp_path, fmt):
    generations = ((0, 2, 300), (1, 1, 200), (2, 2, 250))
    expected = build_store(
        str(tmp_path / "data"), fmt, generations=generations, max_pile_bytes=4000
    )
    output = open_output(str(tmp_path / "data"))
    assert len(output.piles) > 3 and all(ref.part is not None for ref in output.piles)
    assert [ref.index for ref in output.piles] == sorted(ref.index for ref in output.piles)
    for pile in range(3):
        refs = [ref for ref in output.piles if ref.index == pile]
        assert sum(ref.records for ref in refs) == len(expected[pile])
    flat = [r for p in range(3) for r in expected[p]]
    got = list(ShuffledDataset(str(tmp_path / "data"), reshuffle=False))
    assert (got if fmt != "parquet" else [r["name"].encode() for r in got]) == flat
    shuffled = list(ShuffledDataset(str(tmp_path / "data"), seed=2, mix=2))
    key = (lambda r: r["name"]) if fmt == "parquet" else (lambda r: r)
    assert sorted(map(key, shuffled)) == sorted(map(key, got)) and shuffled != got
