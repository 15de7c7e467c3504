"""Every whole-object read returns the whole object (issue 54). Beam's gzip reader gives the first
16 MiB from a ``read()`` without a size, and ``verify`` once hashed that prefix of every gzip
shard. Here gzip shards of every format whose contents pass 16 MiB (20 MB) and 64 MiB (100 MB),
Parquet shards (gzip pages) of those sizes, a pile store file past 64 MiB and a manifest past
16 MiB are read by ``verify``, ``info``, the loader (and its cache), ``quality`` and stores, on a
local disk and on gs:// (the emulator), and a byte flipped past the first 16 MiB is still named.
Records are 64 KiB of one letter behind their index: cheap to write and to gzip, so the time
goes to the bytes read."""

import gzip
import io
import json
import os
import tarfile
import uuid

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import run_shuffle

from pileshuffle import names
from pileshuffle.commands import sample
from pileshuffle.formats.tfrecord import frame
from pileshuffle.io import storage
from pileshuffle.io.arrow_backend import arrow_filesystem

MIB = 2**20
RECORD = 64 * 1024  # each record's payload: the index in 12 digits, "|", then filler
SIZES = {"20MB": 20 * 10**6, "100MB": 100 * 10**6}  # contents: past 16 MiB, past 64 MiB
FORMATS = ["tfrecord", "jsonl", "tar", "parquet"]
PLACES = ["local", "gs"]
JSON_AROUND = b'{"text": ""}'  # a JSONL line around its payload (the loader drops the newline)


def payload(index: int) -> bytes:
    return b"%012d|" % index + b"a" * (RECORD - 13)


def json_line(index: int) -> bytes:
    return JSON_AROUND[:-2] + payload(index) + JSON_AROUND[-2:] + b"\n"


def gs_folder(request, name: str) -> str:
    """A fresh folder on the emulator (started on first use)."""
    return f"{request.getfixturevalue('gcs_root')}/{name}-{uuid.uuid4().hex[:8]}"


def write_input(fmt: str, directory: str, records: int) -> str:
    """One input file of ``records`` records of ``fmt``; its pattern. Parquet's payloads are
    random bytes, so that its gzip pages keep the file as large as its contents."""
    os.makedirs(directory)
    path = os.path.join(directory, f"part-000.{fmt}")
    if fmt == "parquet":
        blobs = np.random.default_rng(records).bytes(records * RECORD)
        pq.write_table(
            pa.table(
                {
                    "index": np.arange(records),
                    "blob": [blobs[i * RECORD : (i + 1) * RECORD] for i in range(records)],
                }
            ),
            path,
            compression="none",
        )
        return path
    with open(path, "wb") as out:
        if fmt == "tar":
            with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as archive:
                for i in range(records):
                    info = tarfile.TarInfo(f"{i:09d}.bin")
                    info.size = RECORD
                    archive.addfile(info, io.BytesIO(payload(i)))
            return path
        for i in range(records):
            out.write(frame(payload(i)) if fmt == "tfrecord" else json_line(i))
    return path


def records_of(size: str) -> int:
    return SIZES[size] // RECORD


def made_outputs(root: str, tmp_path_factory):
    """A function ``(fmt, size) -> (input pattern, output prefix)``: a real gzip run (Parquet:
    gzip pages) of one pile under ``root``, made on first use and kept for the module."""
    made = {}

    def output(fmt: str, size: str):
        if (fmt, size) not in made:
            folder = tmp_path_factory.mktemp(f"{fmt}-{size}")
            pattern = write_input(fmt, str(folder / "in"), records_of(size))
            prefix = storage.join(root, f"{fmt}-{size}", "data")
            run_shuffle(
                pattern,
                prefix,
                f"--format={fmt}",
                "--compression=gzip",
                "--num_piles=1",
                "--seed=3",
            )
            made[fmt, size] = pattern, prefix
        return made[fmt, size]

    return output


@pytest.fixture(scope="module")
def local_outputs(tmp_path_factory):
    return made_outputs(str(tmp_path_factory.mktemp("out")), tmp_path_factory)


@pytest.fixture(scope="module")
def gs_outputs(gcs_root, tmp_path_factory):
    return made_outputs(f"{gcs_root}/whole-reads-{uuid.uuid4().hex[:8]}", tmp_path_factory)


def outputs(request, place: str):
    return request.getfixturevalue(f"{place}_outputs")


def manifest_of(prefix: str) -> dict:
    return storage.read_json(names.manifest_path(prefix))


def assert_every_record(prefix: str, records: int, length: int, cache_dir: str = None):
    """The loader delivers records 0..records-1 once each, each ``length`` bytes long (read where
    they are, and through ``cache_dir`` when given)."""
    from pileshuffle.loader import ShuffledDataset

    for cache in (None, cache_dir) if cache_dir else (None,):
        found = [index_and_length(r) for r in ShuffledDataset(prefix, seed=1, cache_dir=cache)]
        assert sorted(i for i, _ in found) == list(range(records))
        assert {n for _, n in found} == {length}


