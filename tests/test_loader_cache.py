"""The loader's local cache of remote piles (``ShuffledDataset(cache_dir=..., cache_limit=...)``),
on outputs of real runs on the Cloud Storage emulator (``gcs`` fixture): the records and their
order are those of an uncached read, a second epoch reads local files only, the limit holds
with least recently used files evicted first, damaged or changed files are caught by their
sizes, and DataLoader worker processes share one folder."""

import os
import re
import time
import uuid

import google_crc32c
import pytest
from helpers import run_shuffle

from pileshuffle import names
from pileshuffle.commands import sample
from pileshuffle.errors import InputError
from pileshuffle.io import storage
from pileshuffle.io.arrow_backend import arrow_filesystem
from pileshuffle.loader import ShuffledDataset
from pileshuffle.loader.cache import PileCache, _listed_crc32c, parse_limit

RECORDS, PILES = 1600, 4
# torch's own advice for a 2-core machine, and torchdata's call of a deprecated torch API
pytestmark = [
    pytest.mark.filterwarnings("ignore:This DataLoader will create"),
    pytest.mark.filterwarnings("ignore:'set_vital' is deprecated"),
]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """Per format, a local input pattern (the runs write to gs://)."""
    root = tmp_path_factory.mktemp("in")
    sample.write_tfrecord(
        str(root / "tfrecord"), records=RECORDS, files=2, record_bytes=100, vary=True
    )
    sample.write_parquet(
        str(root / "parquet"), records=RECORDS, files=2, record_bytes=80, row_group_rows=200
    )
    return {fmt: str(root / fmt / f"*.{fmt}") for fmt in ("tfrecord", "parquet")}


@pytest.fixture(scope="module")
def outputs(inputs, gcs_root):
    """``{(kind, format): gs:// prefix}`` of real runs: shard outputs, and stores (the
    TFRecord one with piles over its max_pile_bytes, so it opens as sub-piles)."""
    root = f"{gcs_root}/cache-{uuid.uuid4().hex[:8]}"
    found = {}
    for fmt, pattern in inputs.items():
        run_shuffle(
            pattern, f"{root}/shards-{fmt}", f"--format={fmt}", f"--num_piles={PILES}", "--seed=1"
        )
        store = ["--layout=store", "--num_piles=3", "--seed=2"] + (
            ["--max_pile_bytes=32KiB"] if fmt == "tfrecord" else []
        )
        run_shuffle(pattern, f"{root}/store-{fmt}", f"--format={fmt}", *store)
        found[("shards", fmt)], found[("store", fmt)] = (
            f"{root}/shards-{fmt}",
            f"{root}/store-{fmt}",
        )
    return found


def shard_paths(prefix: str) -> list:
    return [shard["path"] for shard in storage.read_json(names.manifest_path(prefix))["shards"]]


def cached(directory) -> dict:
    """``{remote file name: (bytes, mtime_ns)}`` of the cache's entries."""
    return {
        os.path.basename(path).split("-", 1)[1]: (size, os.stat(path).st_mtime_ns)
        for path, size in PileCache(directory).entries()
    }


def normal(records):
    return [tuple(sorted(r.items())) if isinstance(r, dict) else r for r in records]


@pytest.mark.parametrize(
    "kind,fmt",
    [("shards", "tfrecord"), ("shards", "parquet"), ("store", "tfrecord"), ("store", "parquet")],
)
def test_epochs_with_the_cache_are_those_without_it(outputs, tmp_path, kind, fmt):
    prefix, cache = outputs[(kind, fmt)], tmp_path / "cache"
    plain = ShuffledDataset(prefix, seed=3, mix=2)
    with_cache = ShuffledDataset(prefix, seed=3, mix=2, cache_dir=cache)
    if kind == "store" and fmt == "tfrecord":
        # sub-piles: their keys were read through the cache at open
        assert len(with_cache.output.piles) > 3
    for _ in range(2):  # the first epoch fills the cache, the second reads it
        expected = normal(plain)
        assert normal(with_cache) == expected and len(expected) == RECORDS
    files = {os.path.basename(f) for p in with_cache.output.piles for f in p.files}
    assert set(cached(cache)) == files  # every file of the output, once
    assert with_cache.state_dict() == plain.state_dict()


