"""Reliability: fuzzed TFRecord input, crashes and re-runs, re-run bundles, full disks,
oversized piles. Every run that succeeds is proven by ``verify``; every run that fails
leaves nothing under final names."""

import errno
import hashlib
import io
import json
import os
import re
import struct
import subprocess
import sys

import numpy as np
import pytest
from helpers import (
    assert_nothing_published,
    assert_verified,
    frame_starts,
    kill_when,
    manifest,
    output_payloads,
    run_shuffle,
    shards,
    stable_manifest,
    temp_leftovers,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pileshuffle.commands import sample
from pileshuffle.errors import InputError, OutputError
from pileshuffle.formats import ReadReport, get_format
from pileshuffle.formats.tfrecord import (
    frame,
    scan_frames,
)
from pileshuffle.records.crc import (
    CRC_PRESET_BYTES,
    masked_crc,
    payloads_match_stored_crcs,
    stored_data_crcs,
)

# --- fuzz: random and mutated bytes as TFRecord input ----------------------------------------

BASE_PAYLOADS = sample.payloads(0, 12, 40, seed=3, vary=True)
BASE_FILE = b"".join(frame(p) for p in BASE_PAYLOADS)
BASE_STARTS = frame_starts(BASE_FILE)


def reference_frames(data: bytes):
    """The frames of ``data`` if it is a valid TFRecord file, else None (a plain reader)."""
    frames, pos = [], 0
    while pos < len(data):
        if pos + 12 > len(data):
            return None
        length, length_crc = struct.unpack_from("<QI", data, pos)
        if masked_crc(data[pos : pos + 8]) != length_crc:
            return None
        end = pos + 12 + length + 4
        if (
            end > len(data)
            or masked_crc(data[pos + 12 : end - 4]) != struct.unpack_from("<I", data, end - 4)[0]
        ):
            return None
        frames.append(data[pos:end])
        pos = end
    return frames


def apply_mutations(mutations):
    data = bytearray(BASE_FILE)
    for kind, position, value in mutations:
        at = position % (len(data) + 1)
        if kind == "flip" and at < len(data):
            data[at] ^= 1 << (value[0] % 8)
        elif kind == "truncate":
            del data[at:]
        elif kind == "insert":
            data[at:at] = value
        elif kind == "delete":
            del data[at : at + len(value)]
        elif kind == "overwrite":
            data[at : at + len(value)] = value
        elif kind == "length":  # a frame header whose length CRC is valid but whose length is wrong
            start = BASE_STARTS[position % len(BASE_STARTS)]
            if start + 12 <= len(data):
                header = struct.pack(
                    "<Q", int.from_bytes(value[:8].ljust(8, b"\0"), "little") % (1 << 20)
                )
                data[start : start + 12] = header + struct.pack("<I", masked_crc(header))
    return bytes(data)


mutation = st.tuples(
    st.sampled_from(["flip", "truncate", "insert", "delete", "overwrite", "length"]),
    st.integers(0, len(BASE_FILE)),
    st.binary(min_size=1, max_size=24),
)
tfrecord_bytes = st.one_of(
    st.binary(max_size=400),
    st.lists(mutation, min_size=1, max_size=4).map(apply_mutations),
    st.just(BASE_FILE),
)


def first_difference(data: bytes) -> int:
    for i, (a, b) in enumerate(zip(data, BASE_FILE)):
        if a != b:
            return i
    return min(len(data), len(BASE_FILE))


def read_all(path, chunk_bytes, skip_corrupt):
    report = ReadReport()
    tables = list(get_format("tfrecord").read_chunks(path, chunk_bytes, skip_corrupt, report))
    frames = [bytes(v) for t in tables for v in t.column(0).to_pylist()]
    return frames, report


@given(
    data=tfrecord_bytes, chunk_bytes=st.sampled_from([5, 13, 64, 300, 1 << 20]), gz=st.booleans()
)
@settings(
    max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
def test_fuzzed_tfrecord_input_reader(tmp_path, data, chunk_bytes, gz):
    """Strict: success exactly when the file is valid (same frames as a plain reader),
    else an InputError at or after the first damaged record. Skip: never fails on an
    uncompressed file; every byte is either in a valid frame or in a reported skip;
    records before the damage all survive."""
    import gzip

    path = str(tmp_path / ("fuzz.tfrecord.gz" if gz else "fuzz.tfrecord"))
    with open(path, "wb") as handle:
        handle.write(gzip.compress(data) if gz else data)
    expected = reference_frames(data)
    damage = first_difference(data)
    intact = [
        BASE_FILE[a:b]
        for a, b in zip(BASE_STARTS, BASE_STARTS[1:] + [len(BASE_FILE)])
        if b <= damage
    ]

    try:
        frames, _ = read_all(path, chunk_bytes, skip_corrupt=False)
    except InputError as error:
        assert expected is None, f"valid file rejected: {error}"
        assert error.path == path and "\n" not in str(error)
        if error.offset is not None:  # never reported before the first damaged record
            assert error.offset >= sum(len(f) for f in intact)
    else:
        assert expected is not None and frames == expected

    frames, report = read_all(path, chunk_bytes, skip_corrupt=True)
    assert all(reference_frames(f) == [f] for f in frames), "skip mode returned a damaged frame"
    assert frames[: len(intact)] == intact
    assert sum(len(f) for f in frames) + report.skipped_bytes == len(data)
    if expected is not None:
        assert frames == expected and report.skipped_records == 0
    else:
        assert report.skipped_records >= 1 and len(report.problems) == report.skipped_records


def test_crc_preset_bytes_turn_a_raw_crc_into_crc32c():
    """The raw CRC (register from 0) of CRC_PRESET_BYTES + p is CRC32C(p) xor 0xFFFFFFFF."""
    import google_crc32c

    assert google_crc32c.extend(0xFFFFFFFF, CRC_PRESET_BYTES) == 0  # the register reads 0xFFFFFFFF
    for payload in (b"", b"a", b"hello world", bytes(1000), np.random.default_rng(0).bytes(4097)):
        assert google_crc32c.extend(0xFFFFFFFF, CRC_PRESET_BYTES + payload) == google_crc32c.value(
            payload
        )


@given(
    payloads=st.lists(st.binary(max_size=300), min_size=1, max_size=30),
    flip=st.tuples(st.integers(0, 10**6), st.integers(0, 10**6), st.integers(0, 7)),
)
@settings(max_examples=200, deadline=None)
def test_one_pass_data_crc_check_accepts_valid_frames_and_catches_any_single_bad_one(
    payloads, flip
):
    """The all-at-once check agrees with checking every frame on its own when at most one
    frame is bad (then it never misses), and locates nothing itself: scan_frames falls
    back to per-frame CRCs and reports the first bad frame."""
    data = bytearray(b"".join(frame(p) for p in payloads))
    begin = np.array(frame_starts(bytes(data)), dtype=np.int64)
    ends = np.append(begin[1:], len(data))

    def check(data):
        raw = np.frombuffer(bytes(data), np.uint8)
        return payloads_match_stored_crcs(raw, begin, ends, stored_data_crcs(raw, ends))

    assert check(data)
    record, byte, bit = flip[0] % len(payloads), flip[1], flip[2]
    data_start, data_end = int(begin[record]) + 12, int(ends[record])  # the data and its stored CRC
    if data_end == data_start:
        return
    data[data_start + byte % (data_end - data_start)] ^= 1 << bit
    assert not check(data)
    starts, end, problem = scan_frames(bytes(data))
    assert starts == begin[:record].tolist() and end == begin[record] and "fails its CRC" in problem


def test_random_bytes_under_a_gz_name(tmp_path):
    path = str(tmp_path / "noise.tfrecord.gz")
    open(path, "wb").write(b"\x1f\x8b" + bytes(range(256)))
    for skip in (False, True):
        with pytest.raises(InputError, match="noise.tfrecord.gz"):
            read_all(path, 1 << 20, skip)


@given(data=st.lists(mutation, min_size=1, max_size=3).map(apply_mutations), skip=st.booleans())
@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
def test_fuzzed_tfrecord_input_full_pipeline(tmp_path_factory, data, skip):
    """The whole run ends in success (proven by verify) or an InputError, nothing else."""
    root = tmp_path_factory.mktemp("fuzz")
    os.makedirs(root / "in")
    (root / "in" / "a-fuzzed.tfrecord").write_bytes(data)
    (root / "in" / "b-good.tfrecord").write_bytes(BASE_FILE)
    pattern, output = str(root / "in" / "*.tfrecord"), str(root / "out" / "train")
    try:
        run_shuffle(pattern, output, "--num_piles=3", *(["--skip_corrupt"] if skip else []))
    except InputError as error:
        assert not skip or "holds no records" in str(error)
        assert "a-fuzzed.tfrecord" in str(error)
        assert_nothing_published(output)
    else:
        assert_verified(pattern, output)


# --- crashes: SIGKILL the whole run at points in pass 1 and pass 2, then re-run -----------------

CRASH_RECORDS, CRASH_FILES, CRASH_RECORD_BYTES, CRASH_PILES = 200_000, 8, 1000, 16


@pytest.fixture(scope="session")
def crash_data(tmp_path_factory):
    """About 200 MB of TFRecords and one uninterrupted run of them (the reference)."""
    root = tmp_path_factory.mktemp("crash")
    sample.write_tfrecord(
        str(root / "in"), records=CRASH_RECORDS, files=CRASH_FILES, record_bytes=CRASH_RECORD_BYTES
    )
    pattern = str(root / "in" / "*.tfrecord")
    reference = str(root / "reference" / "train")
    done = subprocess.run(
        crash_command(pattern, reference), capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    return pattern, reference


def crash_command(pattern, output):
    # runs on disk: their seams are killed
    return [
        sys.executable,
        "-m",
        "pileshuffle",
        "run",
        f"--input={pattern}",
        f"--output={output}",
        f"--num_piles={CRASH_PILES}",
        "--seed=11",
        "--memory=1MiB",
    ]


def digests(output):
    return {
        os.path.basename(p): hashlib.sha256(open(p, "rb").read()).hexdigest()
        for p in shards(output)
    }


def comparable_manifest(output):
    found = stable_manifest(output)
    found.pop("output", None)
    found["shards"] = [{**s, "path": os.path.basename(s["path"])} for s in found["shards"]]
    found["inputs"] = [{**s, "path": os.path.basename(s["path"])} for s in found.get("inputs", [])]
    return found


def files_in(directory, predicate):
    try:
        return [n for n in os.listdir(directory) if predicate(n)]
    except FileNotFoundError:
        return []


def test_sigkill_in_pass_1_and_pass_2_then_rerun_gives_identical_output(crash_data, tmp_path):
    from pileshuffle.names import staging_dir
    from pileshuffle.planning.locations import work_dir_for

    pattern, reference = crash_data
    output = str(tmp_path / "out" / "train")
    fragments = os.path.join(work_dir_for(output, None), "fragments")
    staging = staging_dir(output)
    points = {
        "pass 1: first run being written": lambda: files_in(fragments, lambda n: ".tmp-" in n),
        "pass 1: a run in place": lambda: files_in(fragments, lambda n: n.endswith(".run")),
        "pass 2: first shard being written": lambda: files_in(
            staging, lambda n: n.startswith("shard-")
        ),
        "pass 2: half the shards staged": lambda: (
            len(files_in(staging, lambda n: n.startswith("shard-") and ".tmp-" not in n))
            >= CRASH_PILES // 2
        ),
    }
    expected_digests, expected_manifest = digests(reference), comparable_manifest(reference)
    killed = []
    for name, ready in points.items():
        if kill_when(crash_command(pattern, output), ready):
            killed.append(name)
        assert not os.path.exists(f"{output}-manifest.json"), (
            f"{name}: a killed run left a manifest"
        )
        done = subprocess.run(
            crash_command(pattern, output), capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, f"re-run after kill at {name}: {done.stderr}"
        assert digests(output) == expected_digests, f"re-run after kill at {name} differs"
        assert comparable_manifest(output) == expected_manifest
        assert temp_leftovers(str(tmp_path / "out")) == [], f"{name}: temp files left"
        for path in shards(output) + [f"{output}-manifest.json"]:
            os.remove(path)
    print("killed at:", killed)
    assert len(killed) >= 3, f"only killed at {killed}"
    # the last re-run is also proven against the input
    subprocess.run(crash_command(pattern, output), check=True, capture_output=True, timeout=300)
    assert_verified(pattern, output)


def test_leftovers_of_a_killed_run_are_replaced_not_published(tmp_path, tfrecord_input):
    """What a run killed in Finalize leaves (its journal, some shards under final names, an
    old output's shard it was deleting, staging and work files, no manifest) is replaced by
    the re-run, which needs no --overwrite. (Only what the journal lists: see test_seams_run.)"""
    from pileshuffle.names import staging_dir
    from pileshuffle.planning.locations import work_dir_for

    output = str(tmp_path / "out" / "train")
    run_shuffle(tfrecord_input, output, "--num_piles=4", "--seed=2")
    expected = digests(output)
    os.remove(f"{output}-manifest.json")
    # as if killed mid-rename on a copying filesystem
    open(shards(output)[1], "wb").write(b"half a shard")
    old_output = f"{output}-00007-of-00008.tfrecord"
    open(old_output, "wb").write(b"a shard of a run with other piles")
    os.makedirs(os.path.join(work_dir_for(output, None), "fragments"))
    open(
        os.path.join(work_dir_for(output, None), "fragments", "s000000-p000001.arrows"), "wb"
    ).write(b"stale")
    os.makedirs(staging_dir(output), exist_ok=True)
    open(os.path.join(staging_dir(output), "shard-00000-of-00004.tfrecord"), "wb").write(b"stale")
    # Finalize's, before renaming
    with open(os.path.join(staging_dir(output), "journal-0123456789ab.json"), "w") as handle:
        json.dump(
            {
                "creates": [p for p in shards(output) if p != old_output]
                + [f"{output}-manifest.json"],
                "deletes": [old_output],
            },
            handle,
        )
    run_shuffle(tfrecord_input, output, "--num_piles=4", "--seed=2")
    assert digests(output) == expected
    assert temp_leftovers(str(tmp_path / "out")) == []
    assert_verified(tfrecord_input, output)


# --- bundles that run twice -----------------------------------------------------------------


class FailOnce:
    calls = 0


def test_the_local_runner_does_not_retry_a_failed_bundle():
    """Beam's FnApiRunner fails the pipeline on the first failure of a bundle (no retry),
    so a re-run bundle is simulated below instead."""
    import apache_beam as beam
    from apache_beam.runners.portability.fn_api_runner import FnApiRunner

    def fail_once(x):
        FailOnce.calls += 1
        if FailOnce.calls == 1:
            raise ValueError("first attempt fails")
        return x

    with pytest.raises(Exception, match="first attempt fails"):
        with beam.Pipeline(runner=FnApiRunner()) as p:
            _ = p | beam.Create([1]) | beam.Map(fail_once)
    assert FailOnce.calls == 1


def test_a_graph_that_fails_to_build_leaves_no_beam_folder_behind(tmp_path, monkeypatch):
    """Beam makes a local folder for every pipeline and removes it only in ``run``: a command
    whose graph fails to build (an error found while building) removes it, and a run that
    builds and runs leaves none either."""
    import tempfile

    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    from pileshuffle.engine.runner import execute
    from pileshuffle.errors import UsageError

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    options = PipelineOptions(["--direct_running_mode=in_memory"])

    def refused(pipeline):
        _ = pipeline | beam.Create([1])
        raise UsageError("refused while building")

    with pytest.raises(UsageError, match="refused while building"):
        execute(options, refused, 1)
    assert os.listdir(tmp_path) == []
    execute(options, lambda pipeline: pipeline | beam.Create([1]), 1)
    assert os.listdir(tmp_path) == []


def test_pass_1_run_twice_for_a_source_replaces_its_runs(tmp_path, tfrecord_input, monkeypatch):
    import pileshuffle.engine.runs as runs
    from pileshuffle.engine.inputs import match_inputs
    from pileshuffle.engine.transforms.pass_one import ReadSourceToPiles

    source = match_inputs(tfrecord_input)[0]
    directory = str(tmp_path / "fragments")
    dofn = ReadSourceToPiles("tfrecord", 5, 4, directory, chunk_bytes=20_000, run_bytes=60_000)

    def snapshot():
        return {
            n: open(os.path.join(directory, n), "rb").read() for n in sorted(os.listdir(directory))
        }

    first = list(dofn.process((source,)))
    committed = snapshot()
    assert len(committed) >= 3 and all(
        runs.read_run_index(b)[0].shape[1] == 4 for b in committed.values()
    )
    with monkeypatch.context() as patched:
        patched.setattr(
            runs.storage,
            "put_in_place",
            lambda *a: (_ for _ in ()).throw(RuntimeError("worker died")),
        )
        with pytest.raises(RuntimeError):
            list(dofn.process((source,)))
    assert {n for n in snapshot() if ".tmp-" not in n} == set(committed)
    second = list(dofn.process((source,)))
    finished = {n: b for n, b in snapshot().items() if ".tmp-" not in n}
    assert finished == committed  # same names, same bytes: replaced, not duplicated
    plain = lambda outputs: [repr(getattr(x, "value", x)) for x in outputs]  # noqa: E731
    assert plain(first) == plain(second)


class _Twice:
    """State of the flaky DoFns below (the in-process runner shares this module)."""

    seen = set()


def _flaky_read_class():
    from pileshuffle.engine.runs import PileRuns
    from pileshuffle.engine.transforms.pass_one import ReadSourceToPiles

    class FlakyRead(ReadSourceToPiles):
        """Every group of sources is attempted three times, as a retrying runner would: attempt 1
        writes its runs but its output is lost; attempt 2 dies before its first run is in place;
        attempt 3 succeeds."""

        def process(self, group):
            key = ("read", group[0].id)
            if key not in _Twice.seen:
                _Twice.seen.add(key)
                self._chunk_bytes, self._run_bytes = 20_000, 60_000
                for _ in super().process(group):
                    pass
                original = PileRuns._write_run
                PileRuns._write_run = lambda *a: (_ for _ in ()).throw(RuntimeError("died"))
                try:
                    for _ in super().process(group):
                        pass
                except RuntimeError:
                    pass
                finally:
                    PileRuns._write_run = original
            yield from super().process(group)

    return FlakyRead


def _flaky_write_class():
    from pileshuffle.engine.transforms.shards import WriteShard

    class FlakyWrite(WriteShard):
        """Every pile is written twice; the first attempt's output is lost."""

        def process(self, element, direct=False):  # a Pile, or a PileGroup of small piles
            key = ("write", tuple(p.index for p in getattr(element, "piles", [element])))
            if key not in _Twice.seen:
                _Twice.seen.add(key)
                for _ in super().process(element, direct):
                    pass
            yield from super().process(element, direct)

    return FlakyWrite


@pytest.mark.parametrize("intermediate", ["files", "shuffle"])
def test_rerun_bundles_neither_duplicate_nor_lose_records(
    tmp_path, tfrecord_input, monkeypatch, intermediate
):
    import pileshuffle.engine.transforms.graph as graph
    import pileshuffle.engine.transforms.write as write

    plain = str(tmp_path / "plain" / "train")
    run_shuffle(
        tfrecord_input, plain, "--num_piles=4", "--seed=9", f"--intermediate={intermediate}"
    )
    _Twice.seen.clear()
    monkeypatch.setattr(graph, "ReadSourceToPiles", _flaky_read_class())
    monkeypatch.setattr(write, "WriteShard", _flaky_write_class())
    retried = str(tmp_path / "retried" / "train")
    run_shuffle(
        tfrecord_input, retried, "--num_piles=4", "--seed=9", f"--intermediate={intermediate}"
    )
    assert {k for k, _ in _Twice.seen} == {"read", "write"} and sum(
        len(p) for k, p in _Twice.seen if k == "write"
    ) == 4
    assert digests(retried) == digests(plain)
    assert manifest(retried)["totals"]["records"] == 3000
    assert temp_leftovers(str(tmp_path / "retried")) == []
    assert_verified(tfrecord_input, retried)


# --- full disks ------------------------------------------------------------------------------


@pytest.fixture
def twelve_mb(tmp_path):
    sample.write_tfrecord(str(tmp_path / "in"), records=12_000, files=3, record_bytes=1000)
    return str(tmp_path / "in" / "*.tfrecord")


def test_a_run_the_disk_cannot_hold_is_refused_before_it_writes(
    small_tmpfs, twelve_mb, tmp_path, caplog
):
    """12 MB of input on an 8 MB disk: the pass-1 runs and the staged shards (about 25 MB) cannot fit,
    which the plan knows; run refuses up front, naming where, what it needs and what is free. (A disk
    that fills during a run anyway is test_injected_enospc's.)"""
    output = os.path.join(small_tmpfs, "train")  # fragments go beside the output by default
    with pytest.raises(OutputError) as caught:
        run_shuffle(twelve_mb, output, "--num_piles=4")
    message = str(caught.value)
    assert message.startswith("not enough disk space: ") and ".pileshuffle-work-" in message, (
        message
    )
    assert (
        "pileshuffle-staging" in message
        and "bytes free" in message
        and "nothing was written" in message
    )
    assert os.listdir(small_tmpfs) == []  # not even the lock
    with pytest.raises(
        OutputError, match=f"not enough disk space: {re.escape(output)}.pileshuffle-staging has"
    ):
        # the shards alone
        run_shuffle(twelve_mb, output, "--num_piles=4", f"--temp_location={tmp_path / 'temp'}")
    assert os.listdir(small_tmpfs) == [] and temp_leftovers(str(tmp_path)) == []
    with pytest.raises(OutputError, match="not enough disk space"):
        run_shuffle(twelve_mb, output, "--layout=store", "--num_piles=4")
    assert os.listdir(small_tmpfs) == []


class _FullDisk(io.RawIOBase):
    def __init__(self, inner):
        self._inner = inner

    def writable(self):
        return True

    def write(self, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    def close(self):
        self._inner.close()
        super().close()


@pytest.mark.parametrize(
    "where, location",
    [
        ("/fragments/", ".pileshuffle-work-"),
        ("pileshuffle-staging/shard-", ".pileshuffle-staging"),
        ("pileshuffle-staging/manifest-", ".pileshuffle-staging"),
    ],
)
def test_injected_enospc(tmp_path, tfrecord_input, monkeypatch, where, location):
    import pileshuffle.io.storage as storage_module

    real = storage_module.open_write.__wrapped__

    def open_write(path, *args, **kwargs):
        handle = real(path, *args, **kwargs)
        return _FullDisk(handle) if where in path else handle

    # every file a run writes is opened by it
    monkeypatch.setattr(
        storage_module, "open_write", storage_module.cloud.refusals_explained(open_write)
    )
    output = str(tmp_path / "out" / "train")
    with pytest.raises(OutputError) as caught:
        # runs on disk, not kept in memory
        run_shuffle(tfrecord_input, output, "--num_piles=4", "--memory=1MiB")
    message = str(caught.value)
    assert (
        message.startswith("cannot write to ")
        and location in message
        and "No space left on device" in message
    )
    assert "[while running" not in message and "\n" not in message
    assert "this run needs about" in message
    assert_nothing_published(output)


def test_plan_and_run_agree_on_a_disk_too_small(tmp_path, tfrecord_input, monkeypatch, capsys):
    import shutil as shutil_module

    from apache_beam.options.pipeline_options import PipelineOptions

    import pileshuffle.planning.plan as plan_module
    import pileshuffle.planning.space as space_module
    from pileshuffle.commands.plan import main as plan_main

    usage = shutil_module.disk_usage(str(tmp_path))
    monkeypatch.setattr(space_module.shutil, "disk_usage", lambda path: usage._replace(free=1000))
    output = str(tmp_path / "out" / "train")
    # runs on disk
    args = [
        f"--input={tfrecord_input}",
        f"--output={output}",
        "--num_piles=4",
        "--memory=1MiB",
    ]
    plan = plan_module.make_plan(PipelineOptions(args))
    ((need, free),) = set(plan.space.values())  # work dir and staging share one filesystem
    assert free == 1000 and need > 1.9 * plan.input_bytes
    # runs kept in memory: shards only
    kept = plan_module.make_plan(PipelineOptions(args[:-1] + ["--memory=4GiB"]))
    assert 0.9 * plan.input_bytes < set(kept.space.values()).pop()[0] < 1.1 * plan.input_bytes
    assert plan_main(args) == 0
    printed = capsys.readouterr().out
    assert "NOT ENOUGH" in printed and "`run` refuses it" in printed
    with pytest.raises(OutputError) as refused:
        run_shuffle(tfrecord_input, output, "--num_piles=4", "--memory=1MiB")
    assert f"have 1,000 bytes free, and this run writes about {need:,} bytes" in str(refused.value)
    assert plan.work_dir in str(refused.value) and "pileshuffle-staging" in str(refused.value)
    assert not os.path.exists(os.path.dirname(output)) or os.listdir(os.path.dirname(output)) == []
    monkeypatch.undo()
    assert plan_main(args) == 0 and "NOT ENOUGH" not in capsys.readouterr().out


# --- oversized piles -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def many_small(tmp_path_factory):
    root = tmp_path_factory.mktemp("piles")
    sample.write_tfrecord(str(root / "in"), records=24_000, files=3, record_bytes=40)
    return str(root / "in" / "*.tfrecord"), root


def test_oversized_piles_are_split_never_loaded_whole_and_stay_a_permutation(
    many_small, monkeypatch
):
    import pileshuffle.engine.fragments as fragments
    from pileshuffle.commands.report import summary

    pattern, root = many_small
    loads = []
    real_read_table = fragments.read_table

    def recording_read_table(fragment):
        table = real_read_table(fragment)
        loads.append((fragment.path, table.nbytes))
        return table

    monkeypatch.setattr(fragments, "read_table", recording_read_table)
    limit = 20_000
    split = str(root / "split" / "train")
    result = run_shuffle(pattern, split, "--num_piles=2", f"--max_pile_bytes={limit}", "--seed=4")
    assert manifest(split)["piles_split"] == 2
    assert "split again: 2" in summary(result)
    assert loads and all("/splits/" in path for path, _ in loads), "a whole pile was loaded"
    assert max(n for _, n in loads) <= limit
    assert_verified(pattern, split)

    monkeypatch.undo()
    again = str(root / "again" / "train")
    run_shuffle(pattern, again, "--num_piles=2", f"--max_pile_bytes={limit}", "--seed=4")
    shuffled = str(root / "shuffle-mode" / "train")
    run_shuffle(
        pattern,
        shuffled,
        "--num_piles=2",
        f"--max_pile_bytes={limit}",
        "--seed=4",
        "--intermediate=shuffle",
    )
    whole = str(root / "unsplit" / "train")
    run_shuffle(pattern, whole, "--num_piles=2", "--seed=4")
    assert manifest(whole)["piles_split"] == 0 and manifest(shuffled)["piles_split"] == 2
    assert digests(split) == digests(again) == digests(shuffled) == digests(whole)
    for output in (again, shuffled, whole):
        assert_verified(pattern, output)

    positions = np.array([sample.index_of(p) for p in output_payloads(split)])
    assert len(positions) == 24_000 and len(set(positions.tolist())) == 24_000
    rho = np.corrcoef(positions, np.arange(len(positions)))[0, 1]  # ranks are the values themselves
    assert abs(rho) < 0.05, rho


def _one_fragment_pile(tmp_path, keys, max_pile_bytes):
    import pyarrow as pa

    from pileshuffle.engine.fragments import Fragment, FragmentFiles
    from pileshuffle.engine.pile import Pile
    from pileshuffle.names import HASH_COLUMN, KEY_COLUMN
    from pileshuffle.records.fingerprint import Fingerprint

    payloads = [b"%08d" % i + b"x" * 40 for i in range(len(keys))]
    table = pa.table(
        {
            "record": pa.array(payloads, pa.binary()),
            KEY_COLUMN: pa.array(keys, pa.uint64()),
            HASH_COLUMN: pa.array(np.zeros(len(keys), np.uint64)),
        }
    )
    files = FragmentFiles(str(tmp_path / "fragments"), "s000000")
    files.append(0, table, Fingerprint())
    (committed,) = files.commit()
    path, records, nbytes = committed.path, committed.records, committed.nbytes
    fragment = Fragment((0, 0), records, nbytes, Fingerprint(), path=path)
    return Pile(0, 1, (fragment,), max_pile_bytes, str(tmp_path / "work")), payloads


def test_split_recurses_when_capped_and_keeps_the_order(tmp_path, monkeypatch):
    import pileshuffle.engine.pile as pile_module

    keys = np.random.default_rng(5).integers(0, 2**64, 5000, dtype=np.uint64)
    pile, payloads = _one_fragment_pile(tmp_path, keys, max_pile_bytes=4000)
    monkeypatch.setattr(pile_module, "MAX_SPLIT_WAYS", 2)  # forces several levels of splitting
    depths = []
    real_ordered = pile_module.Pile.ordered

    def recording(self, dropped=None):
        depths.append(self.depth)
        return real_ordered(self, dropped)

    monkeypatch.setattr(pile_module.Pile, "ordered", recording)
    written = [r for t in pile.tables() for r in t.column("record").to_pylist()]
    assert written == [payloads[i] for i in np.argsort(keys, kind="stable")]
    assert max(depths) >= 4


def test_split_stops_on_records_that_share_one_key(tmp_path):
    """Keyed composed use with duplicate ids gives equal keys: splitting cannot separate
    them, so it stops at a bounded depth and keeps their order."""
    keys = np.full(300, 12345, dtype=np.uint64)
    pile, payloads = _one_fragment_pile(tmp_path, keys, max_pile_bytes=1000)
    written = [r for t in pile.tables() for r in t.column("record").to_pylist()]
    assert written == payloads


def test_a_split_parquet_pile_gives_the_same_file(tmp_path):
    """Parquet row groups end where the shard's bytes pass a multiple of the row-group size, not where
    pass 2 cut its tables: a pile split into sub-piles gives the same file as the pile whole."""
    sample.write_parquet(str(tmp_path / "in"), records=5000, files=3, record_bytes=100)
    pattern = str(tmp_path / "in" / "*.parquet")
    run_shuffle(pattern, str(tmp_path / "whole" / "o"), "--num_piles=4")
    split = run_shuffle(
        pattern, str(tmp_path / "split" / "o"), "--num_piles=4", "--max_pile_bytes=16KiB"
    )
    assert split["piles_split"] == 4
    assert digests(str(tmp_path / "split" / "o")) == digests(str(tmp_path / "whole" / "o"))
