"""Helpers shared by the reliability tests: proving an output good, or proving that a
failed run left nothing under final names."""

import glob
import os
import signal
import struct
import subprocess
import time

from conftest import manifest, shards


def assert_verified(input_glob, output, format=None):
    """``pileshuffle verify`` finds no problem with ``output`` (against ``input_glob``)."""
    from pileshuffle.verify import verify

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


def frame_starts(data: bytes):
    """Start offsets of the TFRecord frames of ``data`` (a valid file)."""
    starts, pos = [], 0
    while pos < len(data):
        starts.append(pos)
        (length,) = struct.unpack_from("<Q", data, pos)
        pos += 12 + length + 4
    return starts


def output_payloads(output):
    from conftest import read_tfrecord_payloads

    return read_tfrecord_payloads(shards(output))


def stable_manifest(output):
    """The manifest without its timing fields: equal for byte-identical runs."""
    found = manifest(output)
    for key in ("seconds", "wall_seconds"):
        found.pop(key, None)
    return found


def kill_when(command, ready, timeout=240):
    """Start ``command`` in its own process group, SIGKILL the whole group once
    ``ready()`` holds; returns True if it was killed (False: it finished first)."""
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
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
