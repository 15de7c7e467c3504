"""`pileshuffle verify`: passes on good output of every format, and finds each kind of
damage (lost, duplicated or altered records, broken shards, incomplete names, a manifest
that does not match the files)."""

import glob
import json
import os
import shutil
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import assert_verified, frame_starts, run_shuffle, shards

from pileshuffle.commands import sample
from pileshuffle.commands.verify import main as verify_main
from pileshuffle.commands.verify import verify
from pileshuffle.formats.tfrecord import frame


@pytest.fixture(scope="module")
def good_run(tmp_path_factory):
    """One real TFRecord run; tests damage copies of it."""
    root = tmp_path_factory.mktemp("verify")
    sample.write_tfrecord(str(root / "in"), records=2000, files=2, record_bytes=60, vary=True)
    run_shuffle(
        str(root / "in" / "*.tfrecord"), str(root / "out" / "train"), "--num_piles=4", "--seed=3"
    )
    return root


@pytest.fixture
def run_copy(good_run, tmp_path):
    shutil.copytree(good_run / "in", tmp_path / "in")
    shutil.copytree(good_run / "out", tmp_path / "out")
    return str(tmp_path / "in" / "*.tfrecord"), str(tmp_path / "out" / "train")


def written_before_checksums(output):
    """The output as a 1.1 run wrote it (no CRC32C per shard): verify's checks of what a shard holds
    then find the damage the CRC32C finds first in a 1.2 output (tests/test_integrity.py)."""

    def strip(found):
        found["format_version"] = "1.1"
        for entry in found["shards"]:
            del entry["crc32c"]

    rewrite_manifest(output, strip)
    return output


def one_problem(problems, *words):
    assert problems, "verify found nothing wrong"
    text = "\n".join(problems)
    for word in words:
        assert word in text, f"{word!r} not in:\n{text}"
    return text


def rewrite_manifest(output, change):
    path = f"{output}-manifest.json"
    found = json.load(open(path))
    change(found)
    json.dump(found, open(path, "w"))


@pytest.mark.parametrize(
    "fmt, extra",
    [
        ("tfrecord", []),
        ("tfrecord", ["--compression=gzip"]),
        ("jsonl", []),
        ("parquet", []),
        ("parquet", ["--compression=zstd"]),
    ],
)
def test_verify_passes_on_good_output_of_every_format(tmp_path, fmt, extra, capsys):
    paths = sample.WRITERS[fmt](str(tmp_path / "in"), records=1500, files=3, record_bytes=70)
    pattern = str(tmp_path / "in" / f"*{os.path.splitext(paths[0])[1]}")
    output = str(tmp_path / "out" / "train")
    run_shuffle(pattern, output, f"--format={fmt}", "--num_piles=3", *extra)
    assert_verified(pattern, output)
    assert verify_main(["--input", pattern, "--output", output]) == 0
    assert "OK: 1,500 records in 3 shard(s)" in capsys.readouterr().out


def test_verify_needs_no_input_to_check_the_output(run_copy, capsys):
    _, output = run_copy
    assert verify(None, output) == []
    assert verify_main(["--output", output]) == 0
    assert "input not re-read" in capsys.readouterr().out


def test_a_missing_shard(run_copy):
    pattern, output = run_copy
    gone = shards(output)[2]
    os.remove(gone)
    one_problem(verify(pattern, output), f"shard {gone} is missing", "the shards present hold")


def test_a_shard_of_another_run_and_a_temp_file(run_copy):
    pattern, output = run_copy
    shutil.copy(shards(output)[0], f"{output}-00000-of-00008.tfrecord")
    shutil.copy(shards(output)[0], f"{output}-00001-of-00004.tfrecord.tmp-abc")
    text = one_problem(
        verify(pattern, output), "shard of another run (of 8, not of 4)", "unexpected file"
    )
    assert "tmp-abc" in text


def test_a_flipped_byte_in_a_shard_fails_its_crc(run_copy):
    pattern, output = run_copy
    written_before_checksums(output)
    path = shards(output)[1]
    data = bytearray(open(path, "rb").read())
    starts = frame_starts(bytes(data))
    data[starts[5] + 20] ^= 0x40
    open(path, "wb").write(data)
    one_problem(
        verify(pattern, output),
        f"shard {path} is damaged",
        f"byte offset {starts[5]}",
        "fails its CRC",
    )


