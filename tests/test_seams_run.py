"""Seams of `run`, `plan` and `verify` with their inputs and outputs (issue 19: A2, A3, A5, A7,
A8, A10 and the run-side traps of A14). Each test failed on the code before its fix."""

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import uuid

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import FAST, assert_verified, run_shuffle, shard_bytes, shards, temp_leftovers

from pileshuffle.commands import sample
from pileshuffle.errors import InputError, OutputError

PY = sys.executable


def cli(*args, cwd=None):
    return subprocess.run(
        [PY, "-m", "pileshuffle", *args], capture_output=True, text=True, timeout=300, cwd=cwd
    )


def contents(paths):
    return {str(p): open(p, "rb").read() for p in paths}


# --- A2: a run replaces only what a run's own records say it wrote --------------------------------


def test_a2_files_named_like_the_outputs_shards_that_no_run_wrote_are_refused_and_kept(tmp_path):
    data = tmp_path / "data"
    sample.write_jsonl(str(data), records=3000, files=1, record_bytes=60)
    theirs = [data / "train-00000-of-00002.jsonl", data / "train-00001-of-00002.jsonl"]
    sample.write_jsonl(str(tmp_path / "user"), records=2000, files=2, record_bytes=60)
    for made, path in zip(sorted((tmp_path / "user").iterdir()), theirs):
        shutil.move(str(made), path)
    before = contents(theirs)
    for extra in ([], ["--overwrite"]):
        with pytest.raises(
            OutputError, match=re.escape(str(theirs[0])) + ".*no pileshuffle run wrote it"
        ):
            run_shuffle(
                f"{data}/part-*.jsonl",
                str(data / "train"),
                "--format=jsonl",
                "--num_piles=2",
                *extra,
            )
        assert contents(theirs) == before
    # the user's files are also inputs: not left out and then deleted, refused
    with pytest.raises(OutputError, match=re.escape(str(theirs[0]))):
        run_shuffle(f"{data}/*.jsonl", str(data / "train"), "--format=jsonl", "--num_piles=2")
    assert contents(theirs) == before
    assert not os.path.exists(f"{data}/train-manifest.json") and temp_leftovers(str(data)) == []


def test_a2_overwrite_replaces_only_the_files_the_manifest_lists(tmp_path, tfrecord_input):
    output = str(tmp_path / "out" / "train")
    run_shuffle(tfrecord_input, output, "--num_piles=2", "--seed=1")
    finished = contents(shards(output))
    stranger = tmp_path / "out" / "train-00000-of-00003.tfrecord"
    stranger.write_bytes(b"someone else's file")
    with pytest.raises(OutputError, match=re.escape(str(stranger))):
        run_shuffle(tfrecord_input, output, "--num_piles=4", "--seed=1", "--overwrite")
    assert stranger.read_bytes() == b"someone else's file"
    assert contents(p for p in shards(output) if p != str(stranger)) == finished
    stranger.unlink()
    assert_verified(tfrecord_input, output)


def test_a2_a_publication_cut_short_is_finished_by_the_rerun_from_its_journal(
    tmp_path, tfrecord_input
):
    """What a run killed while renaming its shards leaves: its journal in the staging folder, some
    shards under final names (one half copied), no manifest. The re-run, with other piles and no
    --overwrite, deletes exactly those and publishes."""
    from pileshuffle.names import staging_dir

    output = str(tmp_path / "out" / "train")
    run_shuffle(tfrecord_input, output, "--num_piles=8", "--seed=2")
    killed = shards(output)
    os.remove(f"{output}-manifest.json")
    open(killed[3], "wb").write(b"half a shard")
    os.makedirs(staging_dir(output))
    with open(
        os.path.join(staging_dir(output), f"journal-{uuid.uuid4().hex[:12]}.json"), "w"
    ) as handle:
        json.dump({"creates": killed + [f"{output}-manifest.json"], "deletes": []}, handle)
    run_shuffle(tfrecord_input, output, "--num_piles=4", "--seed=2")
    assert [os.path.basename(p) for p in shards(output)] == [
        f"train-0000{i}-of-00004.tfrecord" for i in range(4)
    ]
    assert temp_leftovers(str(tmp_path / "out")) == []
    assert_verified(tfrecord_input, output)


