"""Shared helpers: generated data, and real pipeline runs on Beam's local runner."""

import glob
import json
import os
import subprocess

import pytest

from pileshuffle import sample

# In-process FnApiRunner: the DirectRunner's own engine, without the Prism download attempt.
FAST = ["--direct_running_mode=in_memory", "--direct_num_workers=1"]


def run_shuffle(input_glob, output, *args, runner_args=FAST):
    """Run the template pipeline for real; returns the manifest."""
    from pileshuffle.pipeline import run

    return run([f"--input={input_glob}", f"--output={output}", *runner_args, *args])


def sample_run(factory, fmt, *args, records, files=3, **write):
    """``(input pattern, output prefix)`` of a real run (``args``: its options) over ``files``
    freshly written sample files of ``fmt`` (``write``: the writer's options)."""
    root = factory.mktemp(fmt)
    sample.WRITERS[fmt](str(root / "in"), records=records, files=files, **write)
    pattern, prefix = str(root / "in" / f"*.{fmt}"), str(root / "out" / "data")
    run_shuffle(pattern, prefix, f"--format={fmt}", *args)
    return pattern, prefix


def shuffled_sample(factory, fmt, *args, records, files=3, **write):
    """The prefix of a real run over freshly written sample files (``sample_run``)."""
    return sample_run(factory, fmt, *args, records=records, files=files, **write)[1]


def shards(output):
    return sorted(p for p in glob.glob(f"{output}-*-of-*") if not p.endswith("manifest.json"))


def shard_bytes(output):
    return [open(p, "rb").read() for p in shards(output)]


def manifest(output):
    with open(f"{output}-manifest.json") as handle:
        return json.load(handle)


def read_tfrecord_payloads(paths):
    """Payloads via Beam's own TFRecord codec (CRCs checked): an independent reader."""
    from apache_beam.io.tfrecordio import _TFRecordUtil
    from apache_beam.coders import BytesCoder

    out = []
    for path in paths:
        with open(path, "rb") as handle:
            while True:
                record = _TFRecordUtil.read_record(handle)
                if record is None:
                    break
                out.append(BytesCoder().decode(record))
    return out


@pytest.fixture
def tfrecord_input(tmp_path):
    directory = tmp_path / "in"
    sample.write_tfrecord(str(directory), records=3000, files=3, record_bytes=120, vary=True)
    return str(directory / "*.tfrecord")


@pytest.fixture
def jsonl_input(tmp_path):
    directory = tmp_path / "in"
    sample.write_jsonl(str(directory), records=3000, files=3, record_bytes=80)
    return str(directory / "*.jsonl")


@pytest.fixture
def parquet_input(tmp_path):
    directory = tmp_path / "in"
    sample.write_parquet(str(directory), records=3000, files=3, record_bytes=80, row_group_rows=500)
    return str(directory / "*.parquet")


@pytest.fixture(autouse=True)
def _quiet_beam(caplog):
    import logging

    logging.getLogger("apache_beam").setLevel(logging.ERROR)
    yield


@pytest.fixture
def small_tmpfs(tmp_path):
    directory = tmp_path / "small"
    os.makedirs(directory)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(directory)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"mounting a tmpfs is not permitted here ({done.stderr.strip()}); the injected ENOSPC tests cover this")
    yield str(directory)
    subprocess.run(["umount", "-l", str(directory)], capture_output=True)


def refused(capsys, *args, option=None):
    """Run ``pileshuffle *args`` in this process: it must exit 2 with one or two lines on
    stderr (naming ``option`` when given) and no traceback; returns stderr."""
    from pileshuffle.cli import main as pileshuffle

    capsys.readouterr()
    try:
        code = pileshuffle(list(args))
    except SystemExit as error:  # argparse's own refusals
        code = error.code
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, err
    assert 1 <= len(lines) <= 2 and "Traceback" not in err, err
    if option is not None:
        assert option in err, err
    return err


def succeeded(capsys, *args):
    """Run ``pileshuffle *args`` in this process: it must exit 0; returns (stdout, stderr)."""
    from pileshuffle.cli import main as pileshuffle

    capsys.readouterr()
    code = pileshuffle(list(args))
    out, err = capsys.readouterr()
    assert code == 0, err
    return out, err
