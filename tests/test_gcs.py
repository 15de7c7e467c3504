"""Every command and the loader on gs://, against the local emulator (or a real bucket when
PILESHUFFLE_TEST_BUCKET names one): the bytes equal the local run's, and what goes wrong with
Cloud Storage itself is one line naming the path (how soon: bench/exits.py)."""

import collections
import json
import os
import subprocess
import sys
import time
import urllib.parse
import uuid

import pytest
from helpers import FAST, run_shuffle, shard_bytes

from pileshuffle import names
from pileshuffle.commands import sample
from pileshuffle.io import storage

FORMATS = ["tfrecord", "jsonl", "parquet", "tar"]
# A hang guard, not a speed claim: without its retry limits pyarrow retried for over 400 s here
HANG_SECONDS = 120


def gs_shard_bytes(output: str) -> list:
    manifest = storage.read_json(names.manifest_path(output))
    return [storage.read_buffer(shard["path"]).to_pybytes() for shard in manifest["shards"]]


def comparable(manifest: dict, prefix: str) -> dict:
    """A manifest without its timings and with ``prefix`` in paths replaced: equal for equal runs."""
    text = json.dumps({k: v for k, v in manifest.items() if k not in ("seconds", "wall_seconds")})
    return json.loads(text.replace(prefix, "P"))


