"""Seams of the store commands and of the commands' values (issue 19: B11, B12, B13 and the store
traps of B14), run as a user runs them: ``pileshuffle.cli.main([...])`` in this process, its exit
code and its stderr. Each test failed on the code before its fix."""

import glob
import json
import os
import re

import pytest
from helpers import FAST, refused, run_shuffle, succeeded

from pileshuffle import names
from pileshuffle.cli import main as pileshuffle
from pileshuffle.commands import sample
from pileshuffle.store import layout


def jsonl_files(directory, records=600, files=2, seed=0, name="part"):
    sample.write_jsonl(
        str(directory), records=records, files=files, record_bytes=60, seed=seed, name=name
    )
    return sorted(glob.glob(os.path.join(str(directory), f"{name}-*.jsonl")))


def make_store(tmp_path, records=600, piles=3):
    """A one-generation JSONL store at ``tmp_path/s`` over ``tmp_path/in/*.jsonl``."""
    jsonl_files(tmp_path / "in", records)
    prefix = str(tmp_path / "s")
    run_shuffle(
        str(tmp_path / "in" / "*.jsonl"),
        prefix,
        "--format=jsonl",
        "--layout=store",
        f"--num_piles={piles}",
    )
    return prefix


def store_state(prefix):
    """What a refused command must leave alone: every file under the store and its bytes."""
    root = names.store_dir(prefix)
    return {
        os.path.relpath(p, root): open(p, "rb").read()
        for p in glob.glob(os.path.join(root, "**"), recursive=True)
        if os.path.isfile(p)
    }


def live_generations(prefix):
    return [g["generation"] for g in layout.read_store_manifest(prefix)["generations"]]


# --- B11: a store file deleted by hand -------------------------------------------------------------


def test_b11_a_missing_store_file_is_named_with_the_version_that_lists_it(tmp_path, capsys):
    prefix = make_store(tmp_path)
    succeeded(
        capsys,
        "append",
        f"--store={prefix}",
        f"--input={jsonl_files(tmp_path / 'more', 300, name='more')[0]}",
        *FAST,
    )
    gone = sorted(glob.glob(os.path.join(names.store_dir(prefix), "g000001", "*.arrows")))[0]
    os.remove(gone)
    version = names.store_manifest_name(2)
    output = str(tmp_path / "m" / "m")
    err = refused(capsys, "materialize", f"--store={prefix}", f"--output={output}", *FAST)
    assert gone in err and version in err and "generation 1" in err and "cannot write" not in err
    assert not glob.glob(f"{output}*"), "nothing of the output is written"
    err = refused(
        capsys,
        "quality",
        f"--input={tmp_path}/in/*.jsonl,{tmp_path}/more/*.jsonl",
        f"--output={prefix}",
        f"--report={tmp_path / 'report'}",
    )
    assert gone in err and version in err
    capsys.readouterr()
    assert pileshuffle(["verify", f"--output={prefix}"]) == 1
    err = capsys.readouterr().err
    assert f"store file {gone} is missing" in err
    assert re.search(r"damaged generation\(s\): 1\b", err) and "generation 0" not in err, err


# --- B12: append of files a live generation already holds ------------------------------------------


def test_b12_append_refuses_files_a_live_generation_holds_until_it_is_expired(
    tmp_path, capsys, monkeypatch
):
    prefix = make_store(tmp_path)
    first = sorted(glob.glob(str(tmp_path / "in" / "*.jsonl")))
    day1 = jsonl_files(tmp_path / "day1", 300, seed=1, name="day1")
    succeeded(capsys, "append", f"--store={prefix}", f"--input={tmp_path}/day1/*.jsonl", *FAST)
    os.symlink(first[1], tmp_path / "alias.jsonl")
    before = store_state(prefix)
    # one file of generation 0 under another name (a symlink), one of generation 1 by its absolute path
    both = f"{tmp_path / 'alias.jsonl'},{os.path.abspath(day1[0])}"
    err = refused(capsys, "append", f"--store={prefix}", f"--input={both}", *FAST)
    assert (
        "alias.jsonl" in err
        and "generation 0" in err
        and "day1-000.jsonl" in err
        and "generation 1" in err
    )
    assert "--allow_duplicate_inputs" in err
    # a relative name of a generation-0 file, from another directory
    monkeypatch.chdir(tmp_path / "in")
    err = refused(capsys, "append", "--store=../s", f"--input={os.path.basename(first[0])}", *FAST)
    assert "generation 0" in err
    assert store_state(prefix) == before, "a refused append changes nothing"
    # the rare user who means it
    succeeded(
        capsys,
        "append",
        f"--store={prefix}",
        f"--input={tmp_path / 'alias.jsonl'}",
        "--allow_duplicate_inputs",
        *FAST,
    )
    assert live_generations(prefix) == [0, 1, 2]
    assert layout.read_store_manifest(prefix)["totals"]["records"] == 600 + 300 + 300
    # the newest generation's inputs again stay a re-run (nothing to do), with the option too
    _, err = succeeded(
        capsys,
        "append",
        f"--store={prefix}",
        f"--input={tmp_path / 'alias.jsonl'}",
        "--allow_duplicate_inputs",
        *FAST,
    )
    assert "nothing to do" in err and live_generations(prefix) == [0, 1, 2]
    # once the generation that held them is expired, the files are new again
    succeeded(capsys, "expire", f"--store={prefix}", "--keep_generations=1")
    assert live_generations(prefix) == [2]
    succeeded(capsys, "append", f"--store={prefix}", f"--input={first[0]}", *FAST)
    assert live_generations(prefix) == [2, 3]


