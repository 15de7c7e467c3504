"""Pile stores: run --layout store, append, expire, gc, materialize, verify, WritePileStore.

Records are read back with the store's own reading helper (``store.read.live_piles``,
the piles' fragments in (generation, writer) order, each pile sorted by key), the same
definition the loader follows (docs/stores.md)."""

import collections
import glob
import json
import os
import subprocess
import sys

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from helpers import FAST, kill_when, read_tfrecord_payloads, run_shuffle, shard_bytes, shards
from hypothesis import given, settings
from hypothesis import strategies as st

from pileshuffle import ShuffleToPiles, names
from pileshuffle.commands import append as append_command
from pileshuffle.commands import materialize as materialize_command
from pileshuffle.commands import sample
from pileshuffle.formats.tfrecord import FRAME_COLUMN, HEADER_BYTES, frame
from pileshuffle.store import expire as store_expire
from pileshuffle.store import layout
from pileshuffle.store import write as store_write
from pileshuffle.store.composed import WritePileStore
from pileshuffle.store.expire import expire
from pileshuffle.store.lock import lock_holder, lock_path
from pileshuffle.store.read import check_store, live_piles
from pileshuffle.store.write import writer_groups


def store_files(prefix, generation=None):
    pattern = "g*" if generation is None else names.generation_dir_name(generation)
    return sorted(glob.glob(os.path.join(names.store_dir(prefix), pattern, "*.arrows")))


def payloads_in_order(prefix, version=None):
    """The live records in written order (piles 0..M-1, each by key), as payload bytes."""
    manifest = layout.read_store_manifest(prefix, version)
    out = []
    for pile in live_piles(prefix, manifest):
        for table in pile.tables():
            column = table.column(0)
            values = column.to_pylist()
            if table.column_names == [FRAME_COLUMN]:
                values = [v[HEADER_BYTES:-4] for v in values]
            out.extend(values)
    return out


def write_generation_files(directory, tag, records, files=3, size=60):
    """TFRecord files of payloads ``tag:index:filler``: each generation's records are distinct."""
    os.makedirs(directory, exist_ok=True)
    rng = np.random.default_rng(abs(hash(tag)) % 2**32)
    for f in range(files):
        with open(os.path.join(directory, f"{tag}-{f:03d}.tfrecord"), "wb") as handle:
            for i in range(f, records, files):
                filler = bytes(rng.integers(97, 123, int(rng.integers(1, size)), dtype=np.uint8))
                handle.write(frame(b"%s:%06d:" % (tag.encode(), i) + filler))
    return os.path.join(directory, f"{tag}-*.tfrecord")


def expected_records(pattern):
    return collections.Counter(read_tfrecord_payloads(sorted(glob.glob(pattern))))


def run_store(pattern, prefix, *args):
    return run_shuffle(pattern, prefix, "--layout=store", *args)


def append(prefix, pattern, *args):
    return append_command.append([f"--store={prefix}", f"--input={pattern}", *FAST, *args])


def materialize(prefix, output, *args):
    return materialize_command.materialize(
        [f"--store={prefix}", f"--output={output}", *FAST, *args]
    )


def comparable(manifest):
    """A store manifest without its times (equal for the same inputs, seed and piles)."""
    found = json.loads(json.dumps(manifest))
    for key in ("published", "wall_seconds"):
        found.pop(key, None)
    for generation in found["generations"]:
        generation.pop("created")
    return found


def file_digests(prefix):
    return {
        os.path.relpath(p, names.store_dir(prefix)): open(p, "rb").read()
        for p in store_files(prefix)
    }


# --- run --layout store + materialize == run ---------------------------------------------------


