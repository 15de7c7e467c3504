"""Plain helpers shared by the tests (fixtures live in conftest.py): generated data, real
pipeline runs on Beam's local runner, reading their outputs, the command line run in-process,
and the reliability checks (an output proven good, or a failed run proven to leave nothing)."""

import contextlib
import glob
import json
import os
import signal
import struct
import subprocess
import sys
import time

from pileshuffle.commands import sample

# In-process FnApiRunner: the DirectRunner's own engine, without the Prism download attempt.
FAST = ["--direct_running_mode=in_memory", "--direct_num_workers=1"]


# -- real runs ------------------------------------------------------------------------------------


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


# the --balance tests' classes, written one class at a time
CLASS_ORDER = {
    "cat": 900,
    "dog": 90,
    "bird": 10,
}


def write_animals(root) -> str:
    """JSONL of ``CLASS_ORDER``'s records ``{"i", "animal", "text"}`` in two files under
    ``root/in``, one class after another (the worst input order); their pattern."""
    lines, i = [], 0
    for animal, n in CLASS_ORDER.items():
        for _ in range(n):
            lines.append(json.dumps({"i": i, "animal": animal, "text": "x" * (i % 40)}) + "\n")
            i += 1
    (root / "in").mkdir()
    (root / "in" / "a.jsonl").write_text("".join(lines[:600]))
    (root / "in" / "b.jsonl").write_text("".join(lines[600:]))
    return str(root / "in" / "*.jsonl")


# -- reading outputs ------------------------------------------------------------------------------


def input_places(paths, fmt="tfrecord"):
    """Where each input file's records start, as pass 1 keys them (``RecordFormat.read_placed``)."""
    import numpy as np

    from pileshuffle.formats import get_format

    return [
        np.concatenate([places for _, places in get_format(fmt).read_placed(p)])
        for p in sorted(paths)
    ]


def shards(output):
    return sorted(p for p in glob.glob(f"{output}-*-of-*") if not p.endswith("manifest.json"))


def shard_bytes(output):
    return [open(p, "rb").read() for p in shards(output)]


def manifest(output):
    with open(f"{output}-manifest.json") as handle:
        return json.load(handle)


def stable_manifest(output):
    """The manifest without its timing fields: equal for byte-identical runs."""
    found = manifest(output)
    for key in ("seconds", "wall_seconds"):
        found.pop(key, None)
    return found


def read_tfrecord_payloads(paths):
    """Payloads via Beam's own TFRecord codec (CRCs checked): an independent reader."""
    from apache_beam.coders import BytesCoder
    from apache_beam.io.tfrecordio import _TFRecordUtil

    out = []
    for path in paths:
        with open(path, "rb") as handle:
            while True:
                record = _TFRecordUtil.read_record(handle)
                if record is None:
                    break
                out.append(BytesCoder().decode(record))
    return out


def output_payloads(output):
    return read_tfrecord_payloads(shards(output))


def frame_starts(data: bytes):
    """Start offsets of the TFRecord frames of ``data`` (a valid file)."""
    starts, pos = [], 0
    while pos < len(data):
        starts.append(pos)
        (length,) = struct.unpack_from("<Q", data, pos)
        pos += 12 + length + 4
    return starts


# -- the command line, in this process ------------------------------------------------------------


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


# -- reliability: an output proven good, or a failed run proven to leave nothing ------------------


@contextlib.contextmanager
def as_the_read_side_reads():
    """Files read through pyarrow's file systems, as ``pileshuffle verify``, ``info`` and
    ``quality`` read them: those commands import no Beam, so their processes never use Beam's
    file layer, which a test process that has run a pipeline would otherwise choose."""
    before = os.environ.get("PILESHUFFLE_STORAGE")
    os.environ["PILESHUFFLE_STORAGE"] = "arrow"
    try:
        yield
    finally:
        if before is None:
            del os.environ["PILESHUFFLE_STORAGE"]
        else:
            os.environ["PILESHUFFLE_STORAGE"] = before


def assert_verified(input_glob, output, format=None):
    """``pileshuffle verify`` finds no problem with ``output`` (against ``input_glob``), reading
    as the command does (``as_the_read_side_reads``)."""
    from pileshuffle.commands.verify import verify

    with as_the_read_side_reads():
        problems = verify(input_glob, output, format)
    assert problems == [], "\n".join(problems)


def final_outputs(output):
    """Shards and manifest under final names."""
    return shards(output) + glob.glob(f"{output}-manifest.json")


def temp_leftovers(directory):
    """Files or directories a run uses only while it runs: work dirs, staging, temp names."""
    found = []
    for root, dirs, files in os.walk(directory):
        for name in dirs + files:
            if ".pileshuffle-" in name or ".tmp-" in name or name.startswith(".probe-"):
                found.append(os.path.join(root, name))
    return found


def assert_nothing_published(output):
    """A failed run: no shard and no manifest under final names, and its temp files gone."""
    assert final_outputs(output) == []
    assert temp_leftovers(os.path.dirname(output)) == []


def kill_when(command, ready, timeout=240):
    """Start ``command`` in its own process group, SIGKILL the whole group once
    ``ready()`` holds; returns True if it was killed (False: it finished first)."""
    process = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    deadline = time.time() + timeout
    try:
        while process.poll() is None and time.time() < deadline:
            if ready():
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
                return True
            time.sleep(0.005)
        return False
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        try:  # the group's other members (workers) must be gone too
            os.killpg(process.pid, 0)
            time.sleep(0.5)
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def free_port() -> int:
    """A TCP port on 127.0.0.1 nothing listens on now."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# The command's peak RSS, measured by a small parent: a child's ru_maxrss starts at its parent's
# RSS when it was forked (Linux keeps the high-water mark across fork and exec), and a pytest
# worker that ran other tests holds 1-2 GB; this parent holds a few MB.
_MEASURED = """
import resource, subprocess, sys
done = subprocess.run(sys.argv[1:], capture_output=True, text=True)
sys.stderr.write(done.stderr)
print(done.stdout)
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)
sys.exit(done.returncode)
"""


def with_peak_rss(command, timeout=300) -> tuple:
    """``(finished process, its stdout, peak RSS in bytes)`` of ``command`` (argv)."""
    done = subprocess.run(
        [sys.executable, "-c", _MEASURED, *command], capture_output=True, text=True, timeout=timeout
    )
    out, _, peak = done.stdout.rstrip("\n").rpartition("\n")
    return done, out, int(peak) if peak.isdigit() else None
