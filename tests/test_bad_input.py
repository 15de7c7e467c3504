"""Bad input gets a clear one-line error naming the file (and, for TFRecord, the byte
offset of the bad record), and nothing is written under final names. ``--skip_corrupt``
skips bad records instead, counts them and reports them; without it nothing is skipped."""

import contextlib
import gzip
import os
import struct
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import (
    FAST,
    assert_nothing_published,
    assert_verified,
    frame_starts,
    manifest,
    output_payloads,
    run_shuffle,
    shards,
)

from pileshuffle.commands import sample
from pileshuffle.errors import InputError, OutputError, PileshuffleError
from pileshuffle.records.crc import masked_crc

RECORDS, FILES, RECORD_BYTES = 300, 3, 50


@pytest.fixture
def tfrecords(tmp_path):
    """Three valid TFRecord files of 100 records each; returns (glob, paths, output)."""
    paths = sample.write_tfrecord(
        str(tmp_path / "in"), records=RECORDS, files=FILES, record_bytes=RECORD_BYTES
    )
    return str(tmp_path / "in" / "*.tfrecord"), paths, str(tmp_path / "out" / "train")


def failing_run(input_glob, output, *args, error=InputError):
    """Run, expect one of our errors; returns it after checking nothing was published."""
    with pytest.raises(PileshuffleError) as caught:
        run_shuffle(input_glob, output, "--num_piles=4", *args)
    assert isinstance(caught.value, error), repr(caught.value)
    assert "\n" not in str(caught.value)
    assert_nothing_published(output)
    return caught.value


def rewrite(path, change):
    data = bytearray(open(path, "rb").read())
    result = change(data)
    open(path, "wb").write(result if result is not None else data)


# --- TFRecord: each kind of damage names the file and the offset of the bad record ---------


def test_tfrecord_corrupt_length_crc(tfrecords):
    pattern, paths, output = tfrecords
    at = frame_starts(open(paths[1], "rb").read())[17]
    rewrite(paths[1], lambda d: d.__setitem__(at + 9, d[at + 9] ^ 0x01))
    error = failing_run(pattern, output)
    assert (error.path, error.offset) == (paths[1], at)
    assert f"{paths[1]} at byte offset {at}: corrupt record: the length field fails its CRC" == str(
        error
    )


def test_tfrecord_corrupt_data_crc(tfrecords):
    pattern, paths, output = tfrecords
    at = frame_starts(open(paths[2], "rb").read())[42]
    rewrite(paths[2], lambda d: d.__setitem__(at + 12 + 20, d[at + 12 + 20] ^ 0x10))
    error = failing_run(pattern, output)
    assert (error.path, error.offset) == (paths[2], at)
    assert "the data (50 bytes) fails its CRC" in str(error)


def test_tfrecord_truncated_last_record(tfrecords):
    pattern, paths, output = tfrecords
    data = open(paths[0], "rb").read()
    at = frame_starts(data)[-1]
    open(paths[0], "wb").write(data[:-9])
    error = failing_run(pattern, output)
    assert (error.path, error.offset) == (paths[0], at)
    assert "truncated record: its header says 66 bytes but only 57 remain in the file" in str(error)


def test_tfrecord_truncated_inside_the_header(tfrecords):
    pattern, paths, output = tfrecords
    data = open(paths[0], "rb").read()
    at = frame_starts(data)[-1]
    open(paths[0], "wb").write(data[: at + 5])
    error = failing_run(pattern, output)
    assert (error.path, error.offset) == (paths[0], at)
    assert "5 bytes at the end of the file, too short for a header" in str(error)


def test_tfrecord_length_larger_than_the_rest_of_the_file(tfrecords):
    """A length field with a valid CRC that points past the end of the file: found at
    once, without buffering the rest of the file for a record that cannot be there."""
    pattern, paths, output = tfrecords
    data = bytearray(open(paths[1], "rb").read())
    at = frame_starts(bytes(data))[50]
    header = struct.pack("<Q", 10**9)
    data[at : at + 12] = header + struct.pack("<I", masked_crc(header))
    open(paths[1], "wb").write(data)
    error = failing_run(pattern, output)
    assert (error.path, error.offset) == (paths[1], at)
    assert f"its header says {10**9 + 16} bytes but only {len(data) - at} remain" in str(error)


def test_gz_file_that_is_not_gzip(tfrecords, tmp_path):
    pattern, paths, output = tfrecords
    for path in paths:
        os.rename(path, path + ".gz")  # plain TFRecord bytes under a .gz name
    error = failing_run(pattern + ".gz", output)
    assert error.path == paths[0] + ".gz"
    assert "is not a valid compressed stream" in str(error)