# --- B13: values that mean nothing ------------------------------------------------------------------


def test_b13_run_with_an_unknown_runner_is_one_line(tmp_path, capsys):
    jsonl_files(tmp_path / "in", 100)
    output = str(tmp_path / "out" / "o")
    err = refused(
        capsys,
        "run",
        f"--input={tmp_path}/in/*.jsonl",
        f"--output={output}",
        "--format=jsonl",
        "--runner",
        "FooRunner",
        option="--runner",
    )
    assert "FooRunner" in err and "DirectRunner" in err
    assert not os.path.exists(tmp_path / "out")
    refused(
        capsys,
        "append",
        f"--store={tmp_path / 's'}",
        f"--input={tmp_path}/in/*.jsonl",
        "--runner=FooRunner",
        option="--runner",
    )
    refused(
        capsys,
        "plan",
        f"--input={tmp_path}/in/*.jsonl",
        f"--output={output}",
        "--runner=no.such.Runner",
        option="--runner",
    )


@pytest.mark.parametrize(
    "args, option",
    [
        (["--files", "0"], "--files"),
        (["--files", "-1"], "--files"),
        (["--records", "-5"], "--records"),
        (["--record_bytes", "-1"], "--record_bytes"),
        (["--files", "20", "--records", "10"], "some files would be empty"),
    ],
)
def test_b13_generate_refuses_counts_below_one(tmp_path, capsys, args, option):
    refused(capsys, "generate", "--output_dir", str(tmp_path / "g"), *args, option=option)
    assert not os.path.exists(tmp_path / "g"), "nothing written"


@pytest.fixture
def small_output(tmp_path):
    """A finished run of 20 JSONL records (fewer than one training batch of 32)."""
    jsonl_files(tmp_path / "small", 20, files=1)
    output = str(tmp_path / "out" / "o")
    run_shuffle(str(tmp_path / "small" / "*.jsonl"), output, "--format=jsonl", "--num_piles=2")
    return str(tmp_path / "small" / "*.jsonl"), output


def test_b13_quality_refuses_a_sample_of_nothing_and_a_report_it_cannot_write(
    tmp_path, capsys, small_output
):
    pattern, output = small_output
    for sample_size in ("0", "-3"):
        refused(
            capsys,
            "quality",
            f"--input={pattern}",
            f"--output={output}",
            f"--report={tmp_path / 'r'}",
            f"--sample={sample_size}",
            option="--sample",
        )
    (tmp_path / "a_file").write_text("mine")
    unwritable = ["/proc/pileshuffle-report"]  # not even root writes there
    if os.geteuid() != 0:
        (tmp_path / "ro").mkdir(mode=0o555)
        unwritable.append(str(tmp_path / "ro"))
    for report in [str(tmp_path / "a_file"), str(tmp_path / "a_file" / "sub"), *unwritable]:
        refused(
            capsys,
            "quality",
            f"--input={pattern}",
            f"--output={output}",
            f"--report={report}",
            option="--report",
        )
    assert (tmp_path / "a_file").read_text() == "mine"
    assert not os.path.exists(tmp_path / "r")


def test_b13_quality_compare_on_a_tiny_output_reports(tmp_path, capsys, small_output):
    pattern, output = small_output
    out, _ = succeeded(
        capsys,
        "quality",
        f"--input={pattern}",
        f"--output={output}",
        f"--report={tmp_path / 'r'}",
        "--compare",
    )
    assert "loader, mix=4" in out
    summary = json.load(open(tmp_path / "r" / "quality.json"))
    assert summary["records"] == 20 and all(
        p["held_out_accuracy"] is None for p in summary["policies"]
    )


