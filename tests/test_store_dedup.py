"""A pile store made with ``--dedup``: the live window holds each distinct record once (its oldest live
copy) through appends and expires, with no data file rewritten; the counts come from the manifest,
materialize gives ``run --dedup``'s bytes for one generation, ``verify --input`` proves the window is
the live inputs' distinct records, a damaged copies file is named, and a killed append re-runs to the
same files."""

import json
import os
import subprocess

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from helpers import (
    FAST,
    kill_when,
    read_tfrecord_payloads,
    refused,
    run_shuffle,
    shard_bytes,
    shards,
    succeeded,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from test_dedup import write_inputs
from test_store import append, cli, comparable, file_digests, materialize, names_in

from pileshuffle import ShuffleToPiles, names
from pileshuffle.formats.tfrecord import frame
from pileshuffle.loader import ShuffledDataset
from pileshuffle.store import layout
from pileshuffle.store.composed import WritePileStore
from pileshuffle.store.expire import expire
from pileshuffle.store.lock import lock_holder
from pileshuffle.store.read import check_store

WINDOW = {  # generation -> urls of its records: copies within a generation and of older ones
    0: [*range(0, 600), *range(0, 50)],
    1: [*range(400, 1000), *range(1000, 1100)],
    2: [*range(900, 1200), *range(0, 100)],
}


def record(url, text=None) -> bytes:
    return json.dumps({"url": f"u{url}", "text": text or f"text {url}"}).encode()


def write_generation(directory, generation, text=None) -> str:
    """JSONL files of generation ``generation``'s records (``WINDOW``), split over two files."""
    os.makedirs(directory, exist_ok=True)
    urls = WINDOW[generation]
    for part, chunk in enumerate((urls[: len(urls) // 2], urls[len(urls) // 2 :])):
        with open(os.path.join(directory, f"g{generation}-{part}.jsonl"), "wb") as handle:
            handle.write(b"".join(record(u, text) + b"\n" for u in chunk))
    return os.path.join(directory, f"g{generation}-*.jsonl")


def window_records(prefix) -> list:
    return [bytes(r) for r in ShuffledDataset(prefix, reshuffle=False)]


def distinct(generations) -> set:
    return {record(u) for g in generations for u in WINDOW[g]}


def test_the_window_holds_each_distinct_record_once_through_appends_and_expires(tmp_path, capsys):
    prefix = str(tmp_path / "s")
    patterns = [write_generation(str(tmp_path / "in"), g) for g in WINDOW]
    manifest = run_shuffle(
        patterns[0], prefix, "--layout=store", "--dedup=exact", "--num_piles=5", "--seed=4"
    )
    assert manifest["options"] == {"dedup": "exact"}
    assert manifest["generations"][0]["dedup"]["copies_within"] == 50
    for g in (1, 2):
        manifest = append(prefix, patterns[g])
    assert [g["dedup"]["copies_of_earlier"] for g in manifest["generations"]] == [
        {},
        {"0": 200},
        {"0": 100, "1": 200},
    ]
    # the rows are all kept; readers see each distinct record once, counted from the manifest alone
    assert manifest["totals"]["records"] == sum(len(u) for u in WINDOW.values())
    assert manifest["totals"]["distinct"] == len(distinct([0, 1, 2])) == 1200
    found = window_records(prefix)
    assert len(found) == len(ShuffledDataset(prefix)) == 1200 and set(found) == distinct([0, 1, 2])
    assert check_store(prefix)[0] == []
    out, err = succeeded(capsys, "info", f"--output={prefix}")
    assert "deduplicated: 1,200 distinct records visible, the oldest live copy of each" in out + err
    materialize(prefix, str(tmp_path / "m" / "m"))  # the loader's order at epoch 0 is materialize's
    assert b"".join(shard_bytes(str(tmp_path / "m" / "m"))).splitlines() == found
    # expire generation 0: its copies in generations 1 and 2 take its records' places, with no work
    before = file_digests(prefix)
    manifest, dropped, _ = expire(prefix, keep_generations=2, grace_seconds=0)
    assert dropped == [0] and manifest["totals"]["distinct"] == len(distinct([1, 2])) == 900
    assert {k: v for k, v in before.items() if not k.startswith("g000000")} == file_digests(prefix)
    found = window_records(prefix)
    assert len(found) == 900 and set(found) == distinct([1, 2]) and check_store(prefix)[0] == []
    expire(prefix, keep_generations=1, grace_seconds=0)
    assert set(window_records(prefix)) == distinct([2]) and len(window_records(prefix)) == 400


def test_verify_input_proves_the_materialized_window(tmp_path, capsys):
    prefix = str(tmp_path / "s")
    patterns = [write_generation(str(tmp_path / f"in{g}"), g) for g in WINDOW]
    run_shuffle(patterns[0], prefix, "--layout=store", "--dedup=exact", "--num_piles=3", "--seed=2")
    append(prefix, patterns[1])
    materialize(prefix, str(tmp_path / "m" / "m"))
    inputs = str(tmp_path / "in[01]" / "*.jsonl")
    out, err = succeeded(capsys, "verify", f"--output={tmp_path / 'm' / 'm'}", f"--input={inputs}")
    assert (
        "exactly the input's distinct records, each once: 1,350 read, 1,100 distinct, 250 duplicates"
        in out + err
    )
    out, err = succeeded(capsys, "verify", f"--output={prefix}")
    assert (
        "1,100 records visible (one per distinct record), every copies file as listed" in out + err
    )


def test_a_dedup_key_keeps_the_oldest_live_copy_then_the_next(tmp_path):
    prefix = str(tmp_path / "s")
    old = write_generation(str(tmp_path / "old"), 0, text="old")
    new = write_generation(str(tmp_path / "new"), 1, text="new")
    run_shuffle(old, prefix, "--layout=store", "--dedup_key=url", "--num_piles=4", "--seed=9")
    append(prefix, new)
    texts = {json.loads(r)["url"]: json.loads(r)["text"] for r in window_records(prefix)}
    assert len(texts) == 1100 and len(window_records(prefix)) == 1100
    assert {texts[f"u{u}"] for u in range(400, 600)} == {"old"} and texts["u700"] == "new"
    expire(prefix, keep_generations=1, grace_seconds=0)
    texts = {json.loads(r)["url"]: json.loads(r)["text"] for r in window_records(prefix)}
    assert len(texts) == 700 and set(texts.values()) == {"new"}


@pytest.mark.parametrize("fmt", ["jsonl", "parquet", "tfrecord"])
def test_one_generation_materializes_to_run_dedup_bytes(tmp_path, fmt):
    """Copies within and across files, a field-level duplicate and one record repeated 3,000 times."""
    pattern = write_inputs(tmp_path / "in", fmt)
    args = [f"--format={fmt}", "--num_piles=4", "--seed=5", "--dedup=exact"]
    run_shuffle(pattern, str(tmp_path / "run" / "out"), *args)
    prefix = str(tmp_path / "store" / "s")
    manifest = run_shuffle(pattern, prefix, "--layout=store", *args)
    assert (
        manifest["totals"]["distinct"]
        == json.load(open(str(tmp_path / "run" / "out") + "-manifest.json"))["dedup"][
            "records_kept"
        ]
    )
    materialize(prefix, str(tmp_path / "mat" / "out"))
    assert shard_bytes(str(tmp_path / "mat" / "out")) == shard_bytes(str(tmp_path / "run" / "out"))


def test_a_damaged_copies_file_is_named_by_verify_and_the_loader(tmp_path):
    prefix = str(tmp_path / "s")
    patterns = [write_generation(str(tmp_path / "in"), g) for g in (0, 1)]
    run_shuffle(patterns[0], prefix, "--layout=store", "--dedup=exact", "--num_piles=2", "--seed=1")
    manifest = append(prefix, patterns[1])
    entry = next(f for f in manifest["generations"][1]["files"] if f.get("copies"))
    path = os.path.join(names.store_dir(prefix), entry["copies"]["path"])
    data = bytearray(open(path, "rb").read())
    data[-20] ^= 0xFF
    open(path, "wb").write(bytes(data))
    problems, _ = check_store(prefix)
    assert (
        len(problems) == 1
        and path in problems[0]
        and "damaged" in problems[0]
        and problems[0].generation == 1
    )
    with pytest.raises(Exception, match=os.path.basename(path)):
        list(ShuffledDataset(prefix, reshuffle=False))
    os.remove(path)
    assert check_store(prefix)[0] == [f"copies file {path} is missing (generation 1)"]


def test_a_killed_append_reruns_to_the_same_files(tmp_path):
    patterns = [write_generation(str(tmp_path / "in"), g) for g in (0, 1)]
    reference, prefix = str(tmp_path / "ref"), str(tmp_path / "s")
    for where in (reference, prefix):
        subprocess.run(
            cli(
                "run",
                "--layout=store",
                "--dedup=exact",
                f"--input={patterns[0]}",
                f"--output={where}",
                "--num_piles=6",
                "--seed=3",
                # auto would size it from the memory free at that moment: two stores apart
                "--max_pile_bytes=64MiB",
            ),
            check=True,
            capture_output=True,
            timeout=120,
        )
    subprocess.run(
        cli("append", f"--store={reference}", f"--input={patterns[1]}"),
        check=True,
        capture_output=True,
        timeout=120,
    )
    g1 = os.path.join(names.store_dir(prefix), names.generation_dir_name(1))
    kill_when(
        cli("append", f"--store={prefix}", f"--input={patterns[1]}"),
        lambda: names_in(g1, lambda n: n.endswith(".arrows")),
    )
    assert check_store(prefix)[0] == [] and layout.read_store_manifest(prefix)["version"] in (1, 2)
    subprocess.run(
        cli("append", f"--store={prefix}", f"--input={patterns[1]}"),
        check=True,
        capture_output=True,
        timeout=120,
    )
    digests = file_digests(prefix)
    assert any(k.endswith(".copies.arrows") for k in digests) and digests == file_digests(reference)
    assert comparable(layout.read_store_manifest(prefix)) == json.loads(
        json.dumps(comparable(layout.read_store_manifest(reference))).replace(reference, prefix)
    )


def test_the_window_is_a_uniform_order_of_its_distinct_records(tmp_path):
    """chi-square over (generation of the visible copy x output block) of a materialized store whose
    generations overlap by half: uniform over the distinct records."""
    from scipy.stats import chi2_contingency

    prefix = str(tmp_path / "u")
    patterns = []
    # generation g holds ids 2000g .. 2000g + 3999: half of them the previous one's
    for g in range(3):
        os.makedirs(tmp_path / f"in{g}")
        with open(tmp_path / f"in{g}" / "part.tfrecord", "wb") as handle:
            handle.write(b"".join(frame(b"%06d" % i) for i in range(2000 * g, 2000 * g + 4000)))
        patterns.append(str(tmp_path / f"in{g}" / "*.tfrecord"))
    run_shuffle(
        patterns[0], prefix, "--layout=store", "--dedup=exact", "--num_piles=6", "--seed=13"
    )
    for pattern in patterns[1:]:
        append(prefix, pattern)
    materialize(prefix, str(tmp_path / "m" / "m"))
    order = [int(p) // 2000 for p in read_tfrecord_payloads(shards(str(tmp_path / "m" / "m")))]
    assert sorted(order) == sorted(i // 2000 for i in range(8000))
    blocks = np.arange(len(order)) * 10 // len(order)
    table = np.array(
        [[np.sum((blocks == b) & (np.array(order) == k)) for b in range(10)] for k in range(4)]
    )
    assert chi2_contingency(table).pvalue > 0.001


def test_quality_measures_the_window_against_the_distinct_input(tmp_path, capsys):
    prefix = str(tmp_path / "s")
    patterns = [write_generation(str(tmp_path / "in"), g) for g in (0, 1)]
    run_shuffle(patterns[0], prefix, "--layout=store", "--dedup=exact", "--num_piles=3", "--seed=8")
    append(prefix, patterns[1])
    out, err = succeeded(
        capsys,
        "quality",
        f"--input={tmp_path / 'in' / '*.jsonl'}",
        f"--output={prefix}",
        f"--report={tmp_path / 'report'}",
    )
    assert "1,100 records, 1,100 located by hash (0 duplicates left out)" in out + err
    assert "consistent with a uniform permutation" in out + err


def test_plan_says_what_a_dedup_store_keeps_and_holds(tmp_path, capsys):
    pattern = write_generation(str(tmp_path / "in"), 0)
    out, _ = succeeded(
        capsys,
        "plan",
        "--input",
        pattern,
        "--output",
        str(tmp_path / "o"),
        "--layout=store",
        "--dedup_key=url",
    )
    line = next(line for line in out.splitlines() if line.startswith("dedup"))
    assert (
        "oldest live copy), comparing the value of 'url'" in line
        and "a batch and the repeated contents" in line
    ), line


def test_a_copy_of_a_live_generation_is_appended_and_hidden(tmp_path):
    """What a plain store refuses (a generation of exactly a live one's records) a dedup store takes:
    every row is a copy, so the window is unchanged; expiring the original shows the copy."""
    prefix = str(tmp_path / "s")
    first = write_generation(str(tmp_path / "in"), 0)
    again = write_generation(str(tmp_path / "again"), 0)  # the same records in other files
    run_shuffle(first, prefix, "--layout=store", "--dedup=exact", "--num_piles=3", "--seed=2")
    manifest = append(prefix, again)
    added = manifest["generations"][1]["dedup"]  # its own 50 repeats follow its own first copies
    assert (added["copies_of_earlier"], added["copies_within"], added["distinct_new"]) == (
        {"0": 600},
        50,
        0,
    )
    assert manifest["totals"]["distinct"] == 600 and set(window_records(prefix)) == distinct([0])
    expire(prefix, keep_generations=1, grace_seconds=0)
    assert len(window_records(prefix)) == 600 and set(window_records(prefix)) == distinct([0])


def test_append_takes_the_stores_dedup_and_write_pile_store_is_refused(tmp_path, capsys):
    prefix = str(tmp_path / "s")
    pattern = write_generation(str(tmp_path / "in"), 0)
    run_shuffle(pattern, prefix, "--layout=store", "--dedup=exact", "--num_piles=2", "--seed=1")
    err = refused(
        capsys,
        "append",
        f"--store={prefix}",
        f"--input={pattern}",
        "--dedup=exact",
        option="--dedup",
    )
    assert "as it was created" in err
    with pytest.raises(Exception, match="keys every record by its content"):
        with beam.Pipeline(runner=FnApiRunner(), options=PipelineOptions(FAST)) as p:
            (
                p
                | beam.Create([b"a", b"b"])
                | ShuffleToPiles(num_piles=2, seed=1)
                | WritePileStore(prefix, format="jsonl", num_piles=2, seed=1)
            )
    assert lock_holder(prefix) is None


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.lists(
            st.lists(st.lists(st.integers(0, 7), max_size=6), max_size=3), min_size=1, max_size=3
        ),
        min_size=1,
        max_size=4,
    ),
    st.integers(1, 5),
)
def test_earlier_copies_is_the_newest_generation_of_an_earlier_equal_row(generations, buckets):
    """Against a reference by brute force: generations of files of batches of small values, keyed so
    that different values collide (key = value mod ``buckets``): a collision never makes a copy."""
    from pileshuffle.engine.dedup import Dedup
    from pileshuffle.names import HASH_COLUMN, KEY_COLUMN
    from pileshuffle.store.copies import earlier_copies

    def batch(values):
        return pa.record_batch(
            {
                "line": pa.array([b"v%d" % v for v in values], pa.binary()),
                KEY_COLUMN: pa.array([v % buckets for v in values], pa.uint64()),
                HASH_COLUMN: pa.array([0] * len(values), pa.uint64()),
            }
        )

    *older, newest = [
        [[batch(values) for values in file] for file in generation] for generation in generations
    ]
    number = len(older)
    found = earlier_copies(
        Dedup(),
        number,
        [lambda f=f: iter(f) for f in newest],
        ((g, (b for f in files for b in f)) for g, files in enumerate(older)),
    )
    met, expected = {}, []
    for g, files in enumerate(older):
        for file in files:
            for b in file:
                met.update((v, g) for v in b.column("line").to_pylist())
    for file in newest:
        marks = []
        for b in file:
            for v in b.column("line").to_pylist():
                marks.append(met.get(v, -1))
                met[v] = number
        expected.append(marks)
    assert [f.tolist() for f in found] == expected


def test_piles_grown_past_max_pile_bytes_load_in_sub_piles_with_their_copies_hidden(tmp_path):
    """16 KiB piles: the loader opens each pile as sub-piles counted from the visible keys, and
    materialize splits them again; both give the window once, in the same order."""
    prefix = str(tmp_path / "s")
    patterns = [write_generation(str(tmp_path / "in"), g) for g in WINDOW]
    run_shuffle(
        patterns[0],
        prefix,
        "--layout=store",
        "--dedup=exact",
        "--num_piles=2",
        "--seed=3",
        "--max_pile_bytes=16KiB",
    )
    for g in (1, 2):
        append(prefix, patterns[g])
    dataset = ShuffledDataset(prefix, reshuffle=False)
    assert len(dataset.output.piles) > 2  # sub-piles
    found = window_records(prefix)
    assert len(found) == len(dataset) == 1200 and set(found) == distinct([0, 1, 2])
    materialize(prefix, str(tmp_path / "m" / "m"))
    assert b"".join(shard_bytes(str(tmp_path / "m" / "m"))).splitlines() == found


def test_a_record_repeated_in_every_batch_is_one_entry_not_a_loaded_pile(monkeypatch):
    """100,000 copies of one record over 50 batches: the copies are found comparing at most a batch
    and the one content met before, never the whole pile (``plan``'s promise for a dedup store)."""
    from pileshuffle.engine import duplicates
    from pileshuffle.engine.dedup import Dedup
    from pileshuffle.names import HASH_COLUMN, KEY_COLUMN
    from pileshuffle.store import copies

    compared = []
    real = duplicates.content_groups
    monkeypatch.setattr(
        copies,
        "content_groups",
        lambda values, keys: compared.append(len(keys)) or real(values, keys),
    )
    batch = pa.record_batch(
        {
            "line": pa.array([b"hot\n"] * 2000, pa.binary()),
            KEY_COLUMN: pa.array([7] * 2000, pa.uint64()),
            HASH_COLUMN: pa.array([1] * 2000, pa.uint64()),
        }
    )
    [earlier] = copies.earlier_copies(Dedup(), 0, [lambda: iter([batch] * 50)], [])
    assert earlier.tolist() == [-1] + [0] * 99_999
    assert compared and max(compared) <= 2001, max(compared)