# --- A3: one file named two ways is read once ------------------------------------------------------


def test_a3_one_file_named_two_ways_is_read_once(tmp_path, monkeypatch):
    from pileshuffle.commands.report import summary

    sample.write_tfrecord(str(tmp_path / "in"), records=5000, files=4, record_bytes=60)
    os.symlink(tmp_path / "in" / "part-002.tfrecord", tmp_path / "link.tfrecord")
    monkeypatch.chdir(tmp_path)
    named_twice = f"in/*,./in/part-000.tfrecord,{tmp_path}/in/part-001.tfrecord,link.tfrecord"
    result = run_shuffle(named_twice, "out/t", "--num_piles=3", "--seed=4")
    assert result["totals"]["records"] == 5000
    assert len(result["input_duplicates"]) == 3
    assert "duplicate 3 name(s) of files already matched, read once" in summary(result)
    plain = run_shuffle("in/*", "plain/t", "--num_piles=3", "--seed=4")
    assert shard_bytes("out/t") == shard_bytes("plain/t") and plain["input_duplicates"] == {}


# --- A5: a shard run does not hide a store -----------------------------------------------------------


def test_a5_a_shard_run_beside_a_store_is_refused(tmp_path, tfrecord_input):
    from pileshuffle.store import layout

    prefix = str(tmp_path / "p")
    run_shuffle(tfrecord_input, prefix, "--layout=store", "--num_piles=2")
    for extra in ([], ["--overwrite"]):
        with pytest.raises(OutputError, match=re.escape(f"{prefix}-store") + ".*would hide"):
            run_shuffle(tfrecord_input, prefix, "--num_piles=2", *extra)
    assert (
        shards(prefix) == []
        and not os.path.exists(f"{prefix}-manifest.json")
        and layout.is_store(prefix)
    )


# --- A7: the format follows the file names -----------------------------------------------------------


def test_a7_a_spark_folder_is_read_as_parquet_and_its_other_entries_are_counted(tmp_path):
    from pileshuffle.commands.report import summary

    folder = tmp_path / "spark"
    folder.mkdir()
    job = uuid.uuid4()
    for k, (start, count) in enumerate(((0, 700), (700, 800))):
        name = f"part-{k:05d}-{job}-c000.snappy.parquet"
        pq.write_table(sample.parquet_table(start, count, 60), folder / name)
        (folder / f".{name}.crc").write_bytes(b"crc")
    (folder / "_SUCCESS").touch()
    (folder / "_committed_4242").write_text("{}")
    (folder / "_started_4242").touch()
    (folder / "_temporary" / "0").mkdir(parents=True)
    os.symlink(folder / "gone.parquet", folder / "part-00002.snappy.parquet")
    output = str(tmp_path / "out" / "t")
    result = run_shuffle(f"{folder}/*", output, "--num_piles=2")
    assert result["format"] == "parquet" and result["totals"]["records"] == 1500
    skipped = result["inputs_skipped"]
    assert len(skipped) == 7, skipped
    assert skipped[str(folder / "_temporary")] == "a folder"
    assert skipped[str(folder / "part-00002.snappy.parquet")] == "a dangling symbolic link"
    assert "skipped   7 matched name(s) that are not input files:" in summary(result)
    assert_verified(f"{folder}/*", output)