def test_b13_store_commands_refuse_meaningless_values(tmp_path, capsys):
    prefix = make_store(tmp_path)
    before = store_state(prefix)
    for version in ("99", "0", "-1"):
        err = refused(
            capsys,
            "materialize",
            f"--store={prefix}",
            f"--output={tmp_path / 'm' / 'm'}",
            f"--version={version}",
            *FAST,
            option="--version",
        )
        assert "1" in err.split("--version", 1)[1], "names the versions there are"
    err = refused(capsys, "expire", f"--store={prefix}", "--before", "yesterday", option="--before")
    assert "2026-11-01" in err or "ISO 8601" in err
    for command in ("gc", "expire"):
        extra = ["--keep_generations=1"] if command == "expire" else []
        refused(
            capsys,
            command,
            f"--store={prefix}",
            "--grace_seconds=-5",
            *extra,
            option="--grace_seconds",
        )
    assert store_state(prefix) == before
    assert not os.path.exists(tmp_path / "m")


# --- B14: expire of everything, `--store P-store`, empty store folders -----------------------------


def test_b14_expire_of_every_generation_needs_all(tmp_path, capsys):
    prefix = make_store(tmp_path)
    before = store_state(prefix)
    err = refused(capsys, "expire", f"--store={prefix}", "--keep_generations=0", option="--all")
    assert "generation" in err
    refused(capsys, "expire", f"--store={prefix}", "--before=2999-01-01", option="--all")
    assert store_state(prefix) == before
    out, _ = succeeded(
        capsys, "expire", f"--store={prefix}", "--before=2999-01-01", "--all", "--grace_seconds=0"
    )
    assert live_generations(prefix) == [] and "expired   1 generation(s) [0]" in out


def test_b14_the_store_folder_is_accepted_for_its_prefix(tmp_path, capsys):
    prefix = make_store(tmp_path)
    store = names.store_dir(prefix)
    more = jsonl_files(tmp_path / "more", 200, name="more")
    for spelling in (store, store + "/"):
        succeeded(
            capsys,
            "append",
            f"--store={spelling}",
            f"--input={more[len(live_generations(prefix)) - 1]}",
            *FAST,
        )
    assert live_generations(prefix) == [0, 1, 2]
    assert not os.path.exists(store + "-store")
    succeeded(capsys, "materialize", f"--store={store}", f"--output={tmp_path / 'm' / 'm'}", *FAST)
    succeeded(capsys, "gc", f"--store={store}")
    out, _ = succeeded(capsys, "verify", f"--output={store}/")
    assert "OK: store" in out
    succeeded(capsys, "expire", f"--store={store}", "--keep_generations=2")
    assert live_generations(prefix) == [1, 2] and not os.path.exists(store + "-store")


def test_b14_no_command_leaves_an_empty_store_folder(tmp_path, capsys):
    jsonl_files(tmp_path / "in", 100)
    nothing = str(tmp_path / "nothing")
    refused(capsys, "append", f"--store={nothing}", f"--input={tmp_path}/in/*.jsonl", *FAST)
    refused(capsys, "expire", f"--store={nothing}", "--keep_generations=1")
    refused(capsys, "gc", f"--store={nothing}")
    refused(capsys, "materialize", f"--store={nothing}", f"--output={tmp_path / 'm'}", *FAST)
    # a first `run --layout store` that fails on a corrupt input
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "x.tfrecord").write_bytes(b"\x00" * 64)
    refused(
        capsys,
        "run",
        "--layout=store",
        f"--input={tmp_path}/bad/*",
        f"--output={tmp_path / 'bad_out'}",
        *FAST,
    )
    assert sorted(os.listdir(tmp_path)) == ["bad", "in"], os.listdir(tmp_path)


# --- a new user's trial of the fixes: materialize's output, copied inputs ---------------------------


def run_output_files(directory):
    """Every file under ``directory`` with its bytes (a finished output left alone)."""
    return {
        os.path.relpath(p, directory): open(p, "rb").read()
        for p in glob.glob(os.path.join(str(directory), "**"), recursive=True)
        if os.path.isfile(p)
    }


