"""The rough edges a new user met on a first trial (issue 37), each through the real command line:
a gzip TFRecord named .tfrecord, a README beside the data, a renamed output, an identical re-run,
the --quiet and --skip_corrupt every command takes, quality without --report, and `info`."""

import gzip
import json
import os
import shutil

import pytest
from helpers import refused, succeeded

from pileshuffle import names
from pileshuffle.commands import sample
from pileshuffle.errors import InputError
from pileshuffle.loader import ShuffledDataset


@pytest.fixture(scope="module")
def trial(tmp_path_factory):
    """500 TFRecord records in 2 files, shuffled into out/t, and a store st/t of the same."""
    root = tmp_path_factory.mktemp("trial")
    sample.write_tfrecord(str(root / "in"), records=500, files=2, record_bytes=50)
    from pileshuffle.cli import main

    assert (
        main(
            [
                "run",
                f"--input={root}/in/*.tfrecord",
                f"--output={root}/out/t",
                "--num_piles=2",
                "--quiet",
            ]
        )
        == 0
    )
    assert (
        main(
            [
                "run",
                "--layout=store",
                f"--input={root}/in/part-000.tfrecord",
                f"--output={root}/st/t",
                "--num_piles=2",
                "--quiet",
            ]
        )
        == 0
    )
    return root


def test_a_gzip_tfrecord_named_tfrecord_is_named_for_what_it_is(trial, tmp_path, capsys):
    (tmp_path / "gz").mkdir()
    (tmp_path / "gz" / "a.tfrecord").write_bytes(
        gzip.compress((trial / "in" / "part-000.tfrecord").read_bytes())
    )
    err = refused(
        capsys,
        "run",
        f"--input={tmp_path}/gz/*.tfrecord",
        f"--output={tmp_path}/o",
        "--num_piles=2",
    )
    assert "gzip's magic bytes" in err and "name it .tfrecord.gz" in err and "--format" not in err


def test_a_readme_beside_the_data_asks_to_narrow_the_pattern(trial, tmp_path, capsys):
    shutil.copytree(trial / "in", tmp_path / "data")
    (tmp_path / "data" / "README.md").write_text("about this data\n")
    err = refused(
        capsys, "run", f"--input={tmp_path}/data/*", f"--output={tmp_path}/o", "--num_piles=2"
    )
    assert "README.md" in err and "narrow --input" in err and "*.tfrecord" in err


def test_a_renamed_output_is_named_by_the_manifest_the_user_gave(trial, tmp_path):
    (tmp_path / "moved").mkdir()
    for path in (trial / "out").iterdir():
        shutil.copy(path, tmp_path / "moved" / path.name.replace("t-", "u-", 1))
    with pytest.raises(InputError) as caught:
        ShuffledDataset(str(tmp_path / "moved" / "u"))
    message = str(caught.value)
    assert message.startswith(f"{tmp_path}/moved/u-manifest.json: ") and "renamed" in message
    assert "rename its files back to t-*" in message


def test_an_identical_rerun_is_nothing_to_do_and_another_one_is_refused(trial, tmp_path, capsys):
    shutil.copytree(trial / "out", tmp_path / "out")
    args = [f"--input={trial}/in/*.tfrecord", f"--output={tmp_path}/out/t", "--num_piles=2"]
    before = {p: os.path.getmtime(tmp_path / "out" / p) for p in os.listdir(tmp_path / "out")}
    out, err = succeeded(capsys, "run", *args)
    assert (
        "already holds this run's output" in err
        and "nothing to do" in err
        and "records   500" in out
    )
    assert {
        p: os.path.getmtime(tmp_path / "out" / p) for p in os.listdir(tmp_path / "out")
    } == before
    assert "output already exists" in refused(capsys, "run", *args[:2], "--num_piles=3")
    assert "output already exists" in refused(capsys, "run", *args, "--seed=1")


def test_a_rerun_with_other_free_memory_is_still_nothing_to_do(trial, tmp_path, capsys):
    """``--max_pile_bytes auto`` follows the memory free when a run starts (here set by
    ``--memory``): a re-run of the same command that finds more or less of it writes the same
    bytes, so it finds its own output there; it was refused as another run's."""
    args = [f"--input={trial}/in/*.tfrecord", f"--output={tmp_path}/out/t", "--num_piles=2"]
    succeeded(capsys, "run", *args, "--memory=1MiB")
    before = {p: os.path.getmtime(tmp_path / "out" / p) for p in os.listdir(tmp_path / "out")}
    _, err = succeeded(capsys, "run", *args, "--memory=64GB")
    assert "already holds this run's output" in err and "nothing to do" in err, err
    assert {
        p: os.path.getmtime(tmp_path / "out" / p) for p in os.listdir(tmp_path / "out")
    } == before
    with open(tmp_path / "out" / "t-manifest.json") as handle:
        assert json.load(handle)["options"]["max_pile_bytes"] == 64 << 20  # as first sized