@pytest.mark.parametrize(
    "fixture, fmt",
    [("tfrecord_input", "tfrecord"), ("parquet_input", "parquet"), ("jsonl_input", "jsonl")],
)
def test_store_then_materialize_is_byte_identical_to_run(tmp_path, request, fixture, fmt):
    pattern = request.getfixturevalue(fixture)
    args = [f"--format={fmt}", "--num_piles=5", "--seed=7"]
    run_shuffle(pattern, str(tmp_path / "run" / "out"), *args)
    prefix = str(tmp_path / "store" / "s")
    manifest = run_store(pattern, prefix, *args)
    assert manifest["version"] == 1 and [g["generation"] for g in manifest["generations"]] == [0]
    assert manifest["totals"]["records"] == 3000 and manifest["format"] == fmt
    assert len(store_files(prefix)) <= 3 * 5  # writers (one per input file here) x piles
    assert check_store(prefix)[0] == []
    written = materialize(prefix, str(tmp_path / "mat" / "out"))
    assert shard_bytes(str(tmp_path / "mat" / "out")) == shard_bytes(str(tmp_path / "run" / "out"))
    assert written["output_fingerprint"] == manifest["generations"][0]["fingerprint"]
    assert [os.path.basename(p) for p in shards(str(tmp_path / "mat" / "out"))] == [
        os.path.basename(p) for p in shards(str(tmp_path / "run" / "out"))
    ]


def test_files_per_generation_are_bounded_by_writers_times_piles(tmp_path, monkeypatch):
    """60 small inputs, 8 piles, 4 writers: at most 32 files (not 60 x 8), and the bound
    holds for an append too; the order stays run's (materialize == run)."""
    sample.write_tfrecord(str(tmp_path / "in"), records=6000, files=60, record_bytes=50)
    sample.write_tfrecord(
        str(tmp_path / "new"), records=3000, files=30, record_bytes=50, name="new"
    )
    pattern = str(tmp_path / "in" / "*.tfrecord")
    monkeypatch.setattr(store_write, "STORE_WRITERS", 4)
    prefix = str(tmp_path / "s")
    manifest = run_store(pattern, prefix, "--num_piles=8", "--seed=2")
    assert manifest["generations"][0]["writers"] == 4
    assert 8 < len(store_files(prefix, 0)) <= 4 * 8
    append(prefix, str(tmp_path / "new" / "*.tfrecord"))
    assert len(store_files(prefix, 1)) <= 4 * 8
    monkeypatch.setattr(store_write, "STORE_WRITERS", 1)
    run_shuffle(pattern, str(tmp_path / "run" / "r"), "--num_piles=8", "--seed=2")
    only_first = str(tmp_path / "first")
    run_store(pattern, only_first, "--num_piles=8", "--seed=2")
    assert len(store_files(only_first)) == 8  # one writer: one file per pile
    materialize(prefix, str(tmp_path / "m" / "m"), "--version=1")
    assert shard_bytes(str(tmp_path / "m" / "m")) == shard_bytes(str(tmp_path / "run" / "r"))


@given(sizes=st.lists(st.integers(0, 10**9), min_size=1, max_size=300), writers=st.integers(1, 40))
@settings(max_examples=200, deadline=None)
def test_writer_groups_are_contiguous_bounded_and_deterministic(sizes, writers):
    """Every source in exactly one group, groups in source order (so (writer, position) order
    is source order), at most ``writers`` groups, none empty, and no group holds more than
    its share plus one source's bytes."""
    from pileshuffle.engine.transforms.assign import Source

    sources = [Source(i, f"f{i}", size) for i, size in enumerate(sizes)]
    groups = writer_groups(sources, writers)
    assert [s.id for g in groups for s in g.sources] == list(range(len(sizes)))
    assert [g.writer for g in groups] == list(range(len(groups))) and 1 <= len(groups) <= min(
        writers, len(sizes)
    )
    assert all(g.sources for g in groups)
    assert writer_groups(list(reversed(sources)), writers) == groups
    weights = [max(1, s) for s in sizes]
    share = sum(weights) / min(writers, len(sizes))
    assert all(sum(max(1, s.size) for s in g.sources) <= share + max(weights) for g in groups)


# --- the moving window -------------------------------------------------------------------------