def cli(*args, env=None, timeout=120):
    return subprocess.run(
        [sys.executable, "-m", "pileshuffle", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, gcs_root):
    """Per format, ``(local pattern, gs:// pattern)`` of the same generated files."""
    local, remote = tmp_path_factory.mktemp("in"), f"{gcs_root}/inputs-{uuid.uuid4().hex[:8]}"
    found = {}
    for fmt in FORMATS:
        write = dict(records=2400, files=3, record_bytes=90)
        sample.WRITERS[fmt](str(local / fmt), **write)
        sample.WRITERS[fmt](f"{remote}/{fmt}", **write)
        found[fmt] = (str(local / fmt / f"*.{fmt}"), f"{remote}/{fmt}/*.{fmt}")
    # a store's second generation
    write = dict(records=1200, files=2, record_bytes=70, seed=1, name="more")
    sample.write_tfrecord(str(local / "more"), **write)
    sample.write_tfrecord(f"{remote}/more", **write)
    found["more"] = (str(local / "more" / "*.tfrecord"), f"{remote}/more/*.tfrecord")
    return found


# -- the pipeline -----------------------------------------------------------------------------------


@pytest.mark.parametrize("intermediate", ["files", "shuffle"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_run_on_gcs_gives_the_local_bytes(inputs, gcs, tmp_path, fmt, intermediate):
    local_in, remote_in = inputs[fmt]
    args = [f"--format={fmt}", "--num_piles=3", "--seed=5", f"--intermediate={intermediate}"]
    # the manifests are compared: auto would size piles from the memory free at each run's start
    args.append("--max_pile_bytes=64MiB")
    local = run_shuffle(local_in, str(tmp_path / "t"), *args)
    remote = run_shuffle(remote_in, f"{gcs}/t", *args)
    assert gs_shard_bytes(f"{gcs}/t") == shard_bytes(str(tmp_path / "t"))
    assert comparable(remote, f"{gcs}/t") == comparable(local, str(tmp_path / "t")) | {
        "inputs": comparable(remote, f"{gcs}/t")["inputs"]
    }
    assert [i["records"] for i in remote["inputs"]] == [i["records"] for i in local["inputs"]]
    leftovers = [
        f.path
        for f in storage.match(f"{gcs}/**")
        if "-manifest.json" not in f.path and "-of-" not in f.path
    ]
    assert leftovers == []  # no staging, work or temp objects


def test_a_balanced_run_on_gcs_gives_the_local_bytes_and_verifies(inputs, gcs, tmp_path):
    from pileshuffle.commands.verify import verify

    local_in, remote_in = inputs["tar"]
    # sample.write_tar: 10 classes of 240
    weights = ",".join(f"{c}={2 if c == 0 else 1}" for c in range(10))
    args = [
        "--label_field=cls",
        f"--balance={weights}",
        "--undersample",
        "--num_piles=3",
        "--seed=5",
    ]
    local = run_shuffle(local_in, str(tmp_path / "b"), *args)
    remote = run_shuffle(remote_in, f"{gcs}/b", *args)
    assert gs_shard_bytes(f"{gcs}/b") == shard_bytes(str(tmp_path / "b"))
    assert remote["balance"] == local["balance"] and local["totals"]["records"] == 240 + 9 * 120
    assert verify(remote_in, f"{gcs}/b", None) == []


def test_a_balanced_jsonl_run_and_store_on_gcs_give_the_local_bytes(gcs, tmp_path):
    """The counting pass's JSONL reader (a reused buffer filled by readinto), pass 1's reading by
    the lines it found (their lengths kept in the work folder), the plan's sample of labels (auto
    piles sized for the output) and --keep_unlabeled, on gs://."""
    from pileshuffle.commands.verify import verify
    from pileshuffle.store import layout

    labels = ["a"] * 700 + ["b"] * 200 + ["c"] * 97 + [None] * 3
    lines = [
        json.dumps({"i": i, **({"y": y} if y else {}), "t": "x" * (i % 50)}) + "\n"
        for i, y in enumerate(labels)
    ]
    local_in, remote_in = tmp_path / "in", f"{gcs}/balanced-in"
    local_in.mkdir()
    for part in range(2):
        data = "".join(lines[part::2]).encode()
        (local_in / f"p{part}.jsonl").write_bytes(data)
        with storage.open_write(f"{remote_in}/p{part}.jsonl", "uncompressed") as handle:
            handle.write(data)
    args = [
        "--label_field=y",
        "--balance=uniform",
        "--keep_unlabeled",
        "--max_pile_bytes=1MiB",
        "--seed=4",
    ]
    local = run_shuffle(str(local_in / "*.jsonl"), str(tmp_path / "b"), *args)
    remote = run_shuffle(f"{remote_in}/*.jsonl", f"{gcs}/jb", *args)
    assert gs_shard_bytes(f"{gcs}/jb") == shard_bytes(str(tmp_path / "b"))
    assert remote["balance"] == local["balance"] and remote["options"] == local["options"]
    # the sample, read on gs://
    assert "written 2.80 times over by --balance" in remote["options"]["num_piles_reason"]
    assert remote["balance"]["records_after"] == {"a": 700, "b": 700, "c": 700, "null": 700}
    assert verify(f"{remote_in}/*.jsonl", f"{gcs}/jb", None) == []
    run_shuffle(f"{remote_in}/*.jsonl", f"{gcs}/js", "--layout=store", *args)
    stored = layout.read_store_manifest(f"{gcs}/js")
    assert (
        stored["generations"][0]["balance"] == remote["balance"]
        and stored["options"]["keep_unlabeled"] is True
    )
    assert verify(f"{remote_in}/*.jsonl", f"{gcs}/js", None) == []


def test_verify_plan_and_quality_on_gcs(inputs, gcs):
    local_in, remote_in = inputs["tfrecord"]
    run_shuffle(remote_in, f"{gcs}/t", "--num_piles=3", "--seed=2")
    done = cli("verify", f"--input={remote_in}", f"--output={gcs}/t")
    assert done.returncode == 0 and "OK: 2,400 records in 3 shard(s)" in done.stdout, done.stderr
    done = cli("plan", f"--input={remote_in}", f"--output={gcs}/u", "--num_piles=3")
    assert done.returncode == 0 and "3 tfrecord file(s), 254,400 bytes" in done.stdout, done.stderr
    done = cli(
        "quality",
        f"--input={remote_in}",
        f"--output={gcs}/t",
        f"--report={gcs}/report",
        "--sample=2000",
    )
    assert done.returncode == 0, done.stderr
    assert storage.read_json(f"{gcs}/report/quality.json")["records"] == 2400
    assert sorted(storage.split(p)[1] for p in storage.list_folder(f"{gcs}/report"))[:2] == [
        "quality.json",
        "quality.png",
    ]
    assert not os.path.exists("gs:")  # it once wrote a local folder named gs:


@pytest.fixture
def counting_proxy():
    """A proxy in front of the emulator that counts the requests reaching it (``delay_proxy``,
    no delay): its endpoint."""
    import delay_proxy

    if not os.environ.get("STORAGE_EMULATOR_HOST"):
        pytest.skip("only on the emulator: the proxy counts its requests")
    process, proxy = delay_proxy.start(os.environ["STORAGE_EMULATOR_HOST"], 0.0)
    yield proxy
    process.kill()
    process.wait()


def media_gets(proxy: str, path: str) -> list:
    """The ranges (None: the whole object) of the GETs of ``path``'s bytes that reached ``proxy``."""
    import delay_proxy

    name = urllib.parse.quote(path.split("/", 3)[3], safe="")
    seen = delay_proxy.counts(proxy)["seen"]
    return [
        ranged
        for method, target, ranged, *_ in seen
        if method == "GET" and name in target and "alt=media" in target
    ]


@pytest.mark.parametrize("command", ["verify", "quality"])
@pytest.mark.parametrize("fmt", ["tfrecord", "parquet", "jsonl"])
def test_verify_and_quality_download_each_file_once(inputs, gcs, fmt, command, counting_proxy):
    """``verify`` checks a shard's CRC32C and reads its records from one download of it,
    ``quality`` reads its records so, and both read each input file in one download, its size
    taken from the listing (a request-counting proxy in front of the emulator sees one GET of
    its bytes, no ranged one)."""
    import delay_proxy

    args = [f"--format={fmt}", "--num_piles=2", "--seed=2"]
    if fmt == "jsonl":
        args.append("--compression=gzip")  # a .gz shard: its bytes held as they decompress
    run_shuffle(inputs[fmt][1], f"{gcs}/t", *args)
    shards = [s["path"] for s in storage.read_json(names.manifest_path(f"{gcs}/t"))["shards"]]
    argv = [command, f"--input={inputs[fmt][1]}", f"--output={gcs}/t"]
    done = cli(*argv, env={"STORAGE_EMULATOR_HOST": counting_proxy})
    said = "OK: 2,400 records in 2 shard(s)" if command == "verify" else "2,400 records"
    assert done.returncode == 0 and said in done.stdout, done.stderr
    for path in shards + [f.path for f in storage.match(inputs[fmt][1])]:
        assert media_gets(counting_proxy, path) == [None], path
    # and an input file's size is the listing's, not asked again: its metadata and its bytes
    seen = [target for _, target, *_ in delay_proxy.counts(counting_proxy)["seen"]]
    for path in storage.match(inputs[fmt][1]):
        name = urllib.parse.quote(path.path.split("/", 3)[3], safe="")
        assert len([t for t in seen if name in t]) <= 2, (path.path, seen)


def test_a_files_size_on_gcs_is_its_metadata_not_a_listing_of_its_folder(
    inputs, monkeypatch, counting_proxy
):
    """``storage.size`` through pyarrow (``verify`` checks each store file's size so) asks for the
    file's metadata: a match listed its folder, each call (a store of 10,000 files: 10,000
    listings of 10,000 names)."""
    import delay_proxy

    listed = storage.match(inputs["parquet"][1])[0]
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", counting_proxy)
    monkeypatch.setenv("PILESHUFFLE_STORAGE", "arrow")
    assert storage.size(listed.path) == listed.size
    seen = [target for _, target, *_ in delay_proxy.counts(counting_proxy)["seen"]]
    assert seen and not [t for t in seen if "prefix=" in t], seen


def test_quality_streams_a_file_larger_than_it_holds(
    inputs, gcs, monkeypatch, capsys, counting_proxy
):
    """A remote shard or input file over ``whole_reads.HELD_MAX_BYTES`` (lowered here to 1 byte)
    is not held whole: ``quality`` reads it as it streams (Parquet: its reader's ranged requests),
    in bounded memory, and opens no stream only to drop it."""
    from pileshuffle.commands.quality import main as quality
    from pileshuffle.io import whole_reads

    run_shuffle(inputs["parquet"][1], f"{gcs}/t", "--format=parquet", "--num_piles=2", "--seed=2")
    shard = storage.read_json(names.manifest_path(f"{gcs}/t"))["shards"][0]["path"]
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", counting_proxy)
    monkeypatch.setenv("PILESHUFFLE_STORAGE", "arrow")  # as the command reads
    monkeypatch.setattr(whole_reads, "HELD_MAX_BYTES", 1)
    capsys.readouterr()
    assert quality([f"--input={inputs['parquet'][1]}", f"--output={gcs}/t"]) == 0
    assert "2,400 records" in capsys.readouterr().out
    for path in (shard, storage.match(inputs["parquet"][1])[0].path):
        ranged = [r for r in media_gets(counting_proxy, path) if r is not None]
        assert len(ranged) > 1, (path, ranged)  # ranged reads, not one GET
        # and no stream opened only to be dropped (each a download begun; 3 before): pyarrow's
        # two whole-object reads of a Parquet file are its reader's own
        whole = [r for r in media_gets(counting_proxy, path) if r is None]
        assert len(whole) <= 2, (path, whole)


@pytest.mark.parametrize("fmt", ["tfrecord", "parquet"])
def test_verify_and_the_loader_on_gcs_name_a_damaged_shard(inputs, gcs, fmt, tmp_path):
    from pileshuffle.errors import InputError
    from pileshuffle.loader import ShuffledDataset

    run_shuffle(inputs[fmt][1], f"{gcs}/t", f"--format={fmt}", "--num_piles=2", "--seed=2")
    shard = storage.read_json(names.manifest_path(f"{gcs}/t"))["shards"][1]["path"]
    data = bytearray(storage.read_buffer(shard).to_pybytes())
    data[len(data) // 2] ^= (
        0x10  # a record's byte (Parquet: a page's): every reader still parses it
    )
    storage.write_whole(shard, bytes(data))
    done = cli("verify", f"--output={gcs}/t")
    assert (
        done.returncode == 1
        and done.stderr.count("FAILED") == 1
        and f"shard {shard} is damaged" in done.stderr
    )
    # read where it is (one request), and through the cache
    for cache in (
        None,
        str(tmp_path / "cache"),
    ):
        # TFRecord: its frames' CRCs
        with pytest.raises(InputError, match="is damaged|corrupt record") as refused:
            list(ShuffledDataset(f"{gcs}/t", seed=1, cache_dir=cache))
        assert refused.value.path == shard


LOADER_DIGEST = (
    "import hashlib, sys; from pileshuffle.loader import ShuffledDataset; "
    "cache = sys.argv[2] or None; "
    "print(hashlib.sha256(repr(list(ShuffledDataset(sys.argv[1], seed=1, cache_dir=cache)))"
    ".encode())"
    ".hexdigest())"
)


@pytest.mark.parametrize("reader", ["verify", "loader", "loader's cache"])
@pytest.mark.parametrize("fmt", ["tfrecord", "parquet"])
def test_downloads_dropped_midway_are_resumed_by_the_run_verify_and_the_loader(
    gcs, tmp_path, fmt, reader
):
    """The emulator drops the first download of every object under a CUT folder after 64 KiB (once
    per API: Beam's and pyarrow's each meet it): pass 1's reads of the input, then ``verify``'s or
    the loader's reads of the shards (through pyarrow, as the read side reads; or its cache's
    downloads) resume, and see the local run's bytes."""
    import hashlib

    from gcs_emulator import CUT, CUT_AFTER, cut_paths

    from pileshuffle.loader import ShuffledDataset

    if not os.environ.get("STORAGE_EMULATOR_HOST"):
        pytest.skip("only on the emulator: it drops the downloads")
    write = dict(records=2000, files=2, record_bytes=200)
    remote_in, remote_out = f"{gcs}/{CUT}/in", f"{gcs}/{CUT}/t"
    sample.WRITERS[fmt](str(tmp_path / "in"), **write)
    sample.WRITERS[fmt](remote_in, **write)
    args = [f"--format={fmt}", "--num_piles=2", "--seed=4", "--max_pile_bytes=64MiB"]
    local = run_shuffle(str(tmp_path / "in" / f"*.{fmt}"), str(tmp_path / "t"), *args)
    remote = run_shuffle(f"{remote_in}/*.{fmt}", remote_out, *args)
    assert min(shard["bytes"] for shard in remote["shards"]) > 2 * CUT_AFTER
    endpoint = os.environ["STORAGE_EMULATOR_HOST"]
    cut_before = cut_paths(endpoint)
    if reader == "verify":
        done = cli("verify", f"--input={remote_in}/*.{fmt}", f"--output={remote_out}")
        assert done.returncode == 0 and "OK: 2,000 records in 2 shard(s)" in done.stdout, (
            done.stderr
        )
    else:
        cache = str(tmp_path / "cache") if reader == "loader's cache" else ""
        read = subprocess.run(
            [sys.executable, "-c", LOADER_DIGEST, remote_out, cache],
            capture_output=True,
            text=True,
            timeout=HANG_SECONDS,
        )
        records = repr(list(ShuffledDataset(str(tmp_path / "t"), seed=1))).encode()
        assert read.stdout.strip() == hashlib.sha256(records).hexdigest(), read.stderr
        cached = sorted(os.listdir(cache)) if cache else []
        assert len([name for name in cached if "-of-" in name]) == (2 if cache else 0), cached
    shard_names = [s["path"].rsplit("/", 1)[1] for s in remote["shards"]]
    cut_now = [path for path in cut_paths(endpoint) if path not in cut_before]
    assert all(any(name in path for path in cut_now) for name in shard_names), cut_now
    input_names = [f.path.rsplit("/", 1)[1] for f in storage.match(f"{remote_in}/*")]
    assert all(any(name in path for path in cut_before) for name in input_names), cut_before
    assert gs_shard_bytes(remote_out) == shard_bytes(str(tmp_path / "t"))
    assert [s["records"] for s in remote["shards"]] == [s["records"] for s in local["shards"]]


KILLED_BEFORE_THE_MANIFEST = """
import os, sys
from pileshuffle.io import storage
write_whole, rename = storage.write_whole, storage.rename
def write_or_die(path, data):
    if path.endswith("-manifest.json"):
        os._exit(9)  # the machine dies: the shards have their final names, the manifest is not written
    write_whole(path, data)
def told(sources, destinations):
    print("renamed", destinations, file=sys.stderr)
    rename(sources, destinations)
storage.write_whole, storage.rename = write_or_die, told
from pileshuffle.pipeline import run
run(sys.argv[1:])
"""


def test_a_run_killed_during_publication_on_gcs_leaves_no_manifest_and_the_rerun_gives_the_same_bytes(
    inputs, gcs, tmp_path
):
    """No rename is atomic on Cloud Storage (it is a copy): a fresh output's shards are uploaded
    straight to their final names, and the manifest, written last, is the commit point. A run
    killed before it has none; readers refuse it, and its re-run (no --overwrite needed: the
    journal lists those shards as its own) replaces them and publishes."""
    from pileshuffle.loader import ShuffledDataset
    from pileshuffle.loader.piles import NoOutputError

    local_in, remote_in = inputs["jsonl"]
    args = ["--format=jsonl", "--num_piles=3", "--seed=9", "--direct_num_workers=1"]
    expected = run_shuffle(local_in, str(tmp_path / "t"), *args)
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            KILLED_BEFORE_THE_MANIFEST,
            f"--input={remote_in}",
            f"--output={gcs}/t",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 9, done.stderr
    assert "renamed" not in done.stderr  # no shard was copied
    assert not storage.exists(names.manifest_path(f"{gcs}/t"))
    # final names, listed by no manifest
    assert len(storage.match(names.shard_pattern(f"{gcs}/t"))) == 3
    with pytest.raises(NoOutputError):
        ShuffledDataset(f"{gcs}/t")
    rerun = run_shuffle(remote_in, f"{gcs}/t", *args)
    assert gs_shard_bytes(f"{gcs}/t") == shard_bytes(str(tmp_path / "t"))
    assert rerun["output_fingerprint"] == expected["output_fingerprint"]
    assert sorted(storage.split(f.path)[1] for f in storage.match(f"{gcs}/**")) == [
        "t-00000-of-00003.jsonl",
        "t-00001-of-00003.jsonl",
        "t-00002-of-00003.jsonl",
        "t-manifest.json",
    ]


# -- stores -----------------------------------------------------------------------------------------


def store_life(pattern_a, pattern_b, prefix):
    """run --layout store, append, expire, gc, materialize: the manifests and the loader's epoch."""
    from pileshuffle.commands import append as append_command
    from pileshuffle.commands import materialize as materialize_command
    from pileshuffle.loader import ShuffledDataset
    from pileshuffle.store.expire import expire

    first = run_shuffle(pattern_a, prefix, "--layout=store", "--num_piles=3", "--seed=4")
    second = append_command.append([f"--store={prefix}", f"--input={pattern_b}", *FAST])
    both = list(ShuffledDataset(prefix, seed=1))
    manifest, dropped, deleted = expire(prefix, keep_generations=1, grace_seconds=3600)
    done = cli("gc", f"--store={prefix}", "--grace_seconds=0")
    assert done.returncode == 0, done.stderr
    materialize_command.materialize([f"--store={prefix}", f"--output={prefix}-mat", *FAST])
    return (
        [first["version"], second["version"], manifest["version"]],
        both,
        list(ShuffledDataset(prefix, seed=1)),
    )


def test_a_store_life_on_gcs_equals_the_local_one(inputs, gcs, tmp_path):
    first, more = inputs["tfrecord"], inputs["more"]
    local = store_life(first[0], more[0], str(tmp_path / "s"))
    remote = store_life(first[1], more[1], f"{gcs}/s")
    assert remote[0] == local[0] == [1, 2, 3]
    assert remote[1] == local[1] and len(remote[1]) == 3600
    assert remote[2] == local[2] and len(remote[2]) == 1200
    assert gs_shard_bytes(f"{gcs}/s-mat") == shard_bytes(str(tmp_path / "s-mat"))
    left = sorted(storage.split(p)[1] for p in storage.list_folder(names.store_dir(f"{gcs}/s")))
    # gc removed the old versions; no lock, no temp objects
    assert left == ["manifest-00000003.json"]


def test_two_appends_at_once_on_gcs_lose_nothing(inputs, gcs, tmp_path):
    """Both start together; the lock (created on the precondition 'no object there') lets one
    in and the other stops with one line; its re-run publishes the next version. Nothing lost,
    no version skipped."""
    from pileshuffle.loader import ShuffledDataset

    prefix = f"{gcs}/s"
    run_shuffle(inputs["tfrecord"][1], prefix, "--layout=store", "--num_piles=2", "--seed=4")
    days = []
    for day in ("a", "b"):
        directory = f"{gcs}/day-{day}"
        sample.write_tfrecord(
            directory, records=300, files=1, record_bytes=40, seed=ord(day), name=day
        )
        days.append(f"{directory}/*.tfrecord")
    started = [
        subprocess.Popen(
            [sys.executable, "-m", "pileshuffle", "append", f"--store={prefix}", f"--input={d}"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for d in days
    ]
    results = [(p.wait(timeout=180), p.stderr.read()) for p in started]
    won = [d for d, (code, _) in zip(days, results) if code == 0]
    lost = [(d, err) for d, (code, err) in zip(days, results) if code != 0]
    assert len(won) >= 1
    for day, stderr in lost:
        assert "is locked by" in stderr or "appeared while this command ran" in stderr, stderr
        assert cli("append", f"--store={prefix}", f"--input={day}").returncode == 0
    versions = sorted(
        int(p.rsplit("-", 1)[1][:8])
        for p in storage.list_folder(names.store_dir(prefix))
        if "manifest-" in p
    )
    assert versions == [1, 2, 3]
    records = collections.Counter(ShuffledDataset(prefix))
    assert sum(records.values()) == 2400 + 600 and max(records.values()) == 1


# -- the loader -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def outputs(inputs, gcs_root, tmp_path_factory):
    """Per format, ``(local output, gs:// output)`` of the same run."""
    local, remote = tmp_path_factory.mktemp("out"), f"{gcs_root}/outputs-{uuid.uuid4().hex[:8]}"
    found = {}
    for fmt in ("tfrecord", "parquet", "tar"):
        args = [f"--format={fmt}", "--num_piles=4", "--seed=3"]
        run_shuffle(inputs[fmt][0], str(local / fmt), *args)
        run_shuffle(inputs[fmt][1], f"{remote}/{fmt}", *args)
        found[fmt] = (str(local / fmt), f"{remote}/{fmt}")
    return found


@pytest.mark.parametrize("fmt", ["tfrecord", "parquet", "tar"])
def test_the_loader_reads_gcs_as_it_reads_local(outputs, fmt):
    from pileshuffle.loader import ShuffledDataset

    local, remote = outputs[fmt]
    for epoch in (0, 1):
        assert list(ShuffledDataset(remote, seed=7, epoch=epoch, mix=2)) == list(
            ShuffledDataset(local, seed=7, epoch=epoch, mix=2)
        )


def test_dataloader_workers_and_tf_data_read_gcs(outputs):
    from pileshuffle.loader import ShuffledDataset

    local, remote = outputs["tfrecord"]
    expected = list(ShuffledDataset(local, seed=2))
    from torch.utils.data import DataLoader

    workers = DataLoader(ShuffledDataset(remote, seed=2).torch(), batch_size=None, num_workers=2)
    assert sorted(bytes(r) for r in workers) == sorted(expected)
    assert [bytes(r.numpy()) for r in ShuffledDataset(remote, seed=2).tf()] == expected


# -- failing fast -----------------------------------------------------------------------------------


def closed_endpoint() -> dict:
    from helpers import free_port

    return {"STORAGE_EMULATOR_HOST": f"http://127.0.0.1:{free_port()}"}


LOADER = (
    "from pileshuffle.loader import ShuffledDataset; print(len(list(ShuffledDataset(sys.argv[1]))))"
)


def test_no_endpoint_is_one_line_naming_the_path():
    """``run``, ``verify``, the loader and ``generate`` against an endpoint that is down (started
    at once: each waits out its own retries) end in one line naming the path."""
    where = "gs://no-such-endpoint-bucket/out/t"
    argv = {
        "run": ["-m", "pileshuffle", "run", f"--input={where}-in*", f"--output={where}"],
        "verify": ["-m", "pileshuffle", "verify", f"--output={where}"],
        "loader": ["-c", "import sys; " + LOADER, where],
        "generate": ["-m", "pileshuffle", "generate", f"--output_dir={where}", "--records=10"],
    }
    env = {**os.environ, **closed_endpoint()}
    started = {
        command: subprocess.Popen(
            [sys.executable, *args],
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        for command, args in argv.items()
    }
    for command, process in started.items():
        _, stderr = process.communicate(timeout=HANG_SECONDS)
        assert process.returncode != 0, (command, stderr)
        last = stderr.strip().splitlines()[-1]
        assert "gs://no-such-endpoint-bucket" in last and "cannot reach Cloud Storage" in last, (
            command,
            stderr,
        )
        if command != "loader":
            assert len(stderr.strip().splitlines()) == 1, (command, stderr)


def test_a_missing_bucket_or_object_is_one_line(gcs_root, gcs):
    done = cli("verify", "--output=gs://no-such-bucket-here/t", timeout=60)
    assert done.returncode == 2 and done.stderr.strip().count("\n") == 0
    assert "bucket gs://no-such-bucket-here does not exist" in done.stderr
    done = cli("verify", f"--output={gcs}/never-written", timeout=60)
    assert (
        done.returncode == 2
        and f"{gcs}/never-written" in done.stderr
        and done.stderr.strip().count("\n") == 0
    )


# ``pileshuffle ARGV`` with Google's credential lookup made a tripwire: a call ends the process.
NO_CREDENTIAL_LOOKUP = """
import os, sys
import google.auth

def looked_up(*args, **kwargs):
    sys.stderr.write("google.auth.default was called\\n")
    sys.stderr.flush()
    os._exit(97)

google.auth.default = looked_up
sys.argv[0] = "pileshuffle"
from pileshuffle.cli import entry
entry()
"""


def test_a_beam_process_on_the_emulator_starts_without_a_credential_lookup(inputs, gcs):
    """Beam retries Google's credential lookup 4 times (15-25 s) before going anonymous; with
    STORAGE_EMULATOR_HOST set it must not look at all (Beam's auth cache seeded: cloud.py)."""
    if not os.environ.get("STORAGE_EMULATOR_HOST"):
        pytest.skip("only on the emulator: a real bucket looks credentials up, as it should")
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            NO_CREDENTIAL_LOOKUP,
            "run",
            f"--input={inputs['tfrecord'][1]}",
            f"--output={gcs}/t",
            "--num_piles=2",
            "--quiet",
        ],
        capture_output=True,
        text=True,
        timeout=HANG_SECONDS,
    )
    assert "google.auth.default was called" not in done.stderr, "a credential lookup is back"
    assert done.returncode == 0, done.stderr
    assert storage.read_json(names.manifest_path(f"{gcs}/t"))["totals"]["records"] == 2400


@pytest.mark.parametrize("backend", ["arrow", "beam"])
def test_a_persisting_503_is_retried_with_backoff_and_said_on_stderr(
    gcs_root, gcs, monkeypatch, capfd, backend
):
    """The emulator answers reads of these objects with 503 for 7 s: the read still returns the
    bytes, and stderr says it is retrying while the outage lasts. (The bucket answered before:
    the first contact's own outage is the next test's.)"""
    import gcs_emulator

    if not os.environ.get("STORAGE_EMULATOR_HOST"):
        pytest.skip("only on the emulator: it injects the outage")
    monkeypatch.setenv("PILESHUFFLE_STORAGE", backend)
    assert not storage.exists(f"{gcs}/contact")
    path = f"{gcs}/{gcs_emulator.FLAKY}-{backend}/data.bin"
    storage.write_whole(path, b"payload" * 100)
    capfd.readouterr()
    assert storage.read_buffer(path).to_pybytes() == b"payload" * 100
    said = capfd.readouterr().err
    assert (
        "pileshuffle:" in said and "retrying" in said and "Cloud Storage is unavailable" in said
    ), said


def test_an_outage_at_the_first_contact_is_waited_out_and_said(gcs, monkeypatch, capfd):
    """A 503 is the service answering, busy: the first request a process makes to a bucket waits
    it out like any later one (it raised "Cloud Storage is unavailable" at once). Scaled down:
    a 1 s first-contact window against a 2 s outage."""
    import gcs_emulator

    from pileshuffle.errors import InputError
    from pileshuffle.io import cloud_requests

    if not os.environ.get("STORAGE_EMULATOR_HOST"):
        pytest.skip("only on the emulator: it injects the outage")
    path = f"{gcs}/{gcs_emulator.FLAKY}-2s/data.bin"  # its first request starts the outage
    monkeypatch.setattr(cloud_requests, "FIRST_CONTACT_SECONDS", 1)
    # this process has not met the bucket yet
    monkeypatch.setattr(cloud_requests, "_contacted", set())
    capfd.readouterr()
    cloud_requests.first_contact(path)  # raised InputError before
    said = capfd.readouterr().err
    assert "retrying" in said and "Cloud Storage is unavailable" in said and path in said, said
    with pytest.raises(InputError, match="does not exist"):  # and the bucket is still checked
        cloud_requests.first_contact(f"gs://no-such-bucket-{uuid.uuid4().hex[:8]}/data.bin")


def test_ctrl_c_while_a_request_is_retried_in_an_outage_is_acted_on_at_once(gcs):
    """Ctrl-C that comes while the client library retries a request (here the first contact's
    8 s window, about 2 s into it) ends the command within 1.5 s, with its one line: it waited
    for the attempt to end, 1-6 s in an outage."""
    import gcs_emulator
    from test_interrupt import interrupt_when

    if not os.environ.get("STORAGE_EMULATOR_HOST"):
        pytest.skip("only on the emulator: it injects the outage")
    output = f"{gcs}/{gcs_emulator.FLAKY}-60s/t"
    launched = time.monotonic()

    def in_the_first_attempt(pid):  # started, planned nothing yet: pyarrow is retrying
        return time.monotonic() > launched + 3.5

    stopped = interrupt_when(["verify", f"--output={output}"], in_the_first_attempt)
    stopped.check("verify", output)
    assert not any("retrying" in line for line in stopped.before), stopped.before  # 1st attempt
    assert stopped.seconds < 1.5, stopped.seconds


def test_of_writers_racing_to_create_one_object_exactly_one_wins(gcs):
    """The store's lock and version manifests rely on it: ``ifGenerationMatch=0``."""
    from concurrent.futures import ThreadPoolExecutor

    path = f"{gcs}/store-store/manifest-00000002.json"

    def create(writer):
        try:
            storage.create_exclusive(path, b"writer %d" % writer, f"{path}.tmp-{writer}")
            return writer
        except FileExistsError:
            return None

    with ThreadPoolExecutor(8) as pool:
        winners = [w for w in pool.map(create, range(8)) if w is not None]
    assert len(winners) == 1
    assert storage.read_buffer(path).to_pybytes() == b"writer %d" % winners[0]
    assert storage.list_folder(f"{gcs}/store-store") == [path]  # no temporary objects


def test_ctrl_c_during_a_run_on_gcs_leaves_nothing_and_the_rerun_gives_the_same_bytes(
    gcs, tmp_path
):
    from test_interrupt import interrupt_when

    sample.write_tfrecord(str(tmp_path / "in"), records=60_000, files=4, record_bytes=200)
    sample.write_tfrecord(f"{gcs}/in", records=60_000, files=4, record_bytes=200)
    # runs uploaded, not kept in memory
    args = [
        "--num_piles=4",
        "--seed=3",
        "--intermediate=files",
        "--memory=1MiB",
    ]
    run_shuffle(str(tmp_path / "in" / "*.tfrecord"), str(tmp_path / "t"), *args)

    def fragments(pid):  # pass 1 is writing
        return bool(storage.match(f"{gcs}/.pileshuffle-work-*/fragments/*"))

    stopped = interrupt_when(
        ["run", f"--input={gcs}/in/*.tfrecord", f"--output={gcs}/t", *args], fragments
    )
    stopped.check("run", "nothing was published")
    assert [f.path for f in storage.match(f"{gcs}/**") if "/in/" not in f.path] == []
    run_shuffle(f"{gcs}/in/*.tfrecord", f"{gcs}/t", *args)
    assert gs_shard_bytes(f"{gcs}/t") == shard_bytes(str(tmp_path / "t"))


@pytest.mark.parametrize("command", ["verify", "run", "loader"])
def test_a_refused_permission_is_one_line_naming_the_path(gcs, tmp_path, command):
    import gcs_emulator

    if not os.environ.get("STORAGE_EMULATOR_HOST"):
        pytest.skip("only on the emulator: it injects the refusal")
    refused = f"{gcs}/{gcs_emulator.FORBIDDEN}"
    sample.write_tfrecord(str(tmp_path / "in"), records=100, files=1, record_bytes=20)
    argv = {
        "verify": ["-m", "pileshuffle", "verify", f"--output={refused}/t"],
        "run": [
            "-m",
            "pileshuffle",
            "run",
            f"--input={tmp_path}/in/*.tfrecord",
            f"--output={refused}/t",
        ],
        "loader": ["-c", "import sys; " + LOADER, f"{refused}/t"],
    }[command]
    done = subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=120)
    last = done.stderr.strip().splitlines()[-1]
    assert done.returncode != 0 and "permission denied" in last and f"{refused}/t" in last, (
        done.stderr
    )
    if command != "loader":
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_a_rerun_bundle_on_gcs_writes_its_shard_once_under_its_final_name(
    inputs, gcs, tmp_path, monkeypatch
):
    """Runners re-run bundles: each shard is written twice (straight to its final name on a new
    gs:// output); the output equals the plain run's, and nothing is left beside it."""
    from test_reliability import _flaky_write_class, _Twice

    import pileshuffle.engine.transforms.write as write

    local_in, remote_in = inputs["tfrecord"]
    run_shuffle(local_in, str(tmp_path / "t"), "--num_piles=4", "--seed=9")
    _Twice.seen.clear()
    monkeypatch.setattr(write, "WriteShard", _flaky_write_class())
    run_shuffle(remote_in, f"{gcs}/t", "--num_piles=4", "--seed=9")
    assert sum(len(piles) for _, piles in _Twice.seen) == 4  # every pile's shard written twice
    assert gs_shard_bytes(f"{gcs}/t") == shard_bytes(str(tmp_path / "t"))
    assert len(storage.match(f"{gcs}/**")) == 5  # 4 shards and the manifest


def test_a_caller_with_only_object_permissions_runs_verifies_and_reads(gcs_root, tmp_path):
    """roles/storage.objectAdmin has no storage.buckets.get: the first contact with a bucket asks
    at object level, so a refused bucket GET (the emulator refuses it on buckets named
    ``objects-only``) stops nothing; the bytes equal a local run's."""
    if not os.environ.get("STORAGE_EMULATOR_HOST"):
        pytest.skip("only on the emulator: it injects the refusal")
    import gcs_emulator
    from google.cloud import storage as gcs_client

    bucket = f"pileshuffle-{gcs_emulator.OBJECTS_ONLY}-{uuid.uuid4().hex[:6]}"
    gcs_client.Client.create_anonymous_client().create_bucket(bucket, project="test")
    root = f"gs://{bucket}"
    local = sample.write_jsonl(str(tmp_path / "in"), records=300, files=2)
    sample.write_jsonl(f"{root}/in", records=300, files=2)
    # a first run (nothing at the output yet), then a re-run over it
    for args in (
        [],
        ["--overwrite"],
    ):
        done = cli(
            "run",
            f"--input={root}/in/*.jsonl",
            f"--output={root}/out/t",
            "--num_piles=3",
            "--seed=4",
            *args,
        )
        assert done.returncode == 0, done.stderr
    run_shuffle(",".join(local), str(tmp_path / "out" / "t"), "--num_piles=3", "--seed=4")
    assert gs_shard_bytes(f"{root}/out/t") == shard_bytes(str(tmp_path / "out" / "t"))
    verified = cli("verify", f"--input={root}/in/*.jsonl", f"--output={root}/out/t")
    assert verified.returncode == 0, verified.stderr
    read = subprocess.run(
        [sys.executable, "-c", "import sys; " + LOADER, f"{root}/out/t"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert read.returncode == 0 and read.stdout.strip() == "300", read.stderr


def test_a_dedup_store_on_gcs_equals_the_local_one(gcs, tmp_path):
    """A dedup store's copies files written, listed and read on gs://: the same window, bytes and counts."""
    from test_store_dedup import distinct, window_records, write_generation

    from pileshuffle.commands import append as append_command
    from pileshuffle.store import layout
    from pileshuffle.store.expire import expire
    from pileshuffle.store.read import check_store

    found = {}
    for where in (str(tmp_path / "s"), f"{gcs}/ds"):
        patterns = []
        for g in (0, 1):
            local = write_generation(str(tmp_path / "in"), g)
            if where.startswith("gs://"):
                for n in (0, 1):
                    with storage.open_write(
                        f"{gcs}/dedup-in/g{g}-{n}.jsonl", "uncompressed"
                    ) as handle:
                        handle.write(open(str(tmp_path / "in" / f"g{g}-{n}.jsonl"), "rb").read())
                local = f"{gcs}/dedup-in/g{g}-*.jsonl"
            patterns.append(local)
        run_shuffle(
            patterns[0], where, "--layout=store", "--dedup=exact", "--num_piles=3", "--seed=4"
        )
        append_command.append([f"--store={where}", f"--input={patterns[1]}", *FAST])
        assert check_store(where)[0] == []
        both = window_records(where)
        expire(where, keep_generations=1, grace_seconds=0)
        found[where] = (both, window_records(where), layout.read_store_manifest(where)["totals"])
    local, remote = found.values()
    assert remote == local and set(local[0]) == distinct([0, 1]) and set(local[1]) == distinct([1])
    assert local[2]["distinct"] == 700