def test_the_second_epoch_reads_local_files_only(inputs, gcs, tmp_path):
    """After the first epoch the remote shards are deleted (the manifest stays): the second
    epoch, and a dataset opened afterwards, read everything from the cache; without the cache
    the output is now unreadable."""
    prefix, cache = f"{gcs}/t", str(tmp_path / "cache")
    run_shuffle(inputs["tfrecord"], prefix, f"--num_piles={PILES}", "--seed=1")
    ds = ShuffledDataset(prefix, seed=5, cache_dir=cache)
    first = list(ds)
    before = cached(cache)
    assert len(before) == PILES
    storage.delete(shard_paths(prefix))
    second = list(ds)
    # epoch 1: another order of the same records
    assert sorted(second) == sorted(first) and second != first
    after = cached(cache)
    assert {k: size for k, (size, _) in after.items()} == {
        k: size for k, (size, _) in before.items()
    }
    assert all(after[k][1] > before[k][1] for k in before)  # every hit refreshed its entry
    assert list(ShuffledDataset(prefix, seed=5, cache_dir=cache)) == first
    with pytest.raises(InputError):
        list(ShuffledDataset(prefix, seed=5))


def test_another_run_written_at_the_same_path_never_hits_an_old_entry(inputs, gcs, tmp_path):
    """One pile: a re-run with another seed writes a shard of the same name and size, in another order."""
    prefix, cache = f"{gcs}/t", str(tmp_path / "cache")
    run_shuffle(inputs["tfrecord"], prefix, "--num_piles=1", "--seed=1")
    first = list(ShuffledDataset(prefix, reshuffle=False, cache_dir=cache))
    run_shuffle(inputs["tfrecord"], prefix, "--num_piles=1", "--seed=2", "--overwrite")
    second = list(ShuffledDataset(prefix, reshuffle=False, cache_dir=cache))
    assert second == list(ShuffledDataset(prefix, reshuffle=False)) != first
    assert [size for _, size in PileCache(cache).entries()] == [
        storage.size(shard_paths(prefix)[0])
    ] * 2


def test_the_limit_holds_and_the_least_recently_used_go_first(outputs, tmp_path):
    prefix, cache = outputs[("shards", "tfrecord")], str(tmp_path / "cache")
    sizes = [storage.size(path) for path in shard_paths(prefix)]
    limit = sum(sorted(sizes)[-2:]) + 10  # room for any two shards, never three
    ds = ShuffledDataset(prefix, seed=4, cache_dir=cache, cache_limit=limit)
    order = ds.piles_to_load()
    assert len(list(ds)) == RECORDS
    kept = cached(cache)
    assert sum(size for size, _ in kept.values()) <= limit and len(kept) == 2
    names_of = [os.path.basename(p.files[0]) for p in ds.output.piles]
    assert set(kept) == {names_of[p] for p in order[-2:]}  # the last two loaded
    piles = ds.output.piles
    a, b, c = order[-2], order[-1], order[0]
    piles[a].load()  # a hit: a is now the most recently used
    piles[c].load()  # a miss: evicts the least recently used, b
    assert set(cached(cache)) == {names_of[a], names_of[c]} and names_of[b] not in cached(cache)


def test_the_file_just_added_is_never_evicted(outputs, tmp_path):
    """Another process used its entry after this one fetched (its mtime is later): over the
    limit, that entry goes, not the file this process is about to read."""
    prefix, cache = outputs[("shards", "tfrecord")], tmp_path / "cache"
    cache.mkdir()
    other = cache / ("0" * 32 + "-used-by-another-process")
    other.write_bytes(b"x" * 10)
    later = time.time_ns() + 10**11
    os.utime(other, ns=(later, later))
    ds = ShuffledDataset(
        prefix, cache_dir=cache, cache_limit=storage.size(shard_paths(prefix)[0]) + 5
    )
    ds.output.piles[0].load()
    assert list(cached(cache)) == [os.path.basename(ds.output.piles[0].files[0])]