def test_window_is_exactly_the_live_generations_after_appends_and_expires(tmp_path):
    prefix = str(tmp_path / "w")
    patterns = [
        write_generation_files(str(tmp_path / f"in{g}"), f"day{g}", 900 + 100 * g) for g in range(5)
    ]
    run_store(patterns[0], prefix, "--num_piles=4", "--seed=5")
    for pattern in patterns[1:4]:
        append(prefix, pattern)

    def window():
        return collections.Counter(payloads_in_order(prefix))

    assert window() == sum((expected_records(p) for p in patterns[:4]), collections.Counter())
    manifest, dropped, _ = expire(prefix, keep_generations=2, grace_seconds=3600)
    assert dropped == [0, 1] and [g["generation"] for g in manifest["generations"]] == [2, 3]
    assert window() == expected_records(patterns[2]) + expected_records(patterns[3])
    assert store_files(prefix, 0), "files of a superseded version are kept for the grace period"
    append(prefix, patterns[4])
    assert window() == expected_records(patterns[2]) + expected_records(
        patterns[3]
    ) + expected_records(patterns[4])
    cutoff = layout.read_store_manifest(prefix)["generations"][-1]["created"]
    manifest, dropped, deleted = expire(prefix, before=cutoff, grace_seconds=0)
    assert dropped == [2, 3] and deleted["generations"] == [0, 1, 2, 3]
    assert window() == expected_records(patterns[4])
    assert sorted(os.listdir(names.store_dir(prefix))) == [
        names.generation_dir_name(4),
        names.store_manifest_name(7),
    ]
    assert manifest["next_generation"] == 5 and manifest["totals"]["records"] == 1300
    assert check_store(prefix)[0] == []
    append(prefix, patterns[0])
    # the written order: piles in order, each sorted by key; materialize writes exactly it, also
    # when piles over --max_pile_bytes are ordered in sub-piles
    whole = materialize(prefix, str(tmp_path / "m" / "m"))
    assert read_tfrecord_payloads(shards(str(tmp_path / "m" / "m"))) == payloads_in_order(prefix)
    # the smallest sub-pile
    split = materialize(prefix, str(tmp_path / "s" / "s"), "--max_pile_bytes=16KiB")
    assert split["piles_split"] == 4 and whole["piles_split"] == 0
    assert shard_bytes(str(tmp_path / "s" / "s")) == shard_bytes(str(tmp_path / "m" / "m"))
    with pytest.raises(Exception, match="is the store's own prefix"):
        materialize(prefix, prefix)


def test_uniform_within_the_window(tmp_path):
    """chi-square over (generation x output block) of a materialized 3-generation store does
    not reject uniformity; the same test rejects the stored (unsorted) file order."""
    from scipy.stats import chi2_contingency

    prefix = str(tmp_path / "u")
    patterns = [
        write_generation_files(str(tmp_path / f"in{g}"), f"gen{g}", 3000, files=2, size=20)
        for g in range(4)
    ]
    run_store(patterns[0], prefix, "--num_piles=6", "--seed=13")
    for pattern in patterns[1:]:
        append(prefix, pattern)
    expire(prefix, keep_generations=3, grace_seconds=0)
    materialize(prefix, str(tmp_path / "m" / "m"))
    order = [
        int(p.split(b":")[0][3:]) for p in read_tfrecord_payloads(shards(str(tmp_path / "m" / "m")))
    ]
    assert sorted(set(order)) == [1, 2, 3] and len(order) == 9000

    def table(generations):
        blocks = np.arange(len(generations)) * 10 // len(generations)
        return np.array(
            [
                [np.sum((blocks == b) & (np.array(generations) == g)) for b in range(10)]
                for g in (1, 2, 3)
            ]
        )

    assert chi2_contingency(table(order)).pvalue > 0.001
    stored = []
    # files in (generation, writer) order, unsorted
    for pile in live_piles(prefix, layout.read_store_manifest(prefix)):
        for fragment in pile.fragments:
            from pileshuffle.engine.fragments import read_table

            stored += [
                int(v[HEADER_BYTES:].split(b":")[0][3:])
                for v in read_table(fragment).column(0).to_pylist()
            ]
    assert chi2_contingency(table(stored)).pvalue < 1e-6