def test_quiet_and_skip_corrupt_are_taken_by_every_command_that_runs(trial, tmp_path, capsys):
    shutil.copytree(trial / "st", tmp_path / "st")
    _, err = succeeded(
        capsys,
        "append",
        f"--store={tmp_path}/st/t",
        f"--input={trial}/in/part-001.tfrecord",
        "--quiet",
    )
    assert err.strip() == ""
    succeeded(
        capsys, "materialize", f"--store={tmp_path}/st/t", f"--output={tmp_path}/m/t", "--quiet"
    )
    out, _ = succeeded(
        capsys,
        "verify",
        f"--input={trial}/in/*.tfrecord",
        f"--output={tmp_path}/m/t",
        "--skip_corrupt",
        "--quiet",
    )
    assert "OK: 500 records" in out


def test_quality_prints_its_statistics_without_a_report(trial, capsys):
    out, _ = succeeded(
        capsys,
        "quality",
        f"--input={trial}/in/*.tfrecord",
        f"--output={trial}/out/t",
        "--sample=500",
    )
    assert "verdict" in out and "report written" not in out


def test_info_says_what_an_output_and_a_store_hold(trial, capsys):
    out, _ = succeeded(capsys, "info", f"--output={trial}/out/t")
    assert (
        f"shard output (format_version {names.FORMAT_VERSION}" in out
        and "500 in 2 shard(s)" in out
        and "seed 0" in out
    )
    assert "CRC32C are listed" in out
    out, _ = succeeded(capsys, "info", f"--output={trial}/st/t", "--json")
    described = json.loads(out)
    assert (
        described["kind"].startswith("pile store, version 1")
        and "1 live generation(s)" in described["records"]
    )
    assert "holds no finished output" in refused(capsys, "info", f"--output={trial}/nothing/here")


def test_a_parquet_column_that_is_not_there_is_refused_when_the_dataset_is_made(tmp_path):
    sample.write_parquet(str(tmp_path / "in"), records=200, files=1)
    from pileshuffle.cli import main

    assert (
        main(
            [
                "run",
                f"--input={tmp_path}/in/*.parquet",
                f"--output={tmp_path}/o",
                "--num_piles=2",
                "--quiet",
            ]
        )
        == 0
    )
    with pytest.raises(InputError, match=r"has no column\(s\) \['nope'\]"):
        ShuffledDataset(str(tmp_path / "o"), columns=["nope"])


def test_a_path_with_a_comma_is_given_with_an_escaped_comma(trial, tmp_path, capsys):
    (tmp_path / "odd").mkdir()
    shutil.copy(trial / "in" / "part-000.tfrecord", tmp_path / "odd" / "a,b.tfrecord")
    shutil.copy(trial / "in" / "part-001.tfrecord", tmp_path / "odd" / "c.tfrecord")
    given = f"{tmp_path}/odd/a\\,b.tfrecord,{tmp_path}/odd/c.tfrecord"
    out, _ = succeeded(
        capsys, "run", f"--input={given}", f"--output={tmp_path}/o", "--num_piles=2", "--quiet"
    )
    assert "records   500" in out
    assert "does not exist" in refused(
        capsys, "run", f"--input={tmp_path}/odd/a,b.tfrecord", f"--output={tmp_path}/p"
    )


def test_every_command_s_help_has_one_look(capsys):
    """Usage, summary, then each option with (required) or (default: ...) and its help below:
    run's look, also for the commands argparse parses (they printed argparse's own); metadata takes none."""
    import re

    from pileshuffle.cli import COMMANDS, main

    for name in COMMANDS:
        capsys.readouterr()
        try:
            code = main([name, "--help"])
        except SystemExit as done:
            code = done.code
        out = capsys.readouterr().out
        assert (
            code == 0 and out.startswith(f"usage: pileshuffle {name}") and "\noptions:\n" in out
        ), (name, out)
        options = [line for line in out.splitlines() if line.startswith("  --")]
        assert (options or name == "metadata") and all(
            re.search(r"\((required|default: .*)\)$", line) for line in options
        ), (name, options)
        assert "show this help message and exit" not in out, name