def test_truncated_gzip_is_not_silently_short(tfrecords):
    pattern, paths, output = tfrecords
    for path in paths:
        compressed = gzip.compress(open(path, "rb").read())
        open(path + ".gz", "wb").write(
            compressed if path != paths[2] else compressed[: len(compressed) // 2]
        )
        os.remove(path)
    error = failing_run(pattern + ".gz", output)
    assert error.path == paths[2] + ".gz"
    assert "truncated" in str(error)


# --- --skip_corrupt ----------------------------------------------------------------------


def damaged_file(path, count=120):
    """A TFRecord file with five kinds of damage; returns (indices of records lost, regions)."""
    payloads = sample.payloads(0, count, RECORD_BYTES)
    from pileshuffle.formats.tfrecord import frame

    frames = [bytearray(frame(p)) for p in payloads]
    frames[10][12 + 3] ^= 0x01  # data CRC fails
    frames[20][9] ^= 0x80  # length CRC fails
    frames[30] += bytes(range(7, 44))  # 37 garbage bytes after a good record
    huge = struct.pack("<Q", 1 << 40)
    frames[40][:12] = huge + struct.pack("<I", masked_crc(huge))  # a length past the end, valid CRC
    frames[-1] = frames[-1][:-5]  # truncated last record
    open(path, "wb").write(b"".join(frames))
    return {10, 20, 40, count - 1}, 5


def test_skip_corrupt_skips_resyncs_counts_and_reports(tmp_path, capsys):
    from pileshuffle.commands.report import summary

    os.makedirs(tmp_path / "in")
    lost, regions = damaged_file(str(tmp_path / "in" / "bad.tfrecord"))
    sample.write_tfrecord(
        str(tmp_path / "in"), records=50, files=1, record_bytes=RECORD_BYTES, name="good"
    )
    pattern, output = str(tmp_path / "in" / "*.tfrecord"), str(tmp_path / "out" / "train")

    failing_run(pattern, output)  # without --skip_corrupt nothing is skipped: the run fails
    result = run_shuffle(pattern, output, "--num_piles=4", "--skip_corrupt")

    expected = [p for i, p in enumerate(sample.payloads(0, 120, RECORD_BYTES)) if i not in lost]
    expected += sample.payloads(0, 50, RECORD_BYTES)
    assert sorted(output_payloads(output)) == sorted(expected)
    skipped = manifest(output)["skipped"]
    assert skipped["records"] == regions
    assert len(skipped["problems"]) == regions
    assert all("bad.tfrecord at byte offset" in p for p in skipped["problems"])
    assert f"skipped   {regions} corrupt record(s)" in summary(result)
    assert manifest(output)["totals"]["records"] == len(expected)
    assert_verified(pattern, output)


def test_skip_corrupt_with_nothing_left_is_an_error(tmp_path):
    os.makedirs(tmp_path / "in")
    (tmp_path / "in" / "noise.tfrecord").write_bytes(np.random.default_rng(1).bytes(5000))
    error = failing_run(
        str(tmp_path / "in" / "*.tfrecord"), str(tmp_path / "out" / "train"), "--skip_corrupt"
    )
    assert (
        "noise.tfrecord" in str(error)
        and "holds no records" in str(error)
        and "skipped" in str(error)
    )


# --- Parquet ------------------------------------------------------------------------------


def test_parquet_schemas_differ(tmp_path):
    paths = sample.write_parquet(str(tmp_path / "in"), records=300, files=2, record_bytes=60)
    table = pq.read_table(paths[1])
    table = table.set_column(1, "label", table.column("label").cast(pa.int64())).append_column(
        "extra", pa.array(range(table.num_rows))
    )
    pq.write_table(table, paths[1])
    error = failing_run(
        str(tmp_path / "in" / "*.parquet"), str(tmp_path / "out" / "train"), "--format=parquet"
    )
    assert error.path == paths[1] and paths[0] in str(error)
    assert "extra column 'extra'" in str(error) and "column 'label' is int64, not int32" in str(
        error
    )


def test_parquet_file_that_is_not_parquet(tmp_path):
    paths = sample.write_parquet(str(tmp_path / "in"), records=300, files=2, record_bytes=60)
    open(paths[0], "wb").write(b"name,label\nnot,parquet\n" * 20)
    error = failing_run(
        str(tmp_path / "in" / "*.parquet"), str(tmp_path / "out" / "train"), "--format=parquet"
    )
    assert error.path == paths[0] and "is not a Parquet file" in str(error)


def test_parquet_empty_file(tmp_path):
    paths = sample.write_parquet(str(tmp_path / "in"), records=300, files=2, record_bytes=60)
    open(paths[1], "wb").close()
    error = failing_run(
        str(tmp_path / "in" / "*.parquet"), str(tmp_path / "out" / "train"), "--format=parquet"
    )
    assert error.path == paths[1] and "is empty" in str(error)


# --- JSONL --------------------------------------------------------------------------------


def test_jsonl_binary_content_is_refused_naming_the_first_bad_line(tmp_path):
    """Binary bytes are not JSONL (issue 19, A8): the first line that is not UTF-8 text is named."""
    os.makedirs(tmp_path / "in")
    rng = np.random.default_rng(7)
    blob = b'{"a": 1}\n' + rng.bytes(20000) + b"\xff\xfe\x00 no newline at the end"
    (tmp_path / "in" / "binary.jsonl").write_bytes(blob)
    pattern, output = str(tmp_path / "in" / "*.jsonl"), str(tmp_path / "out" / "train")
    error = failing_run(pattern, output, "--format=jsonl")
    assert error.path == str(tmp_path / "in" / "binary.jsonl") and "line 2 is not text" in str(
        error
    )


def test_jsonl_empty_file_contributes_nothing(tmp_path, jsonl_input):
    directory = os.path.dirname(jsonl_input)
    open(os.path.join(directory, "empty.jsonl"), "wb").close()
    output = str(tmp_path / "out" / "train")
    run_shuffle(jsonl_input, output, "--format=jsonl", "--num_piles=3")
    assert manifest(output)["totals"]["records"] == 3000
    assert_verified(jsonl_input, output)


def test_all_inputs_empty_is_an_error(tmp_path):
    os.makedirs(tmp_path / "in")
    for name in ("a.jsonl", "b.jsonl"):
        open(tmp_path / "in" / name, "wb").close()
    error = failing_run(
        str(tmp_path / "in" / "*.jsonl"), str(tmp_path / "out" / "train"), "--format=jsonl"
    )
    assert "is empty: no records to shuffle" in str(error)


# --- paths --------------------------------------------------------------------------------


def test_missing_input_path(tmp_path):
    missing = str(tmp_path / "nowhere" / "data.tfrecord")
    error = failing_run(missing, str(tmp_path / "out" / "train"))
    assert str(error) == f"{missing}: does not exist"


def test_glob_matching_nothing(tfrecords):
    pattern, _, output = tfrecords
    error = failing_run(pattern.replace("*.tfrecord", "*.nothing"), output)
    assert str(error).endswith("*.nothing: matches no file")


def test_existing_output_needs_overwrite(tfrecords):
    pattern, _, output = tfrecords
    run_shuffle(pattern, output, "--num_piles=4", "--seed=1")
    before = {p: open(p, "rb").read() for p in shards(output)}
    with pytest.raises(
        OutputError,
        match=r"output already exists: .*train-00000-of-00004\.tfrecord \(pass --overwrite",
    ):
        run_shuffle(pattern, output, "--num_piles=4", "--seed=2")
    assert {p: open(p, "rb").read() for p in shards(output)} == before
    run_shuffle(pattern, output, "--num_piles=2", "--seed=2", "--overwrite")
    assert len(shards(output)) == 2
    assert_verified(pattern, output)


def test_output_under_a_regular_file_is_found_before_pass_1(tfrecords, tmp_path, monkeypatch):
    import pileshuffle.engine.transforms.graph as pipeline

    pattern, _, _ = tfrecords
    (tmp_path / "a-file").write_text("not a directory")
    output = str(tmp_path / "a-file" / "out" / "train")
    monkeypatch.setattr(pipeline, "build", lambda *a, **k: pytest.fail("the pipeline was built"))
    with pytest.raises(OutputError) as caught:
        run_shuffle(pattern, output, "--num_piles=4")
    assert f"cannot write to the output location {output}.pileshuffle-staging" in str(caught.value)
    assert (tmp_path / "a-file").read_text() == "not a directory"


@contextlib.contextmanager
def mounted_tmpfs(directory, options):
    os.makedirs(directory, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(directory)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:  # as root a refusal is a failure
        refused = pytest.fail if os.geteuid() == 0 else pytest.skip
        refused(f"mounting a tmpfs needs root and failed: {done.stderr.strip() or done.returncode}")
    try:
        yield str(directory)
    finally:
        subprocess.run(["umount", "-l", str(directory)], capture_output=True)


def test_read_only_output_location_is_found_before_pass_1(tfrecords, tmp_path, monkeypatch):
    import pileshuffle.engine.transforms.graph as pipeline

    pattern, _, _ = tfrecords
    with mounted_tmpfs(tmp_path / "ro", "ro,size=1m") as directory:
        output = os.path.join(directory, "train")
        monkeypatch.setattr(
            pipeline, "build", lambda *a, **k: pytest.fail("the pipeline was built")
        )
        with pytest.raises(OutputError) as caught:
            run_shuffle(pattern, output, "--num_piles=4")
        assert "cannot write to the output location" in str(caught.value) and directory in str(
            caught.value
        )
        assert "Read-only file system" in str(caught.value)
        assert os.listdir(directory) == []


# --- through the command line: one line, exit code 2, no traceback --------------------------


def cli(*args, timeout=240):
    return subprocess.run(
        [sys.executable, "-m", "pileshuffle", "run", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def assert_one_line_error(done, *words):
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and "RuntimeError" not in done.stderr, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("pileshuffle: error: ")]
    assert len(errors) == 1, done.stderr
    for word in words:
        assert word in errors[0], errors[0]
    assert "[while running" not in errors[0]
    return errors[0]


def test_a_quoted_tilde_names_the_home_folder_meant_and_makes_no_folder_named_tilde(
    tfrecords, tmp_path
):
    """A shell expands ``~`` only outside quotes: ``--output '~/out/t'`` made a folder named ``~``
    in the current one (and a later ``rm -rf ~`` of it is a disaster). Each location a run
    writes is refused naming the path meant, an input or a store that is not there says it too,
    and nothing is created."""
    pattern, paths, _ = tfrecords
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir(), work.mkdir()
    (home / "in").mkdir()
    os.link(paths[0], home / "in" / "a.tfrecord")

    def run(*args):
        return subprocess.run(
            [sys.executable, "-m", "pileshuffle", *args],
            capture_output=True,
            text=True,
            timeout=240,
            cwd=work,
            env={**os.environ, "HOME": str(home)},
        )

    # every command that writes shards or a store checks --output as run does (output_prefix)
    assert_one_line_error(
        run("run", f"--input={pattern}", "--output=~/out/t"), f"give {home}/out/t"
    )
    assert_one_line_error(
        run("run", f"--input={pattern}", "--output=out/t", "--temp_location=~/tmp"),
        f"give {home}/tmp",
    )
    assert_one_line_error(
        run("run", "--input=~/in/*.tfrecord", "--output=out/t"),
        "matches no file",
        f"give {home}/in/*.tfrecord",
    )
    # the store commands read --store: a store that is not there says which one was meant
    for command in (["append", f"--input={pattern}"], ["materialize", "--output=out/t"]):
        assert_one_line_error(
            run(*command, "--store=~/s"), "no store at ~/s-store", f"give {home}/s"
        )
    assert os.listdir(work) == [] and os.listdir(home) == ["in"]


@pytest.mark.parametrize("attempt", range(4))
def test_cli_corrupt_tfrecord_on_the_default_local_runner(tfrecords, attempt):
    """The default local runner runs bundles in worker threads that go on after one fails (here
    ~15 spans of 3 files, two at a time; 4 attempts): they start no write once the run failed and what they
    print is dropped, so every time the command says one line and leaves no file (before, 4 in 21
    such runs left a run's temp file behind)."""
    pattern, paths, output = tfrecords
    at = frame_starts(open(paths[1], "rb").read())[3]
    rewrite(paths[1], lambda d: d.__setitem__(at + 14, d[at + 14] ^ 0x04))
    done = cli(f"--input={pattern}", f"--output={output}", "--num_piles=4")
    assert_one_line_error(done, paths[1], f"byte offset {at}", "fails its CRC")
    assert_nothing_published(output)


def test_cli_path_errors(tfrecords, tmp_path):
    pattern, _, output = tfrecords
    missing = str(tmp_path / "missing" / "*.tfrecord")
    assert_one_line_error(
        cli(f"--input={missing}", f"--output={output}", *FAST), missing, "matches no file"
    )
    (tmp_path / "file").write_text("x")
    under_file = str(tmp_path / "file" / "train")
    assert_one_line_error(
        cli(f"--input={pattern}", f"--output={under_file}", *FAST), under_file, "cannot write"
    )


def test_cli_skip_corrupt_reports_in_the_summary(tmp_path):
    os.makedirs(tmp_path / "in")
    lost, regions = damaged_file(str(tmp_path / "in" / "bad.tfrecord"))
    pattern, output = str(tmp_path / "in" / "*.tfrecord"), str(tmp_path / "out" / "train")
    done = cli(f"--input={pattern}", f"--output={output}", "--num_piles=2", "--skip_corrupt", *FAST)
    assert done.returncode == 0, done.stderr
    assert f"skipped   {regions} corrupt record(s)" in done.stdout
    assert manifest(output)["totals"]["records"] == 120 - len(lost)
    assert_verified(pattern, output)