def test_eviction_deletes_only_entries_and_stale_temp_files(outputs, tmp_path):
    prefix, cache = outputs[("shards", "tfrecord")], tmp_path / "cache"
    cache.mkdir()
    mine, stale, live = (
        cache / "notes.txt",
        cache / ".abc.123-dead.part",
        cache / ".abc.456-live.part",
    )
    for path in (mine, stale, live):
        path.write_bytes(b"y" * 10**6)  # over the limit on its own
    os.utime(stale, (time.time() - 7200, time.time() - 7200))
    assert len(list(ShuffledDataset(prefix, cache_dir=cache, cache_limit=10**5))) == RECORDS
    assert mine.exists() and live.exists() and not stale.exists()


def test_a_file_larger_than_the_limit_is_read_without_caching(outputs, tmp_path):
    prefix, cache = outputs[("shards", "parquet")], tmp_path / "cache"
    assert normal(ShuffledDataset(prefix, seed=1, cache_dir=cache, cache_limit=100)) == normal(
        ShuffledDataset(prefix, seed=1)
    )
    assert os.listdir(cache) == []


def test_a_damaged_entry_is_fetched_again(outputs, tmp_path):
    """Truncated: its size says so on the hit, and it is fetched again. Changed in place at the
    same size: TFRecord's CRCs say so on reading; the copy is dropped (with a warning) and the
    remote file read instead, and the next epoch fetches it again."""
    prefix, cache = outputs[("shards", "tfrecord")], str(tmp_path / "cache")
    expected = list(ShuffledDataset(prefix, seed=2))
    assert list(ShuffledDataset(prefix, seed=2, cache_dir=cache)) == expected
    (victim, size), *_ = PileCache(cache).entries()
    good = open(victim, "rb").read()
    with open(victim, "r+b") as handle:
        handle.truncate(size // 2)
    assert list(ShuffledDataset(prefix, seed=2, cache_dir=cache)) == expected
    assert open(victim, "rb").read() == good
    with open(victim, "r+b") as handle:
        handle.seek(size // 2)
        handle.write(bytes([good[size // 2] ^ 0xFF]))
    with pytest.warns(RuntimeWarning, match="cannot be read .*; dropped, reading the remote file"):
        assert list(ShuffledDataset(prefix, seed=2, cache_dir=cache, prefetch=False)) == expected
    assert not os.path.exists(victim)
    assert list(ShuffledDataset(prefix, seed=2, cache_dir=cache)) == expected
    assert open(victim, "rb").read() == good


def test_a_remote_file_of_another_size_than_listed_is_refused_and_not_kept(inputs, gcs, tmp_path):
    prefix, cache = f"{gcs}/t", str(tmp_path / "cache")
    run_shuffle(inputs["tfrecord"], prefix, "--num_piles=2", "--seed=1")
    shard = shard_paths(prefix)[0]
    data = storage.read_buffer(shard).to_pybytes()
    with storage.open_write(shard) as handle:  # changed after the manifest was written
        handle.write(data[: len(data) - 100])
    ds = ShuffledDataset(prefix, reshuffle=False, cache_dir=cache)
    with pytest.raises(
        InputError,
        match=re.escape(
            f"{shard}: is {len(data) - 100:,} bytes where its manifest lists "
            f"{len(data):,}: changed after it was written"
        ),
    ):
        list(ds)
    assert os.listdir(cache) == []  # neither the bad copy nor a temp file


def test_the_object_stores_crc32c_is_checked_on_every_fetch(outputs):
    """The CRC a fetch compares with is the one the store lists for the object (the emulator,
    like Cloud Storage, lists one): the check is live, not skipped for want of a CRC."""
    shard = shard_paths(outputs[("shards", "tfrecord")])[0]
    fs, where = arrow_filesystem(shard)
    with storage.open_random_access(where, fs) as remote:
        assert _listed_crc32c(remote) == google_crc32c.value(
            storage.read_buffer(shard).to_pybytes()
        )


@pytest.mark.parametrize("tight", [False, True])
def test_dataloader_workers_share_one_cache(outputs, tmp_path, tight):
    """Two worker processes fill and read one folder (with room for one shard only, they evict
    each other's files as they go): the records are those of the uncached loader."""
    from torch.utils.data import DataLoader

    prefix, cache = outputs[("shards", "tfrecord")], str(tmp_path / "cache")
    limit = max(storage.size(path) for path in shard_paths(prefix)) + 10 if tight else "50GB"
    expected = [
        bytes(r)
        for r in DataLoader(ShuffledDataset(prefix, seed=6).torch(), batch_size=None, num_workers=2)
    ]
    ds = ShuffledDataset(prefix, seed=6, cache_dir=cache, cache_limit=limit)
    for _ in range(2):  # cold, then warm
        assert [
            bytes(r) for r in DataLoader(ds.torch(), batch_size=None, num_workers=2)
        ] == expected
    kept = PileCache(cache).entries()
    # filled by the workers: the cache went with them
    assert len(kept) == PILES if not tight else len(kept) <= 1
    assert sum(size for _, size in kept) <= parse_limit(limit)
    assert not [name for name in os.listdir(cache) if name.startswith(".")]  # no temp file left


def test_a_state_resumes_the_same_with_or_without_the_cache(outputs, tmp_path):
    prefix = outputs[("store", "parquet")]
    cached_ds = ShuffledDataset(prefix, seed=8, mix=2, cache_dir=tmp_path / "cache")
    it = iter(cached_ds)
    head = [next(it) for _ in range(500)]
    state = cached_ds.state_dict()
    rest = list(it)
    plain = ShuffledDataset(prefix, seed=8, mix=2)
    plain.load_state_dict(state)
    assert list(plain) == rest and len(head) + len(rest) == RECORDS
    again = ShuffledDataset(prefix, seed=8, mix=2, cache_dir=tmp_path / "cache")
    again.load_state_dict(state)
    assert list(again) == rest


def test_a_local_output_is_read_in_place(tmp_path, inputs):
    prefix = str(tmp_path / "out" / "t")
    run_shuffle(inputs["tfrecord"], prefix, "--num_piles=2")
    cache = tmp_path / "cache"
    assert list(ShuffledDataset(prefix, cache_dir=cache)) == list(ShuffledDataset(prefix))
    assert os.listdir(cache) == []


@pytest.mark.parametrize(
    "value,number",
    [
        (1, 1),
        (10**9, 10**9),
        ("50GB", 50 * 10**9),
        ("500MB", 500 * 10**6),
        ("1.5 TB", 15 * 10**11),
        ("2GiB", 2 * 2**30),
        ("123", 123),
        ("7kb", 7000),
    ],
)
def test_cache_limit_values(value, number):
    assert parse_limit(value) == number


@pytest.mark.parametrize(
    "value", [0, -5, "0MB", "abc", "50XB", "GB", "5 G B", 1.5, 5e10, True, None, b"50GB"]
)
def test_bad_cache_limits_are_refused_naming_the_argument(tmp_path, value):
    with pytest.raises(ValueError, match="cache_limit"):
        ShuffledDataset(
            str(tmp_path / "no-output"), cache_dir=tmp_path / "cache", cache_limit=value
        )
    with pytest.raises(ValueError, match="cache_limit"):
        # checked without a cache_dir too
        ShuffledDataset(str(tmp_path / "no-output"), cache_limit=value)


def test_bad_cache_dirs_are_refused_naming_the_argument(tmp_path):
    a_file = tmp_path / "file"
    a_file.write_text("x")
    for value in [123, "", "gs://bucket/cache", a_file, str(a_file / "below")]:
        with pytest.raises(ValueError, match="cache_dir"):
            ShuffledDataset(str(tmp_path / "no-output"), cache_dir=value)