def test_a_truncated_shard(run_copy):
    pattern, output = run_copy
    written_before_checksums(output)
    path = shards(output)[3]
    data = open(path, "rb").read()
    open(path, "wb").write(data[:-7])
    one_problem(verify(pattern, output), f"shard {path} is damaged", "truncated record")


def test_a_record_replaced_by_another_valid_record(run_copy):
    """Same count, same bytes, every CRC valid: only the fingerprint can tell."""
    pattern, output = run_copy
    written_before_checksums(output)
    path = shards(output)[0]
    data = open(path, "rb").read()
    starts = frame_starts(data) + [len(data)]
    first = data[starts[0] + 12 : starts[1] - 4]
    altered = frame(first[:-1] + bytes([first[-1] ^ 1]))
    open(path, "wb").write(altered + data[starts[1] :])
    text = one_problem(verify(pattern, output), "output fingerprint")
    assert "the same count but different records" in text


def test_a_duplicated_record_in_place_of_a_lost_one(run_copy):
    pattern, output = run_copy
    written_before_checksums(output)
    path = shards(output)[0]
    data = open(path, "rb").read()
    starts = frame_starts(data) + [len(data)]
    first = data[starts[0] : starts[1]]
    second = data[starts[1] : starts[2]]
    if len(first) != len(second):  # keep the file size: find two records of one length
        by_length = {}
        for a, b in zip(starts[:-1], starts[1:]):
            by_length.setdefault(b - a, []).append(a)
        a, b = next(v[:2] for v in by_length.values() if len(v) >= 2)
        size = next(k for k, v in by_length.items() if a in v)
        data = data[:b] + data[a : a + size] + data[b + size :]
    else:
        data = first + first + data[starts[2] :]
    open(path, "wb").write(data)
    one_problem(verify(pattern, output), "output fingerprint")


def test_manifest_counts_that_do_not_match_the_files(run_copy):
    pattern, output = run_copy

    def change(found):
        found["shards"][1]["records"] += 1
        found["shards"][2]["bytes"] -= 1
        found["totals"]["records"] += 5

    rewrite_manifest(output, change)
    text = one_problem(verify(pattern, output), "the manifest says", "the manifest's total is")
    assert shards(output)[1] in text and shards(output)[2] in text


def test_no_manifest_means_the_run_did_not_finish(run_copy):
    pattern, output = run_copy
    os.remove(f"{output}-manifest.json")
    one_problem(verify(pattern, output), "no manifest", "did not finish")


def test_changed_input(run_copy):
    pattern, output = run_copy
    first = sorted(glob.glob(pattern))[0]
    with open(first, "ab") as handle:
        handle.write(frame(b"one more record"))
    one_problem(
        verify(pattern, output), "the input now reads as", "1 record(s) more than the run read"
    )


def test_parquet_shard_with_another_schema_and_a_broken_parquet_shard(tmp_path, parquet_input):
    output = str(tmp_path / "out" / "train")
    run_shuffle(parquet_input, output, "--format=parquet", "--num_piles=3")
    assert_verified(parquet_input, output)
    written_before_checksums(output)
    first, second = shards(output)[:2]
    table = pq.read_table(first)
    pq.write_table(table.set_column(1, "label", table.column("label").cast(pa.int64())), first)
    open(second, "wb").write(b"PAR1 but not really")
    text = one_problem(
        verify(parquet_input, output), f"shard {first}: its schema", f"shard {second} is damaged"
    )
    assert "not a Parquet file" in text


def test_cli_exit_codes_and_one_line_per_problem(run_copy):
    pattern, output = run_copy
    command = [
        sys.executable,
        "-m",
        "pileshuffle",
        "verify",
        "--input",
        pattern,
        "--output",
        output,
    ]
    good = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert good.returncode == 0, good.stderr
    assert good.stdout.startswith("pileshuffle verify: OK: 2,000 records in 4 shard(s)")
    gone = shards(output)[0]
    os.remove(gone)
    bad = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1
    lines = bad.stderr.strip().splitlines()
    assert all(line.startswith("pileshuffle verify: ") for line in lines), bad.stderr
    assert any(f"{gone} is missing" in line for line in lines)
    assert "Traceback" not in bad.stderr
