"""Integrity on read, by file: every shard and store data file is listed in its manifest with its
CRC32C; the loader refuses a file with one byte flipped, naming it, and `pileshuffle verify`
names it once, whatever the format."""

import gzip
import json
import os
import shutil

import google_crc32c
import pytest
from helpers import run_shuffle, shards

from pileshuffle.commands import sample
from pileshuffle.commands.verify import main as verify_main
from pileshuffle.errors import InputError
from pileshuffle.loader import ShuffledDataset

CASES = [
    ("tfrecord", "none"),
    ("tfrecord", "gzip"),
    ("jsonl", "none"),
    ("jsonl", "gzip"),
    ("parquet", "snappy"),
    ("tar", "none"),
]


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    """One finished run per (format, compression), 3 shards each."""
    root = tmp_path_factory.mktemp("integrity")
    made = {}
    for fmt, compression in CASES:
        where = root / f"{fmt}-{compression}"
        sample.WRITERS[fmt](str(where / "in"), records=1500, files=2, record_bytes=150)
        run_shuffle(
            str(where / "in" / f"*.{fmt}"),
            str(where / "out" / "t"),
            f"--format={fmt}",
            "--num_piles=3",
            "--seed=4",
            f"--compression={compression}",
        )
        made[fmt, compression] = where
    return made


@pytest.fixture
def copy_of(outputs, tmp_path):
    def copy(case):
        shutil.copytree(outputs[case], tmp_path / "run")
        return str(tmp_path / "run" / "in" / f"*.{case[0]}"), str(tmp_path / "run" / "out" / "t")

    return copy


def manifest_of(prefix):
    with open(f"{prefix}-manifest.json") as handle:
        return json.load(handle)


def flip(path, offset):
    data = bytearray(open(path, "rb").read())
    data[offset] ^= 0x10
    open(path, "wb").write(bytes(data))


def epoch(prefix, **options):
    return sum(len(batch) for batch in ShuffledDataset(prefix, seed=1, **options).batches(64))


def verify_report(capsys, pattern, prefix):
    code = verify_main([f"--input={pattern}", f"--output={prefix}"])
    return code, capsys.readouterr().err


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(c))
def test_the_manifest_lists_each_shards_crc32c_of_what_a_reader_gets(outputs, case):
    prefix = str(outputs[case] / "out" / "t")
    manifest = manifest_of(prefix)
    assert manifest["format_version"] == "1.6"
    for entry, path in zip(manifest["shards"], shards(prefix)):
        data = open(path, "rb").read()
        # gzip's own CRC32 covers the stream
        readable = gzip.decompress(data) if path.endswith(".gz") else data
        assert entry["crc32c"] == f"{google_crc32c.value(readable):08x}", path


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(c))
def test_one_flipped_byte_is_refused_by_the_loader_and_named_once_by_verify(copy_of, case, capsys):
    pattern, prefix = copy_of(case)
    records = epoch(prefix)
    damaged = shards(prefix)[1]
    flip(damaged, os.path.getsize(damaged) // 2)
    # TFRecord: its frames' CRCs
    with pytest.raises(InputError, match="is damaged|corrupt record") as refused:
        # every epoch reads every shard; the damaged one is refused whichever comes first
        for shard in range(3):
            epoch(prefix)
    assert refused.value.path == damaged
    code, report = verify_report(capsys, pattern, prefix)
    assert code == 1
    failed = [line for line in report.splitlines() if "FAILED" in line]
    assert len(failed) == 1 and f"shard {damaged} is damaged" in failed[0], report
    assert "--format" not in report  # the hint fits the case: damage, not a wrong format
    assert "1 problem(s)" in report
    assert records == 1500


def test_a_parquet_footer_flipped_where_it_still_parses_is_refused(copy_of, capsys):
    """Parquet's pages carry no CRC of ours and its footer none at all: the shard's CRC32C proves both."""
    pattern, prefix = copy_of(("parquet", "snappy"))
    damaged = shards(prefix)[0]
    data = open(damaged, "rb").read()
    footer_start = len(data) - 8 - int.from_bytes(data[-8:-4], "little")
    # a column's name in the footer: it parses either way
    flip(damaged, data.index(b"payload", footer_start))
    with pytest.raises(InputError, match="is damaged") as refused:
        epoch(prefix)
    assert refused.value.path == damaged
    code, report = verify_report(capsys, pattern, prefix)
    assert code == 1 and report.count("FAILED") == 1 and f"shard {damaged} is damaged" in report


def test_a_damaged_parquet_page_is_refused_also_when_other_columns_are_read(copy_of):
    pattern, prefix = copy_of(("parquet", "snappy"))
    damaged = shards(prefix)[2]
    flip(damaged, os.path.getsize(damaged) // 2)  # in the payload column's pages
    with pytest.raises(InputError, match="is damaged"):
        epoch(prefix, columns=["index"])


def test_outputs_written_before_checksums_still_read_and_verify(copy_of, capsys):
    """A 1.1 manifest lists no crc32c: the loader and verify read it as before."""
    pattern, prefix = copy_of(("jsonl", "none"))
    manifest = manifest_of(prefix)
    manifest["format_version"] = "1.1"
    for entry in manifest["shards"]:
        del entry["crc32c"]
    json.dump(manifest, open(f"{prefix}-manifest.json", "w"))
    assert epoch(prefix) == 1500
    assert verify_report(capsys, pattern, prefix)[0] == 0


def test_a_store_data_file_flipped_is_refused_by_the_loader_and_named_by_verify(tmp_path, capsys):
    sample.write_tfrecord(str(tmp_path / "in"), records=1200, files=2, record_bytes=100)
    prefix = str(tmp_path / "s" / "train")
    run_shuffle(
        str(tmp_path / "in" / "*.tfrecord"), prefix, "--layout=store", "--num_piles=2", "--seed=5"
    )
    store = f"{prefix}-store"
    manifest = json.load(open(os.path.join(store, "manifest-00000001.json")))
    entry = manifest["generations"][0]["files"][0]
    path = os.path.join(store, entry["path"])
    assert entry["crc32c"] == f"{google_crc32c.value(open(path, 'rb').read()):08x}"
    assert epoch(prefix) == 1200
    flip(path, os.path.getsize(path) - 200)  # inside a record, far from the IPC framing
    with pytest.raises(InputError, match="is damaged") as refused:
        epoch(prefix)
    assert refused.value.path.endswith(entry["path"])
    assert verify_main([f"--output={prefix}"]) == 1
    report = capsys.readouterr().err
    assert report.count("FAILED") == 1 and f"store file {path} is damaged: its CRC32C" in report