def test_materialize_checks_and_locks_its_output_as_run_does(tmp_path, capsys):
    """`materialize --output` goes through run's own checks and lock: wildcards (which Beam
    takes as patterns when it deletes: `t*` replaced another output's manifest), a trailing
    slash, an empty prefix, a store at the prefix, a held lock, and --max_pile_bytes."""
    prefix = make_store(tmp_path)
    other = str(tmp_path / "mo" / "t")  # another finished output
    run_shuffle(str(tmp_path / "in" / "*.jsonl"), other, "--format=jsonl", "--num_piles=2")
    before = run_output_files(tmp_path / "mo")
    for output in (f"{other}*", str(tmp_path / "mq" / "t[1]"), str(tmp_path / "mo" / "t?")):
        for overwrite in ([], ["--overwrite"]):
            for command in (
                ["run", f"--input={tmp_path}/in/*.jsonl"],
                ["materialize", f"--store={prefix}"],
            ):
                err = refused(
                    capsys, *command, f"--output={output}", *overwrite, *FAST, option="--output"
                )
                assert "wildcards" in err, err
    assert run_output_files(tmp_path / "mo") == before, "the other output is untouched"
    for output in (str(tmp_path / "exm") + "/", ""):
        for command in (
            ["run", f"--input={tmp_path}/in/*.jsonl"],
            ["materialize", f"--store={prefix}"],
        ):
            refused(capsys, *command, f"--output={output}", *FAST, option="--output")
    p2 = str(tmp_path / "p2")  # a store at the output's prefix: shards there would hide it
    run_shuffle(
        str(tmp_path / "in" / "*.jsonl"), p2, "--format=jsonl", "--layout=store", "--num_piles=2"
    )
    err = refused(capsys, "materialize", f"--store={prefix}", f"--output={p2}", *FAST)
    assert f"{p2}-store" in err
    output = str(tmp_path / "m" / "m")
    for value in ("0", "1KiB", "lots"):
        refused(
            capsys,
            "materialize",
            f"--store={prefix}",
            f"--output={output}",
            f"--max_pile_bytes={value}",
            *FAST,
            option="--max_pile_bytes",
        )
    os.makedirs(tmp_path / "m")
    lock = f"{output}.pileshuffle-lock"  # a run to the same output, still running (this process)
    holder = {
        "command": "pileshuffle run ...",
        "host": __import__("socket").gethostname(),
        "pid": os.getpid(),
        "since": layout.now_iso(),
        "token": "t",
    }
    with open(lock, "w") as handle:
        json.dump(holder, handle)
    err = refused(capsys, "materialize", f"--store={prefix}", f"--output={output}", *FAST)
    assert "locked" in err and lock in err
    assert os.listdir(tmp_path / "m") == [os.path.basename(lock)], (
        "nothing written, the lock left to its holder"
    )
    os.remove(lock)
    succeeded(capsys, "materialize", f"--store={prefix}", f"--output={output}", *FAST)
    assert not os.path.exists(lock), "materialize released its lock"
    assert sorted(os.listdir(tmp_path)) == ["in", "m", "mo", "p2-store", "s-store"], os.listdir(
        tmp_path
    )


def test_append_refuses_copies_of_a_live_generations_inputs(tmp_path, capsys):
    """Copied files are other files (identity differs) but the same records: a generation
    whose fingerprint is a live generation's exactly is refused unless
    --allow_duplicate_inputs, and leaves nothing behind."""
    import shutil

    prefix = make_store(tmp_path)
    shutil.copytree(tmp_path / "in", tmp_path / "rawcopy")
    before = store_state(prefix)
    err = refused(
        capsys,
        "append",
        f"--store={prefix}",
        f"--input={tmp_path}/rawcopy/*.jsonl",
        *FAST,
        option="--allow_duplicate_inputs",
    )
    assert "generation 0" in err and "cop" in err and "rawcopy" in err, err
    assert store_state(prefix) == before, "nothing published, no lock left"
    assert sorted(os.listdir(names.store_dir(prefix))) == sorted(
        {p.split(os.sep)[0] for p in before}
    )
    # one copied file is not the whole generation: accepted
    succeeded(
        capsys, "append", f"--store={prefix}", f"--input={tmp_path}/rawcopy/part-000.jsonl", *FAST
    )
    assert live_generations(prefix) == [0, 1]
    succeeded(
        capsys,
        "append",
        f"--store={prefix}",
        f"--input={tmp_path}/rawcopy/*.jsonl",
        "--allow_duplicate_inputs",
        *FAST,
    )
    assert live_generations(prefix) == [0, 1, 2]
    assert layout.read_store_manifest(prefix)["totals"]["records"] == 600 + 300 + 600
