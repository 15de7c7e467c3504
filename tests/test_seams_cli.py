"""Seams a new user hit in the command line after issue 19's first fixes, run as a user runs them:
``pileshuffle.cli.main([...])`` in this process, its exit code and its stderr. Each test failed on
the code before its fix."""

import glob
import json
import os
import socket

import pytest
from helpers import FAST, refused, run_shuffle, succeeded

from pileshuffle.cli import main as pileshuffle
from pileshuffle.commands import sample


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A run over 3,000 TFRecords of 100 bytes (``raw/``), and 3,000 other records (``other/``)."""
    root = tmp_path_factory.mktemp("finished")
    sample.write_tfrecord(str(root / "raw"), records=3000, files=2, record_bytes=100)
    sample.write_tfrecord(str(root / "other"), records=3000, files=2, record_bytes=100, seed=7)
    run_shuffle(str(root / "raw" / "*"), str(root / "out" / "train"), "--num_piles=3")
    return root


def quality_args(root, *args, input="raw"):
    return ["quality", f"--input={root}/{input}/*", f"--output={root}/out/train", *args]


# --- 1. quality on the wrong --input -----------------------------------------------------------------


def test_quality_refuses_an_input_that_holds_too_few_of_the_outputs_records(
    finished, tmp_path, capsys
):
    report = tmp_path / "r"
    err = refused(
        capsys, *quality_args(finished, f"--report={report}", input="other"), option="--input"
    )
    assert "only 0 of the 3,000 sampled output records" in err and "is it the run's input?" in err
    assert not report.exists()


# --- 2. a label outside the records, a label of one value ------------------------------------------


def test_quality_refuses_label_bytes_past_the_end_of_every_record(finished, tmp_path, capsys):
    err = refused(
        capsys,
        *quality_args(finished, f"--report={tmp_path / 'r'}", "--label_bytes=200:201"),
        option="--label_bytes",
    )
    assert "100 bytes" in err
    assert not (tmp_path / "r").exists()


def test_quality_leaves_out_the_label_test_of_a_label_with_one_value(finished, tmp_path, capsys):
    report = tmp_path / "r"
    # index digit '0'
    out, _ = succeeded(capsys, *quality_args(finished, f"--report={report}", "--label_bytes=0:1"))
    line = next(line for line in out.splitlines() if "label balance" in line)
    assert "one value" in line and "p=" not in line, out
    summary = json.loads((report / "quality.json").read_text())
    assert summary["label"]["classes"] == 1 and "note" in summary["label"]
    assert "batch_dispersion_p" not in summary


# --- 3. Beam's own option values -------------------------------------------------------------------


@pytest.mark.parametrize("command", ["run", "plan", "append"])
@pytest.mark.parametrize(
    "bad, option",
    [
        (["--direct_num_workers", "-1"], "--direct_num_workers"),
        (["--direct_running_mode=threads"], "--direct_running_mode"),
        (["--direct_num_workers=two"], "--direct_num_workers"),
    ],
)
def test_beam_option_values_the_local_runner_uses_are_checked_first(
    finished, tmp_path, capsys, command, bad, option
):
    where = {
        "run": ["--output", str(tmp_path / "o" / "t")],
        "plan": ["--output", str(tmp_path / "o" / "t")],
        "append": ["--store", str(tmp_path / "s")],
    }[command]
    refused(capsys, command, f"--input={finished}/raw/*", *where, *bad, option=option)
    assert not list(tmp_path.iterdir())


def test_zero_workers_is_one_per_core_and_below_zero_says_so(finished, capsys):
    out, _ = succeeded(
        capsys,
        "plan",
        f"--input={finished}/raw/*",
        f"--output={finished}/planned/t",
        "--direct_num_workers=0",
    )
    assert f"{os.cpu_count()} worker(s)" in out
    err = refused(
        capsys,
        "plan",
        f"--input={finished}/raw/*",
        f"--output={finished}/planned/t",
        "--direct_num_workers=-1",
        option="--direct_num_workers",
    )
    assert "0 = one worker per core" in err


# --- 4. an unreachable Dask scheduler -------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_an_unreachable_dask_scheduler_is_one_line_naming_it(finished, tmp_path, capsys):
    address = f"tcp://127.0.0.1:{free_port()}"
    refused(
        capsys,
        "run",
        f"--input={finished}/raw/*",
        f"--output={tmp_path}/o/t",
        "--runner=DaskRunner",
        f"--dask_client_address={address}",
        "--dask_connection_timeout=2",
        "--quiet",
        option=address,
    )
    assert not glob.glob(f"{tmp_path}/o/t*")


def test_a_scheduler_address_gets_a_short_connect_timeout():
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.runners.dask.dask_runner import DaskOptions

    from pileshuffle.engine.runner import DASK_CONNECT_SECONDS, dask_defaults

    given = dask_defaults(PipelineOptions(["--dask_client_address=tcp://h:8786"]), 2).view_as(
        DaskOptions
    )
    assert given.timeout == DASK_CONNECT_SECONDS < 30
    told = dask_defaults(
        PipelineOptions(["--dask_client_address=tcp://h:8786", "--dask_connection_timeout=60"]), 2
    )
    assert told.view_as(DaskOptions).timeout == 60
    # a LocalCluster starts processes: no limit
    local = dask_defaults(PipelineOptions([]), 2).view_as(DaskOptions)
    assert local.timeout is None


# --- 5. a typo in an option of any command ----------------------------------------------------------------


@pytest.mark.parametrize(
    "args, typo, suggestion",
    [
        (["append", "--store=st/train", "--inputs=x"], "--inputs", "--input"),
        (["materialize", "--store=st/train", "--ouput=x"], "--ouput", "--output"),
        (["verify", "--outptu=x"], "--outptu", "--output"),
        (
            ["quality", "--input=x", "--output=y", "--report=z", "--sampel", "100"],
            "--sampel",
            "--sample",
        ),
        (["generate", "--output_dir=g", "--recods", "10"], "--recods", "--records"),
    ],
)
def test_a_misspelt_option_is_named_with_the_right_one(
    tmp_path, capsys, monkeypatch, args, typo, suggestion
):
    monkeypatch.chdir(tmp_path)
    err = refused(capsys, *args)
    assert f"unknown option {typo} (did you mean {suggestion}?)" in err
    assert "required" not in err
    assert not list(tmp_path.iterdir())


def test_metadata_refuses_options(capsys):
    refused(capsys, "metadata", "--foo", option="--foo")


# --- 6. verify of nothing, and of a store read against other records -------------------------------------


def test_verify_of_an_output_that_does_not_exist_is_a_usage_error(tmp_path, capsys):
    err = refused(
        capsys, "verify", f"--output={tmp_path}/nope/train", option=f"{tmp_path}/nope/train"
    )
    assert "FAILED" not in err


def test_verify_of_a_store_against_other_records_of_the_same_size_says_the_contents_differ(
    tmp_path, capsys
):
    sample.write_jsonl(str(tmp_path / "in"), records=400, files=2, record_bytes=60)
    sample.write_jsonl(str(tmp_path / "other"), records=400, files=2, record_bytes=60, seed=1)
    run_shuffle(str(tmp_path / "in" / "*"), str(tmp_path / "s"), "--layout=store", "--num_piles=2")
    capsys.readouterr()
    assert pileshuffle(["verify", f"--input={tmp_path}/other/*", f"--output={tmp_path}/s"]) == 1
    err = capsys.readouterr().err
    assert "the same count and bytes but different records" in err and "hash sum" in err, err


# --- 7. wording -------------------------------------------------------------------------------------------


def test_a_missing_input_or_output_is_said_the_same_way(finished, tmp_path, capsys):
    no_input = refused(capsys, "run", f"--output={tmp_path}/o/t", *FAST)
    no_output = refused(capsys, "run", f"--input={finished}/raw/*", *FAST)
    assert (
        no_input.replace("--input", "--X").split("(")[0]
        == no_output.replace("--output", "--X").split("(")[0]
    )
    assert "--output: is required" in no_output


@pytest.mark.parametrize(
    "fmt, name", [("jsonl", "part-000.jsonl"), ("jsonl", "a"), ("tfrecord", "a")]
)
def test_quality_on_input_of_another_format_gives_no_format_hint(
    finished, tmp_path, capsys, fmt, name
):
    """``quality`` has no ``--format``: it reads ``--input`` in the run's format, from its manifest."""
    output = f"{finished}/out/train"
    if fmt == "tfrecord":  # a JSONL run, given TFRecord files
        sample.write_jsonl(str(tmp_path / "js"), records=300, files=1, record_bytes=60)
        output = str(tmp_path / "jout" / "t")
        run_shuffle(str(tmp_path / "js" / "*"), output, "--num_piles=2")
        source = f"{finished}/raw/part-000.tfrecord"
    else:
        source = sample.write_jsonl(str(tmp_path / "js"), records=3000, files=1, record_bytes=60)[0]
    os.makedirs(tmp_path / "in")
    os.link(source, tmp_path / "in" / name)
    err = refused(
        capsys,
        "quality",
        f"--input={tmp_path}/in/*",
        f"--output={output}",
        f"--report={tmp_path}/r",
    )
    assert "--format" not in err and str(tmp_path / "in") in err


def test_a_folder_with_a_trailing_slash_is_refused_like_without(finished, tmp_path, capsys):
    plain = refused(capsys, "run", f"--input={finished}/raw", f"--output={tmp_path}/o/t", *FAST)
    slashed = refused(capsys, "run", f"--input={finished}/raw/", f"--output={tmp_path}/o/t", *FAST)
    hint = f"such as '{finished}/raw/*'"
    assert hint in plain and hint in slashed and "is a folder" in slashed
    assert not list(tmp_path.iterdir())


def test_generate_cut_short_leaves_no_short_file_under_a_final_name(tmp_path):
    def render(start, count):
        if start >= 20:
            raise KeyboardInterrupt
        return b"x" * count

    with pytest.raises(KeyboardInterrupt):
        sample._write_files(
            str(tmp_path),
            records=100,
            files=2,
            name="part",
            extension=".tfrecord",
            render=render,
            block_records=10,
        )
    # hidden: input patterns skip it
    assert sorted(os.listdir(tmp_path)) == [".part-000.tfrecord.partial"]