def remote_cache(place: str, tmp_path) -> str:
    """A loader cache folder for a remote output (whole objects copied in), None for a local one."""
    return str(tmp_path / "cache") if place == "gs" else None


def index_and_length(record):
    """A delivered record's input index and the length of its payload (or line)."""
    if isinstance(record, dict):
        data = record.get("bin", record.get("blob"))
        return int(record.get("__key__", record.get("index"))), len(data)
    data = bytes(record)
    if data.startswith(b'{"text": "'):
        return int(data[10:22]), len(data)
    return int(data[:12]), len(data)


# -- the storage layer -----------------------------------------------------------------------------


def blob_contents(size: str) -> bytes:
    """``size``'s bytes, each MiB numbered: a short or repeated read differs."""
    return b"".join(b"%08d" % i + b"b" * (MIB - 8) for i in range(-(-SIZES[size] // MIB)))


@pytest.fixture(scope="module")
def blobs(tmp_path_factory):
    """A function ``(place, kind, size, request) -> path`` of a file of ``blob_contents(size)``,
    plain or gzip, local or on gs://, written on first use."""
    root, made = tmp_path_factory.mktemp("blobs"), {}

    def blob(place: str, kind: str, size: str, request):
        if (place, kind, size) not in made:
            folder = str(root) if place == "local" else gs_folder(request, "blobs")
            path = storage.join(folder, f"{size}.bin" + (".gz" if kind == "gzip" else ""))
            contents = blob_contents(size)
            storage.write_whole(path, gzip.compress(contents, 1) if kind == "gzip" else contents)
            made[place, kind, size] = path
        return made[place, kind, size]

    return blob


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("kind", ["gzip", "plain"])
@pytest.mark.parametrize("place", PLACES)
@pytest.mark.parametrize("backend", ["beam", "arrow"])
def test_read_buffer_returns_every_byte(blobs, request, monkeypatch, backend, place, kind, size):
    """Through Beam's file layer and through pyarrow.fs (and with a pyarrow FileSystem handed in,
    as the loader does): the whole contents, decompressed for .gz."""
    path, contents = blobs(place, kind, size, request), blob_contents(size)
    monkeypatch.setenv("PILESHUFFLE_STORAGE", backend)
    read = storage.read_buffer(path)
    assert read.size == len(contents) and read.equals(pa.py_buffer(contents))
    if backend == "arrow":
        fs, where = arrow_filesystem(path)
        assert storage.read_buffer(where, fs).equals(pa.py_buffer(contents))


# -- verify, the loader and quality on shard outputs -----------------------------------------------

CASES = [(place, fmt, size) for place in PLACES for fmt in FORMATS for size in SIZES]


# Every case as `pileshuffle verify` reads: through pyarrow's file layer (it imports no Beam),
# one download of each shard (``held_bytes``).
VERIFY_CASES = [("arrow", place, fmt, size) for place, fmt, size in CASES]


@pytest.mark.parametrize("backend, place, fmt, size", VERIFY_CASES)
def test_verify_passes_on_whole_shards(request, monkeypatch, backend, place, fmt, size):
    from pileshuffle.commands.verify import verify

    pattern, prefix = outputs(request, place)(fmt, size)
    (shard,) = manifest_of(prefix)["shards"]
    assert manifest_of(prefix)["totals"]["payload_bytes"] > SIZES[size] * 0.99
    assert shard["path"].endswith(".gz") == (fmt != "parquet")
    monkeypatch.setenv("PILESHUFFLE_STORAGE", backend)
    assert verify(pattern, prefix) == []  # the shard's CRC32C, its records against the input


# The same emulator artefact: the loader reads gs:// Parquet in tests/test_gcs.py only.
LOADER_CASES = [case for case in CASES if case[:2] != ("gs", "parquet")]


@pytest.mark.parametrize("place, fmt, size", LOADER_CASES)
def test_the_loader_delivers_every_record_whole(request, tmp_path, place, fmt, size):
    prefix = outputs(request, place)(fmt, size)[1]
    length = RECORD + (len(JSON_AROUND) if fmt == "jsonl" else 0)
    assert_every_record(prefix, records_of(size), length, remote_cache(place, tmp_path))


# As `pileshuffle quality` reads: through pyarrow, each shard in one download (``locate.scan``).
QUALITY_CASES = [("arrow", place, fmt) for place, fmt, size in CASES if size == "100MB"]


@pytest.mark.parametrize("backend, place, fmt", QUALITY_CASES)
def test_quality_locates_every_record(request, capsys, monkeypatch, backend, place, fmt):
    from pileshuffle.commands.quality import main as quality

    pattern, prefix = outputs(request, place)(fmt, "100MB")
    monkeypatch.setenv("PILESHUFFLE_STORAGE", backend)  # `pileshuffle quality` imports no Beam
    capsys.readouterr()
    assert quality([f"--input={pattern}", f"--output={prefix}"]) == 0, capsys.readouterr().err
    records = f"{records_of('100MB'):,}"
    said = capsys.readouterr().out
    assert f"pileshuffle quality: {records} records, {records} located by hash" in said


# -- a byte flipped past the first 16 MiB ----------------------------------------------------------


def flipped_copy(prefix: str, copy: str) -> str:
    """A copy of the one-shard output at ``prefix`` under ``copy`` with one byte of its contents
    (a .gz shard's decompressed contents, then gzipped again; else the file's) changed past the
    first 16 MiB; the copy's shard path."""
    manifest = manifest_of(prefix)
    shard = manifest["shards"][0]["path"]
    fs, where = arrow_filesystem(shard)  # read apart from storage.read_buffer, under test
    with fs.open_input_stream(where, compression=None) as stream:
        data = gzip.decompress(stream.read()) if shard.endswith(".gz") else stream.read()
    where = data.index(b"aaaa", 16 * MIB + 4321) if shard.endswith(".gz") else 16 * MIB + 4321
    data = data[:where] + bytes([data[where] ^ 0x03]) + data[where + 1 :]
    copied = storage.join(storage.split(copy)[0], storage.split(shard)[1])  # both prefixes: "data"
    storage.write_whole(copied, gzip.compress(data, 1) if shard.endswith(".gz") else data)
    manifest["shards"][0]["path"] = copied
    storage.write_whole(names.manifest_path(copy), json.dumps(manifest).encode())
    return copied


@pytest.mark.parametrize("place, fmt", [(place, fmt) for place in PLACES for fmt in FORMATS])
def test_a_byte_flipped_past_16_MiB_is_named(request, capsys, place, fmt):
    from pileshuffle.commands.verify import main as verify

    prefix = outputs(request, place)(fmt, "20MB")[1]
    copy = storage.join(storage.split(prefix)[0] + "-flipped", "data")
    shard = flipped_copy(prefix, copy)
    capsys.readouterr()
    assert verify([f"--output={copy}"]) == 1
    said = capsys.readouterr()
    assert shard in said.err + said.out


# -- a pile store of one data file past 64 MiB -----------------------------------------------------


@pytest.mark.parametrize("place", PLACES)
def test_a_store_file_past_64_MiB_is_read_whole(request, tmp_path, capsys, place):
    """``verify`` (each file's bytes and records), ``info``, the loader (on gs:// through its
    cache too) and ``quality`` read the store's one data file whole."""
    from pileshuffle.commands.info import describe
    from pileshuffle.commands.quality import main as quality
    from pileshuffle.commands.verify import verify
    from pileshuffle.store import layout

    pattern = write_input("jsonl", str(tmp_path / "in"), records_of("100MB"))
    prefix = storage.join(
        str(tmp_path) if place == "local" else gs_folder(request, "store"), "data"
    )
    run_shuffle(pattern, prefix, "--layout=store", "--num_piles=1", "--seed=3")
    (generation,) = layout.read_store_manifest(layout.store_prefix(prefix))["generations"]
    assert [f["bytes"] > 64 * MIB for f in generation["files"]] == [True]
    assert verify(pattern, prefix) == []
    records = records_of("100MB")
    assert describe(prefix)["records"].startswith(f"{records:,} ")
    assert_every_record(prefix, records, RECORD + len(JSON_AROUND), remote_cache(place, tmp_path))
    if place == "gs":  # the cache holds the file, every byte
        cached = [entry.stat().st_size for entry in os.scandir(remote_cache(place, tmp_path))]
        assert generation["files"][0]["bytes"] in cached
    capsys.readouterr()
    assert quality([f"--input={pattern}", f"--output={prefix}"]) == 0, capsys.readouterr().err
    assert f"{records:,} records, {records:,} located by hash" in capsys.readouterr().out


# -- a manifest past 16 MiB ------------------------------------------------------------------------


@pytest.mark.parametrize("place", PLACES)
def test_a_manifest_past_16_MiB_is_read_whole(request, tmp_path, place):
    """A manifest of ~100,000 shards passes 16 MiB: ``info``, ``verify``, the loader and the
    input check that leaves a finished output's manifest out of ``--input`` read it whole
    (here a small run's manifest, padded with 17 MiB of JSON whitespace)."""
    from pileshuffle.commands.info import describe
    from pileshuffle.commands.verify import verify
    from pileshuffle.engine.inputs import own_file
    from pileshuffle.loader import ShuffledDataset

    root = str(tmp_path) if place == "local" else gs_folder(request, "manifest")
    sample.write_tfrecord(str(tmp_path / "in"), records=300, files=1, record_bytes=50)
    pattern, prefix = str(tmp_path / "in" / "*.tfrecord"), storage.join(root, "data")
    run_shuffle(pattern, prefix, "--num_piles=2", "--seed=3")
    text = json.dumps(manifest_of(prefix))
    padded = text[:1] + " " * (17 * MIB) + text[1:]
    storage.write_whole(names.manifest_path(prefix), padded.encode())
    assert storage.size(names.manifest_path(prefix)) > 17 * MIB
    assert describe(prefix)["records"].startswith("300 in 2 shard(s)")
    assert verify(pattern, prefix) == []
    assert len(list(ShuffledDataset(prefix))) == 300
    assert own_file(names.manifest_path(prefix), None, []) == f"the manifest of {prefix}"