def test_a7_mixed_extensions_are_refused_naming_two_files_and_format_overrides(tmp_path):
    sample.write_tfrecord(str(tmp_path / "in"), records=600, files=2, record_bytes=60)
    sample.write_jsonl(str(tmp_path / "in"), records=300, files=1, record_bytes=60, name="text")
    with pytest.raises(
        InputError, match=r"part-000\.tfrecord.*text-000\.jsonl|text-000\.jsonl.*part-000\.tfrecord"
    ):
        run_shuffle(f"{tmp_path}/in/*", str(tmp_path / "o" / "t"), "--num_piles=2")
    sample.write_jsonl(str(tmp_path / "txt"), records=300, files=2, record_bytes=60)
    for path in (tmp_path / "txt").iterdir():
        path.rename(path.with_suffix(".txt"))
    with pytest.raises(
        InputError, match=r"part-000\.txt: cannot tell its format from its name.*--format"
    ):
        run_shuffle(f"{tmp_path}/txt/*", str(tmp_path / "o" / "t"), "--num_piles=2")
    result = run_shuffle(
        f"{tmp_path}/txt/*", str(tmp_path / "o" / "t"), "--num_piles=2", "--format=jsonl"
    )
    assert result["format"] == "jsonl" and result["totals"]["records"] == 300


def test_a7_the_format_option_defaults_to_the_file_names():
    from pileshuffle.commands.metadata import template_metadata
    from pileshuffle.planning.template_parameters import PARAMETERS

    parameter = next(p for p in PARAMETERS if p.name == "format")
    assert parameter.default == "auto" and parameter.choices[0] == "auto"
    entry = next(p for p in template_metadata()["parameters"] if p["name"] == "format")
    assert entry["isOptional"] and "extension" in entry["helpText"]


# --- A8: binary input is not JSONL ---------------------------------------------------------------------


def test_a8_binary_input_given_as_jsonl_is_refused_naming_the_file_and_line(tmp_path):
    paths = sample.write_tfrecord(str(tmp_path / "tf"), records=300, files=2, record_bytes=60)
    with pytest.raises(
        InputError, match=re.escape(paths[0]) + r": line 1 is not text \(a NUL byte"
    ):
        run_shuffle(
            f"{tmp_path}/tf/*", str(tmp_path / "o" / "t"), "--format=jsonl", "--num_piles=2"
        )
    (tmp_path / "latin").mkdir()
    bad = tmp_path / "latin" / "a.jsonl"
    bad.write_bytes(b'{"a": 1}\n{"a": 2}\n{"name": "caf\xe9"}\n{"a": 4}\n')
    with pytest.raises(
        InputError, match=re.escape(str(bad)) + r": line 3 is not text \(invalid UTF-8"
    ):
        run_shuffle(str(bad), str(tmp_path / "o" / "t"), "--format=jsonl", "--num_piles=2")
    assert not os.path.exists(tmp_path / "o" / "t-manifest.json")


def test_a8_appending_jsonl_to_a_tfrecord_store_says_the_formats_differ(tmp_path, tfrecord_input):
    from pileshuffle.commands import append as append_command
    from pileshuffle.store import layout
    from pileshuffle.store.lock import lock_holder

    prefix = str(tmp_path / "s")
    run_shuffle(tfrecord_input, prefix, "--layout=store", "--num_piles=2")
    sample.write_jsonl(str(tmp_path / "day2"), records=200, files=1, record_bytes=60)
    with pytest.raises(
        InputError, match=r"part-000\.jsonl: is jsonl \(by its name\).*holds tfrecord"
    ):
        append_command.append([f"--store={prefix}", f"--input={tmp_path}/day2/*", *FAST])
    assert layout.read_store_manifest(prefix)["version"] == 1 and lock_holder(prefix) is None


# --- A10: one run per output at a time ----------------------------------------------------------------


def test_a10_a_second_run_to_the_same_output_is_refused_while_the_first_holds_the_lock(
    tmp_path, tfrecord_input
):
    output = str(tmp_path / "out" / "train")
    os.makedirs(tmp_path / "out")
    lock = f"{output}.pileshuffle-lock"
    holder = subprocess.Popen([PY, "-c", "import time; time.sleep(120)"])
    try:
        with open(lock, "w") as handle:
            json.dump(
                {
                    "command": "pileshuffle run --input a --output b",
                    "host": socket.gethostname(),
                    "pid": holder.pid,
                    "since": "2026-11-23T20:00:00.000000Z",
                    "token": "t",
                },
                handle,
            )
        done = cli("run", "--input", tfrecord_input, "--output", output, "--num_piles=2", *FAST)
        assert done.returncode == 2, done.stderr
        assert (
            f"output {output} is locked by a run started at 2026-11-23T20:00:00.000000Z (pid {holder.pid} on "
            f"{socket.gethostname()}: `pileshuffle run --input a --output b`)"
        ) in done.stderr
        assert shards(output) == [] and os.path.exists(lock)
    finally:
        holder.kill()
        holder.wait()
    run_shuffle(tfrecord_input, output, "--num_piles=2")  # its holder is gone: stale, taken over
    assert not os.path.exists(lock)
    # released when the run fails too
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "a.tfrecord").write_bytes(open(shards(output)[0], "rb").read()[:-3])
    with pytest.raises(InputError):
        run_shuffle(str(broken / "a.tfrecord"), str(tmp_path / "out" / "other"), "--num_piles=2")
    assert temp_leftovers(str(tmp_path / "out")) == []