def test_later_generations_draw_keys_from_their_own_stream(tmp_path):
    """The same file appended again (another path) gets other keys; generation 0's keys are run's."""
    from pileshuffle.engine.fragments import read_table
    from pileshuffle.names import KEY_COLUMN
    from pileshuffle.records.keys import position_keys

    sample.write_tfrecord(str(tmp_path / "a"), records=500, files=1, record_bytes=40)
    os.makedirs(tmp_path / "b")
    os.link(tmp_path / "a" / "part-000.tfrecord", tmp_path / "b" / "part-000.tfrecord")
    prefix = str(tmp_path / "k")
    run_store(str(tmp_path / "a" / "*.tfrecord"), prefix, "--num_piles=1", "--seed=4")
    # the same records again
    append(prefix, str(tmp_path / "b" / "*.tfrecord"), "--allow_duplicate_inputs")
    keys = [
        read_table(f).column(KEY_COLUMN).to_numpy()
        for f in live_piles(prefix, layout.read_store_manifest(prefix))[0].fragments
    ]
    places = np.arange(500) * (12 + 40 + 4)  # a frame: header, 40-byte payload, footer
    assert (keys[0] == position_keys(4, (0, 0), places)).all()
    assert (keys[1] == position_keys(4, (store_write.GENERATION_STREAM, 1, 0), places)).all()
    assert not np.isin(keys[1], keys[0]).any()


# --- commands refuse what they must ------------------------------------------------------------


def test_append_is_idempotent_and_refuses_what_does_not_fit(tmp_path, parquet_input):
    prefix = str(tmp_path / "s")
    first = write_generation_files(str(tmp_path / "in0"), "a", 300)
    run_store(first, prefix, "--num_piles=3")
    second = write_generation_files(str(tmp_path / "in1"), "b", 300)
    assert append(prefix, second)["version"] == 2
    # the same inputs again (a re-run after a crash): nothing to do
    assert append(prefix, second)["version"] == 2
    again = run_store(first, str(tmp_path / "t"), "--num_piles=3")
    assert (
        run_store(first, str(tmp_path / "t"), "--num_piles=3")["version"] == again["version"] == 1
    )
    with pytest.raises(Exception, match="a store exists"):
        run_store(second, str(tmp_path / "t"), "--num_piles=3")
    with pytest.raises(Exception, match="no store at"):
        append(str(tmp_path / "nothing"), second)
    with pytest.raises(Exception, match="a pile store's file"):
        append(prefix, os.path.join(names.store_dir(prefix), "g000000", "*.arrows"))
    # a pattern that reaches only the store's files is refused, naming them, and nothing is appended
    both = f"{second},{os.path.join(names.store_dir(prefix), '*', '*')}"
    with pytest.raises(Exception, match="matches only files pileshuffle wrote"):
        append(prefix, both)
    assert layout.read_store_manifest(prefix)["version"] == 2
    pq_store = str(tmp_path / "pq")
    run_store(parquet_input, pq_store, "--format=parquet", "--num_piles=2")
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(tmp_path / "other")
    pq.write_table(pa.table({"index": [1, 2]}), str(tmp_path / "other" / "x.parquet"))
    with pytest.raises(Exception, match="x.parquet: has a different schema from the store's"):
        append(pq_store, str(tmp_path / "other" / "*.parquet"))
    assert lock_holder(pq_store) is None, "a refused append releases the lock"
    sample.write_parquet(
        str(tmp_path / "more"), records=700, files=2, record_bytes=80, seed=9, name="more"
    )
    assert append(pq_store, str(tmp_path / "more" / "*.parquet"))["totals"]["records"] == 3700
    written = materialize(pq_store, str(tmp_path / "pqm" / "m"))
    rows = pa.concat_tables([pq.read_table(p) for p in shards(str(tmp_path / "pqm" / "m"))])
    assert (
        rows.num_rows == 3700
        and written["schema"]["fields"] == layout.read_store_manifest(pq_store)["schema"]["fields"]
    )


def test_a_second_writer_is_refused_while_the_first_holds_the_lock(tmp_path):
    """Two appends at once: the second refuses, naming the first; a lock whose holder died is taken over."""
    prefix = str(tmp_path / "s")
    run_store(write_generation_files(str(tmp_path / "in0"), "a", 300), prefix, "--num_piles=2")
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        lock = {
            "command": "pileshuffle append --store s --input day7",
            "host": os.uname().nodename,
            "pid": holder.pid,
            "since": "2026-11-23T20:00:00Z",
            "token": "t",
        }
        with open(lock_path(prefix), "w") as handle:
            json.dump(lock, handle)
        new = write_generation_files(str(tmp_path / "in1"), "b", 300)
        done = subprocess.run(
            [sys.executable, "-m", "pileshuffle", "append", f"--store={prefix}", f"--input={new}"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 2
        assert (
            f"is locked by `pileshuffle append --store s --input day7` (pid {holder.pid}"
            in done.stderr
        )
        with pytest.raises(Exception, match="is locked by"):
            expire(prefix, keep_generations=0, grace_seconds=0)
        assert layout.read_store_manifest(prefix)["version"] == 1
    finally:
        holder.kill()
        holder.wait()
    assert append(prefix, new)["version"] == 2  # its holder is gone: stale, taken over
    assert lock_holder(prefix) is None


def test_publishing_a_version_that_appeared_meanwhile_is_refused(tmp_path):
    prefix = str(tmp_path / "s")
    manifest = run_store(
        write_generation_files(str(tmp_path / "in0"), "a", 100), prefix, "--num_piles=2"
    )
    with pytest.raises(layout.VersionConflict, match="manifest-00000001.json appeared"):
        layout.publish_manifest(prefix, manifest)
    assert layout.read_store_manifest(prefix) == {
        k: v for k, v in manifest.items() if k != "wall_seconds"
    }


# --- verify ------------------------------------------------------------------------------------


def test_verify_names_missing_and_damaged_store_files(tmp_path):
    prefix = str(tmp_path / "s")
    run_store(
        write_generation_files(str(tmp_path / "in0"), "a", 2000, size=200), prefix, "--num_piles=3"
    )
    append(prefix, write_generation_files(str(tmp_path / "in1"), "b", 500))
    command = [sys.executable, "-m", "pileshuffle", "verify", f"--output={prefix}"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert (
        done.returncode == 0
        and "OK: store" in done.stdout
        and "2,500 records in 2 generation(s)" in done.stdout
    )
    from pileshuffle.commands.verify import verify

    both = f"{tmp_path / 'in0' / '*.tfrecord'},{tmp_path / 'in1' / '*.tfrecord'}"
    assert verify(both, prefix) == []
    only_first = verify(str(tmp_path / "in0" / "*.tfrecord"), prefix)
    assert (
        len(only_first) == 1
        and "is not the store's live generations: 2,000 records" in only_first[0]
    )
    assert "not 2,500 records" in only_first[0]
    files = store_files(prefix)
    data = bytearray(open(files[0], "rb").read())
    data[len(data) // 2] ^= 0x10  # a payload byte: same size, same IPC framing
    open(files[0], "wb").write(bytes(data))
    os.remove(files[-1])
    with open(files[1], "r+b") as handle:
        handle.truncate(100)
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert f"store file {files[0]} is damaged" in done.stderr
    assert f"store file {files[-1]} is missing" in done.stderr
    assert f"store file {files[1]} is damaged" in done.stderr
    assert "3 problem(s)" in done.stderr


# --- composed: a user's pipeline writes a generation -------------------------------------------


@pytest.mark.parametrize("temp", [True, False], ids=["files", "shuffle"])
def test_write_pile_store_in_a_users_pipeline(tmp_path, temp):
    prefix = str(tmp_path / "c")
    days = [[b"day%d-%05d" % (d, i) for i in range(2000)] for d in range(2)]
    for rows in days:
        options = PipelineOptions(["--direct_running_mode=in_memory"])
        with beam.Pipeline(runner=FnApiRunner(), options=options) as p:
            (
                p
                | beam.Create(rows, reshuffle=False)
                | beam.Map(lambda r: r.upper())
                | ShuffleToPiles(
                    num_piles=4, seed=3, temp_location=str(tmp_path / "tmp") if temp else None
                )
                | WritePileStore(prefix, format="tfrecord", num_piles=4, seed=3)
            )
    manifest = layout.read_store_manifest(prefix)
    assert [g["generation"] for g in manifest["generations"]] == [0, 1]
    assert all(len(g["files"]) <= 4 for g in manifest["generations"])
    assert collections.Counter(payloads_in_order(prefix)) == collections.Counter(
        r.upper() for d in days for r in d
    )
    assert check_store(prefix)[0] == [] and lock_holder(prefix) is None
    assert not glob.glob(str(tmp_path / "tmp" / "*" / "*"))  # pass-1 fragments removed
    materialize(prefix, str(tmp_path / "m" / "m"))
    assert read_tfrecord_payloads(shards(str(tmp_path / "m" / "m"))) == payloads_in_order(prefix)


# --- crashes -----------------------------------------------------------------------------------

CRASH_RECORDS, CRASH_FILES = 60_000, 6


def cli(*args):
    return [sys.executable, "-m", "pileshuffle", *args]


def names_in(directory, predicate):
    try:
        return [n for n in os.listdir(directory) if predicate(n)]
    except FileNotFoundError:
        return []


def test_killed_run_append_and_expire_leave_the_previous_version_and_rerun_finishes(tmp_path):
    sample.write_tfrecord(
        str(tmp_path / "in"), records=CRASH_RECORDS, files=CRASH_FILES, record_bytes=500
    )
    # other records (the same ones would be refused as copies)
    sample.write_tfrecord(
        str(tmp_path / "new"),
        records=CRASH_RECORDS,
        files=CRASH_FILES,
        record_bytes=500,
        name="new",
        seed=1,
    )
    first, second = str(tmp_path / "in" / "*.tfrecord"), str(tmp_path / "new" / "*.tfrecord")
    # --max_pile_bytes: auto would size it from the memory free at that moment (the manifests
    # of two stores made apart would differ)
    run_args = ["run", "--layout=store", f"--input={first}", "--num_piles=6", "--seed=3"]
    run_args.append("--max_pile_bytes=64MiB")
    # the reference: uninterrupted
    reference = str(tmp_path / "ref")
    subprocess.run(
        cli(*run_args, f"--output={reference}"), check=True, capture_output=True, timeout=120
    )
    subprocess.run(
        cli("append", f"--store={reference}", f"--input={second}"),
        check=True,
        capture_output=True,
        timeout=120,
    )
    prefix = str(tmp_path / "s")
    g0, g1 = (os.path.join(names.store_dir(prefix), names.generation_dir_name(g)) for g in (0, 1))
    killed = []
    run_points = {
        "run: first data file being written": lambda: names_in(g0, lambda n: ".tmp-" in n),
        "run: a writer's files committed": lambda: names_in(g0, lambda n: n.endswith(".arrows")),
    }
    for name, ready in run_points.items():
        if (
            kill_when(cli(*run_args, f"--output={prefix}"), ready)
            and layout.read_store_manifest(prefix) is None
        ):
            # else the kill came after publication (a loaded machine): still a valid state
            killed.append(name)
        assert check_store(prefix)[0] in (
            [],
            [f"no store at {names.store_dir(prefix)} (no manifest-*.json)"],
        )
    subprocess.run(
        cli(*run_args, f"--output={prefix}"), check=True, capture_output=True, timeout=120
    )
    append_points = {
        "append: first data file being written": lambda: names_in(g1, lambda n: ".tmp-" in n),
        "append: a writer's files committed": lambda: names_in(g1, lambda n: n.endswith(".arrows")),
    }
    for name, ready in append_points.items():
        if (
            kill_when(cli("append", f"--store={prefix}", f"--input={second}"), ready)
            and layout.read_store_manifest(prefix)["version"] == 1
        ):
            killed.append(name)
        assert check_store(prefix)[0] == [], f"{name}: the store is not readable"
    subprocess.run(
        cli("append", f"--store={prefix}", f"--input={second}"),
        check=True,
        capture_output=True,
        timeout=120,
    )
    assert file_digests(prefix) == file_digests(reference)
    assert comparable(layout.read_store_manifest(prefix)) == json.loads(
        json.dumps(comparable(layout.read_store_manifest(reference))).replace(reference, prefix)
    )
    assert not [
        p
        for p in glob.glob(os.path.join(names.store_dir(prefix), "**"), recursive=True)
        if ".tmp-" in p
    ]
    assert len(killed) >= 2, f"only killed before publication at {killed}"
    # expire killed after publishing, before deleting: the new version is readable; a re-run collects
    expire = cli("expire", f"--store={prefix}", "--keep_generations=1", "--grace_seconds=0")
    killed_expire = kill_when(
        expire,
        lambda: os.path.exists(os.path.join(names.store_dir(prefix), names.store_manifest_name(3))),
    )
    version = layout.read_store_manifest(prefix)["version"]
    assert version in (2, 3) and check_store(prefix)[0] == []
    subprocess.run(expire, check=True, capture_output=True, timeout=120)
    assert layout.read_store_manifest(prefix)["version"] == 3 and layout.generation_dirs(
        prefix
    ) == [1]
    print("killed at:", killed, "expire killed:", killed_expire)


def test_expire_interrupted_between_publish_and_delete_is_finished_by_a_rerun(
    tmp_path, monkeypatch
):
    prefix = str(tmp_path / "s")
    run_store(write_generation_files(str(tmp_path / "in0"), "a", 300), prefix, "--num_piles=2")
    append(prefix, write_generation_files(str(tmp_path / "in1"), "b", 300))

    def dies(*args, **kwargs):
        raise KeyboardInterrupt("killed")

    with monkeypatch.context() as patched:
        patched.setattr(store_expire, "collect", dies)
        with pytest.raises(KeyboardInterrupt):
            expire(prefix, keep_generations=1, grace_seconds=0)
    assert layout.read_store_manifest(prefix)["version"] == 3 and layout.generation_dirs(
        prefix
    ) == [0, 1]
    assert check_store(prefix)[0] == [] and lock_holder(prefix) is None
    manifest, dropped, deleted = expire(prefix, keep_generations=1, grace_seconds=0)
    assert manifest["version"] == 3 and dropped == [] and deleted["generations"] == [0]
    assert collections.Counter(payloads_in_order(prefix)) == expected_records(
        str(tmp_path / "in1" / "*.tfrecord")
    )


def test_gc_keeps_what_a_recent_version_lists(tmp_path):
    prefix = str(tmp_path / "s")
    run_store(write_generation_files(str(tmp_path / "in0"), "a", 200), prefix, "--num_piles=2")
    append(prefix, write_generation_files(str(tmp_path / "in1"), "b", 200))
    expire(prefix, keep_generations=1, grace_seconds=3600)
    assert layout.generation_dirs(prefix) == [0, 1] and layout.manifest_versions(prefix) == [
        1,
        2,
        3,
    ]
    # 2 still reads whole
    assert (
        len(payloads_in_order(prefix, version=2)) == 400 and len(payloads_in_order(prefix)) == 200
    )
    assert check_store(prefix, version=2)[0] == []
    done = subprocess.run(
        cli("gc", f"--store={prefix}", "--grace_seconds=0"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert layout.generation_dirs(prefix) == [1] and layout.manifest_versions(prefix) == [3]


# --- Dask --------------------------------------------------------------------------------------


def test_dask_store_and_materialize_are_byte_identical_to_local(tmp_path):
    import dask
    import distributed

    scratch = str(tmp_path / "dask-scratch")
    os.makedirs(scratch)
    with dask.config.set({"temporary-directory": scratch}):
        cluster = distributed.LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            dashboard_address=":0",
            local_directory=scratch,
            silence_logs=40,
        )
    try:
        dask_args = ["--runner=DaskRunner", f"--dask_client_address={cluster.scheduler_address}"]
        sample.write_tfrecord(
            str(tmp_path / "in"), records=3000, files=4, record_bytes=100, vary=True
        )
        new = write_generation_files(str(tmp_path / "new"), "n", 800)
        pattern = str(tmp_path / "in" / "*.tfrecord")
        local, remote = str(tmp_path / "local"), str(tmp_path / "dask")
        run_store(pattern, local, "--num_piles=5", "--seed=8")
        append(local, new)
        materialize(local, str(tmp_path / "lm" / "m"))
        run_shuffle(
            pattern, remote, "--layout=store", "--num_piles=5", "--seed=8", runner_args=dask_args
        )
        append_command.append([f"--store={remote}", f"--input={new}", *dask_args])
        materialize_command.materialize(
            [f"--store={remote}", f"--output={tmp_path / 'dm' / 'm'}", *dask_args]
        )
    finally:
        cluster.close()
    assert file_digests(remote) == file_digests(local)
    assert shard_bytes(str(tmp_path / "dm" / "m")) == shard_bytes(str(tmp_path / "lm" / "m"))
    assert layout.read_store_manifest(remote)["totals"]["records"] == 3800


def test_the_flex_template_entry_point_writes_a_store(tmp_path, tfrecord_input):
    """``templates/main.py`` with the template's parameters, layout=store, as the launcher passes them."""
    main = os.path.join(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "templates", "main.py"
    )
    prefix = str(tmp_path / "t")
    done = subprocess.run(
        [
            sys.executable,
            main,
            f"--input={tfrecord_input}",
            f"--output={prefix}",
            "--layout=store",
            "--num_piles=3",
            "--seed=42",
            "--format=tfrecord",
            "--compression=none",
            "--overwrite=false",
            "--runner=DirectRunner",
            "--direct_running_mode=in_memory",
            "--direct_num_workers=1",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "store     version 1: 1 live generation(s), 3,000 records" in done.stdout
    assert check_store(prefix)[0] == [] and layout.read_store_manifest(prefix)["seed"] == 42


def test_write_pile_store_of_arrow_batches_materializes_as_parquet(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    prefix = str(tmp_path / "pq")
    batches = [sample.parquet_table(i * 500, 500, 80).to_batches()[0] for i in range(4)]
    options = PipelineOptions(["--direct_running_mode=in_memory"])
    with beam.Pipeline(runner=FnApiRunner(), options=options) as p:
        (
            p
            | beam.Create(batches, reshuffle=False)
            | ShuffleToPiles(num_piles=3, seed=2, temp_location=str(tmp_path / "tmp"))
            | WritePileStore(prefix, format="parquet", num_piles=3, seed=2)
        )
    manifest = layout.read_store_manifest(prefix)
    assert (
        manifest["totals"]["records"] == 2000
        and [f["name"] for f in manifest["schema"]["fields"]][0] == "index"
    )
    assert check_store(prefix)[0] == []
    materialize(prefix, str(tmp_path / "m" / "m"))
    table = pa.concat_tables([pq.read_table(p) for p in shards(str(tmp_path / "m" / "m"))])
    assert sorted(table.column("index").to_pylist()) == list(range(2000))
    assert table.column("index").to_pylist() != list(range(2000))