# --- A14: smaller traps ------------------------------------------------------------------------------------


def test_a14_an_output_ending_in_a_slash_is_refused(tmp_path, tfrecord_input):
    with pytest.raises(OutputError, match=r"--output .*a3/: ends with '/'.*a3/train"):
        run_shuffle(tfrecord_input, f"{tmp_path}/a3/", "--num_piles=2")
    assert os.listdir(tmp_path) == ["in"]


def test_a14_input_paths_with_brackets_work_and_an_output_with_them_is_refused_with_the_reason(
    tmp_path,
):
    paths = sample.write_tfrecord(str(tmp_path / "in[1]"), records=900, files=3, record_bytes=60)
    output = str(tmp_path / "out" / "t")
    literal = ",".join(paths[:2])
    assert run_shuffle(literal, output, "--num_piles=2")["totals"]["records"] == 600
    assert_verified(literal, output)
    # no file matches the set [1]: the brackets are the name's
    pattern = str(tmp_path / "in[1]" / "*.tfrecord")
    assert run_shuffle(pattern, output, "--num_piles=3", "--overwrite")["totals"]["records"] == 900
    assert_verified(pattern, output)
    with pytest.raises(
        OutputError,
        match=r"--output .*t\[x\]: holds \[ \], which Beam's file systems take as wildcards",
    ):
        run_shuffle(pattern, str(tmp_path / "out" / "t[x]"), "--num_piles=2")
    assert sorted(os.listdir(tmp_path / "out")) == sorted(
        os.path.basename(p) for p in shards(output) + [f"{output}-manifest.json"]
    )


def test_a14_parquet_columns_in_another_order_are_named_not_dumped(tmp_path):
    table = sample.parquet_table(0, 200, 60)
    (tmp_path / "in").mkdir()
    pq.write_table(table, tmp_path / "in" / "a.parquet")
    pq.write_table(
        table.select(["label", "index", "weight", "name", "payload"]), tmp_path / "in" / "b.parquet"
    )
    with pytest.raises(InputError) as caught:
        run_shuffle(
            f"{tmp_path}/in/*", str(tmp_path / "o" / "t"), "--format=parquet", "--num_piles=2"
        )
    message = str(caught.value)
    assert "the same columns in another order: column 0 is 'label' here, 'index' there" in message
    # the paths' length is the test folder's, not the message's
    said = message.replace(str(tmp_path), "")
    assert "payload" not in said and len(said) < 250


def test_a14_verify_accepts_a_parquet_output_with_a_map_column(tmp_path):
    from pileshuffle.commands.verify import verify

    (tmp_path / "in").mkdir()
    table = pa.table(
        {
            "i": pa.array(range(1000)),
            "m": pa.array(
                [[("a", i), ("b", 2 * i)] for i in range(1000)],
                type=pa.map_(pa.string(), pa.int64()),
            ),
        }
    )
    pq.write_table(table, tmp_path / "in" / "a.parquet")
    output = str(tmp_path / "o" / "t")
    run_shuffle(f"{tmp_path}/in/*", output, "--format=parquet", "--num_piles=2")
    assert verify(f"{tmp_path}/in/*", output) == []


def test_a14_plan_only_reads_and_describes_a_store(tmp_path, tfrecord_input):
    from pileshuffle.names import staging_dir
    from pileshuffle.planning.locations import work_dir_for

    output = str(tmp_path / "out" / "train")
    leftovers = [
        os.path.join(work_dir_for(output, None), "fragments", "s000000-p00001.arrows"),
        os.path.join(staging_dir(output), "shard-00000-of-00002.tfrecord"),
    ]
    for path in leftovers:
        os.makedirs(os.path.dirname(path))
        open(path, "wb").write(b"a killed run's")
    done = cli("plan", "--input", tfrecord_input, "--output", output, "--num_piles=2")
    assert done.returncode == 0, done.stderr
    assert all(os.path.exists(p) for p in leftovers)
    store = cli(
        "plan", "--input", tfrecord_input, "--output", output, "--num_piles=2", "--layout=store"
    )
    assert store.returncode == 0, store.stderr
    assert (
        f"{output}-store/" in store.stdout
        and "-00000-of-" not in store.stdout
        and "staging" not in store.stdout
    )
    assert "generation 0" in store.stdout


def test_a_refused_run_and_a_refused_store_leave_no_folder_they_created(tmp_path):
    """Refused in pass 1 (weights naming a class the data lacks): the output's new folders go too;
    a folder that holds something stays, and a run that succeeds keeps its own."""
    (tmp_path / "in.jsonl").write_text('{"y": "a"}\n{"y": "b"}\n{"y": "a"}\n')
    bad = ["--label_field=y", "--balance=a=1,c=2", "--quiet"]
    for extra in ([], ["--layout=store"]):
        done = cli(
            "run",
            f"--input={tmp_path / 'in.jsonl'}",
            f"--output={tmp_path / 'new' / 'deep' / 't'}",
            *bad,
            *extra,
        )
        assert done.returncode == 2 and "no record of 'c'" in done.stderr, done.stderr
        assert sorted(os.listdir(tmp_path)) == ["in.jsonl"]
    (tmp_path / "kept").mkdir()
    (tmp_path / "kept" / "other").write_text("another run's")
    done = cli(
        "run", f"--input={tmp_path / 'in.jsonl'}", f"--output={tmp_path / 'kept' / 't'}", *bad
    )
    assert done.returncode == 2 and sorted(os.listdir(tmp_path / "kept")) == ["other"]
    done = cli(
        "run", f"--input={tmp_path / 'in.jsonl'}", f"--output={tmp_path / 'ok' / 't'}", "--quiet"
    )
    assert done.returncode == 0 and (tmp_path / "ok" / "t-manifest.json").exists(), done.stderr


@pytest.mark.parametrize(
    "column", ["_pileshuffle_key", "_pileshuffle_hash", "_pileshuffle_anything"]
)
@pytest.mark.parametrize("layout", ["shards", "store"])
def test_an_input_column_with_a_reserved_name_is_refused_naming_the_file(tmp_path, column, layout):
    """Pass 1 adds `_pileshuffle_key` and `_pileshuffle_hash` to every record. An input column of
    that name broke `run` with a Beam traceback, and `run --layout store` wrote a store that
    verify, materialize and the loader crashed on. Now both refuse it in one line before any
    write, naming the file and the column."""
    os.makedirs(tmp_path / "in")
    path = str(tmp_path / "in" / "part-0.parquet")
    pq.write_table(pa.table({"x": [1, 2, 3], column: [4, 5, 6]}), path)
    output = str(tmp_path / "out" / "data")
    done = cli(
        "run", f"--input={path}", f"--output={output}", "--num_piles=2", f"--layout={layout}", *FAST
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        f"pileshuffle: error: {path}: has a column named {column!r}: names starting '_pileshuffle_' are pileshuffle's own "
        "(each record's key and hash in the piles); rename it"
    )
    assert not os.path.exists(tmp_path / "out") or temp_leftovers(str(tmp_path / "out")) == []
    assert not glob_any(str(tmp_path / "out"))


def glob_any(directory):
    """Whatever a command left under ``directory`` (files only)."""
    return [os.path.join(r, n) for r, _, names in os.walk(directory) for n in names]
