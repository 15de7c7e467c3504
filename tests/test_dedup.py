"""``run --dedup exact`` and ``--dedup_key FIELD``: exactly one of each distinct record (the first in
input order), proven by ``verify --input``, the same bytes on a re-run and whatever the memory path
(a pile loaded whole, split again, or one record repeated streamed), a uniform order of the distinct
records; on every format, both intermediate modes, gs:// and composed use."""

import collections
import glob
import io
import json
import re
import tarfile

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import (
    manifest,
    read_tfrecord_payloads,
    refused,
    run_shuffle,
    shard_bytes,
    shards,
    succeeded,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from test_balance_labels import example
from test_uniformity import ALPHA, assert_rejected, uniformity_pvalues

from pileshuffle import ShuffleToPiles, WritePiles
from pileshuffle.commands import sample
from pileshuffle.commands.info import main as info_main
from pileshuffle.commands.verify import main as verify_main
from pileshuffle.engine.dedup import Dedup
from pileshuffle.engine.duplicates import Dropped, distinct_in_order, stream_distinct
from pileshuffle.formats.tfrecord import frame
from pileshuffle.verify.checks import verify_shards

HOT_COPIES = 3000  # one record repeated: more than a 16 KiB pile holds, so it is streamed


def logical_files():
    """Three files of ``{"url", "text"}`` records: exact copies within a file and across files, records
    that share a url but not their text, and one record repeated ``HOT_COPIES`` times."""
    rng = np.random.default_rng(7)
    base = [{"url": f"u{i}", "text": f"text {i} " + "x" * (i % 30)} for i in range(1500)]
    files = [
        base[:500] + base[:50],
        base[500:1000] + base[:100] + [{"url": f"u{i}", "text": "other"} for i in range(200, 260)],
        base[1000:] + [{"url": "hot", "text": "the same"}] * HOT_COPIES,
    ]
    return [[f[i] for i in rng.permutation(len(f))] for f in files]


def encode(fmt, record) -> bytes:
    if fmt == "jsonl":
        return json.dumps(record).encode()
    return example(url=record["url"].encode(), text=record["text"].encode())


def write_inputs(directory, fmt) -> str:
    directory.mkdir(parents=True)
    for n, records in enumerate(logical_files()):
        path = directory / f"part-{n}.{fmt}"
        if fmt == "parquet":
            pq.write_table(
                pa.table(
                    {"url": [r["url"] for r in records], "text": [r["text"] for r in records]}
                ),
                path,
            )
        elif fmt == "jsonl":
            path.write_bytes(b"".join(encode(fmt, r) + b"\n" for r in records))
        else:
            path.write_bytes(b"".join(frame(encode(fmt, r)) for r in records))
    return str(directory / f"*.{fmt}")


def expected(field):
    """The records a dedup run keeps, as ``(url, text)``: the first of each in input order."""
    kept = {}
    for record in (r for f in logical_files() for r in f):
        kept.setdefault(
            record["url"] if field else (record["url"], record["text"]),
            (record["url"], record["text"]),
        )
    return list(kept.values())


def output_records(fmt, prefix):
    if fmt == "parquet":
        table = pq.read_table(shards(prefix))
        return list(zip(table.column("url").to_pylist(), table.column("text").to_pylist()))
    if fmt == "jsonl":
        lines = b"".join(shard_bytes(prefix)).splitlines()
        return [(r["url"], r["text"]) for r in map(json.loads, lines)]
    by_payload = {encode(fmt, {"url": u, "text": t}): (u, t) for u, t in expected(False)}
    return [by_payload[p] for p in read_tfrecord_payloads(shards(prefix))]


@pytest.mark.parametrize("fmt", ["jsonl", "parquet", "tfrecord"])
@pytest.mark.parametrize("field", [None, "url"], ids=["exact", "key"])
def test_dedup_keeps_the_first_of_each_and_verify_proves_it(tmp_path, fmt, field, capsys):
    pattern = write_inputs(tmp_path / "in", fmt)
    option = "--dedup_key=url" if field else "--dedup=exact"  # --dedup_key alone means --dedup key
    whole = run_shuffle(pattern, str(tmp_path / "a" / "o"), option, "--num_piles=4", "--seed=3")
    got = output_records(fmt, str(tmp_path / "a" / "o"))
    want = expected(field)
    assert collections.Counter(got) == collections.Counter(want) and len(got) == len(want)
    assert got != want  # shuffled
    read = sum(len(f) for f in logical_files())
    section = whole["dedup"]
    assert (section["records_read"], section["records_kept"], section["records_dropped"]) == (
        read,
        len(want),
        read - len(want),
    )
    assert (
        section["largest_groups"][0]["copies"] == HOT_COPIES
        and "the same" in section["largest_groups"][0]["preview"]
    )
    assert verify_shards(pattern, str(tmp_path / "a" / "o")) == []
    assert verify_main(["--input", pattern, "--output", str(tmp_path / "a" / "o")]) == 0
    assert (
        f"{read:,} read, {len(want):,} distinct, {read - len(want):,} duplicates"
        in capsys.readouterr().out
    )
    assert info_main(["--output", str(tmp_path / "a" / "o")]) == 0
    assert f"{read - len(want):,} duplicate(s) of {read:,} read left out" in capsys.readouterr().out
    # split again into sub-piles, the repeated record streamed: the same bytes
    split = run_shuffle(
        pattern,
        str(tmp_path / "b" / "o"),
        option,
        "--num_piles=4",
        "--seed=3",
        "--max_pile_bytes=16KiB",
    )
    assert split["piles_split"] > 0
    assert shard_bytes(str(tmp_path / "b" / "o")) == shard_bytes(str(tmp_path / "a" / "o"))
    assert split["dedup"] == section


def test_shuffle_mode_and_a_rerun_give_the_same_bytes_and_the_loader_reads_the_distinct_records(
    tmp_path,
):
    from pileshuffle.loader import ShuffledDataset

    pattern = write_inputs(tmp_path / "in", "jsonl")
    outputs = []
    for name, mode in (("f1", "files"), ("f2", "files"), ("s", "shuffle")):
        run_shuffle(
            pattern,
            str(tmp_path / name / "o"),
            "--dedup=exact",
            "--num_piles=3",
            f"--intermediate={mode}",
        )
        outputs.append(shard_bytes(str(tmp_path / name / "o")))
    assert outputs[0] == outputs[1] == outputs[2]
    epochs = [
        [
            (r["url"], r["text"])
            for r in map(json.loads, ShuffledDataset(str(tmp_path / "f1" / "o"), seed=2, epoch=e))
        ]
        for e in (0, 1)
    ]
    assert (
        sorted(epochs[0]) == sorted(epochs[1]) == sorted(expected(False)) and epochs[0] != epochs[1]
    )


def test_verify_fails_when_the_input_gained_a_duplicate_or_a_record(tmp_path):
    pattern = write_inputs(tmp_path / "in", "jsonl")
    run_shuffle(pattern, str(tmp_path / "o"), "--dedup=exact", "--num_piles=2")
    with open(tmp_path / "in" / "part-0.jsonl", "ab") as handle:
        # one more copy: kept count holds
        handle.write(encode("jsonl", {"url": "hot", "text": "the same"}) + b"\n")
    problems = verify_shards(pattern, str(tmp_path / "o"))
    assert any("records_read" in p for p in problems) and not any(
        "records_kept" in p for p in problems
    ), problems
    with open(tmp_path / "in" / "part-0.jsonl", "ab") as handle:
        # a new distinct record: missing from the output
        handle.write(encode("jsonl", {"url": "new", "text": "new"}) + b"\n")
    problems = verify_shards(pattern, str(tmp_path / "o"))
    assert any("records_kept" in p for p in problems) and any(
        "the input now reads as" in p for p in problems
    ), problems


def test_a_tar_sample_copied_across_shards_and_a_member_value(tmp_path):
    def write_tar(path, samples):
        with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as archive:
            for key, text in samples:
                info = tarfile.TarInfo(f"{key}.txt")
                info.size, info.mtime = len(text), 0
                archive.addfile(info, io.BytesIO(text))

    first = [(f"k{i:03d}", b"caption %d" % i) for i in range(100)]
    # copies, then same captions
    second = first[:40] + [(f"k{i:03d}", b"caption %d" % (i - 100)) for i in range(100, 130)]
    (tmp_path / "in").mkdir()
    write_tar(tmp_path / "in" / "a.tar", first)
    write_tar(tmp_path / "in" / "b.tar", second)
    pattern = str(tmp_path / "in" / "*.tar")
    exact = run_shuffle(pattern, str(tmp_path / "e" / "o"), "--dedup=exact", "--num_piles=2")
    by_key = run_shuffle(pattern, str(tmp_path / "k" / "o"), "--dedup_key=txt", "--num_piles=2")
    assert exact["dedup"]["records_kept"] == 130 and by_key["dedup"]["records_kept"] == 100
    keys = [
        m.name.split(".")[0]
        for s in shards(str(tmp_path / "k" / "o"))
        for m in tarfile.open(s).getmembers()
    ]
    assert sorted(keys) == [f"k{i:03d}" for i in range(100)]  # the first of each caption: a.tar's
    assert verify_shards(pattern, str(tmp_path / "k" / "o")) == []


def test_a_field_missing_from_a_record_names_the_file_and_record(tmp_path, capsys):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl").write_text('{"url": "a"}\n{"url": "b"}\n{"text": "no url"}\n')
    error = refused(
        capsys,
        "run",
        "--input",
        str(tmp_path / "in" / "*.jsonl"),
        "--output",
        str(tmp_path / "o"),
        "--dedup_key=url",
        "--direct_running_mode=in_memory",
    )
    assert "a.jsonl" in error and "byte 26" in error and "'url'" in error, error
    assert not glob.glob(str(tmp_path / "o*"))


def test_plan_says_what_a_dedup_run_compares_and_holds(tmp_path, capsys):
    pattern = write_inputs(tmp_path / "in", "jsonl")
    out, _ = succeeded(
        capsys, "plan", "--input", pattern, "--output", str(tmp_path / "o"), "--dedup_key=url"
    )
    line = next(line for line in out.splitlines() if line.startswith("dedup"))
    assert "by the value of 'url'" in line and "no extra pass" in line and "streamed" in line, line
    out, _ = succeeded(
        capsys,
        "plan",
        "--input",
        pattern,
        "--output",
        str(tmp_path / "o"),
        "--dedup=exact",
        "--json",
    )
    assert json.loads(out)["dedup"] == {"dedup": "exact"}


def test_append_with_dedup_is_refused_naming_why(tmp_path, capsys):
    (tmp_path / "a.jsonl").write_text('{"l": 1}\n{"l": 1}\n')
    run_shuffle(str(tmp_path / "a.jsonl"), str(tmp_path / "s"), "--layout=store")
    for option in ("--dedup=exact", "--dedup_key=l"):
        error = refused(
            capsys,
            "append",
            "--store",
            str(tmp_path / "s"),
            "--input",
            str(tmp_path / "a.jsonl"),
            option,
        )
        assert "--dedup: a store deduplicates as it was created" in error, error


@pytest.mark.parametrize(
    "args, option",
    [
        (["--dedup=exact", "--dedup_key=url"], "dedup"),
        (["--dedup=exact", "--balance=uniform", "--label_field=l"], "dedup"),
        (["--dedup=most"], "dedup"),
        (["--dedup=key"], "dedup_key"),
        (["--dedup=exact", "--layout=store", "--balance=uniform", "--label_field=l"], "dedup"),
    ],
)
def test_conflicting_dedup_options_are_usage_errors(tmp_path, capsys, args, option):
    (tmp_path / "a.jsonl").write_text('{"l": 1}\n')
    refused(
        capsys,
        "run",
        "--input",
        str(tmp_path / "a.jsonl"),
        "--output",
        str(tmp_path / "o"),
        *args,
        option=option,
    )


def test_order_of_the_distinct_records_is_uniform_over_20_seeds(tmp_path):
    """2,000 distinct records, a third of them copied once or twice to random places: the order in
    which the distinct records come out passes test_uniformity's four tests; their input order fails."""
    rng = np.random.default_rng(11)
    records = list(range(2000)) + rng.integers(0, 2000, 1300).tolist()
    records = [records[i] for i in rng.permutation(len(records))]
    first_seen = {}
    for r in records:
        first_seen.setdefault(r, len(first_seen))  # distinct records numbered in input order
    (tmp_path / "in").mkdir()
    for n in range(4):
        part = records[n * len(records) // 4 : (n + 1) * len(records) // 4]
        (tmp_path / "in" / f"p{n}.jsonl").write_text(
            "".join(json.dumps({"i": r}) + "\n" for r in part)
        )
    found = []
    for seed in range(20):
        out = str(tmp_path / f"s{seed}" / "o")
        run_shuffle(
            str(tmp_path / "in" / "*.jsonl"),
            out,
            "--dedup=exact",
            "--num_piles=8",
            f"--seed={seed}",
        )
        order = np.array(
            [first_seen[json.loads(line)["i"]] for line in b"".join(shard_bytes(out)).splitlines()]
        )
        assert sorted(order.tolist()) == list(range(2000))
        found.append(order)
    pvalues = uniformity_pvalues(found)
    assert min(pvalues.values()) >= ALPHA, pvalues
    assert_rejected([np.arange(2000)] * 20)


def test_equal_keys_of_different_records_never_drop_one():
    """A key collision (equal U, different bytes) keeps both; true copies go, the first kept."""
    records = pa.table({"record": pa.array([b"a", b"b", b"a", b"b", b"c", b"a"], pa.binary())})
    keys = np.array([5, 5, 5, 5, 5, 6], dtype=np.uint64)
    hashes = np.arange(6, dtype=np.uint64)
    dropped = Dropped()
    keep = distinct_in_order(
        records, np.arange(6), keys, hashes, np.ones(6, np.int64), Dedup(), dropped
    )
    assert keep.tolist() == [True, True, False, False, True, True]
    assert dropped.fingerprint.records == 2

    batches = [
        pa.table(
            {
                "record": pa.array(b, pa.binary()),
                "_pileshuffle_hash": pa.array(np.arange(len(b)), pa.uint64()),
            }
        )
        for b in ([b"a", b"a", b"b"], [b"b", b"a", b"c", b"c"])
    ]
    dropped = Dropped()

    def records_of(table):
        return (
            table.drop_columns(["_pileshuffle_hash"]),
            table.column("_pileshuffle_hash").to_numpy(),
            np.ones(table.num_rows),
        )

    kept = [
        v
        for t in stream_distinct(batches, records_of, Dedup(), dropped)
        for v in t.column("record").to_pylist()
    ]
    assert kept == [b"a", b"b", b"c"] and dropped.fingerprint.records == 4
    assert sorted(c for c, _, _ in dropped.groups) == [2, 2, 3]


def test_composed_shuffle_to_piles_with_dedup(tmp_path):
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.runners.portability.fn_api_runner import FnApiRunner

    rows = [b"row %d" % (i % 700) for i in range(2000)]
    out = str(tmp_path / "out" / "c")
    with beam.Pipeline(
        runner=FnApiRunner(), options=PipelineOptions(["--direct_running_mode=in_memory"])
    ) as p:
        (
            p
            | beam.Create(rows)
            | ShuffleToPiles(
                num_piles=3, seed=1, temp_location=str(tmp_path / "tmp"), dedup=Dedup()
            )
            | WritePiles(out, format="tfrecord")
        )
    got = read_tfrecord_payloads(shards(out))
    assert sorted(got) == sorted(set(rows))
    assert manifest(out)["dedup"]["records_dropped"] == 1300


def test_dedup_on_gcs_gives_the_local_bytes_and_verifies(gcs, tmp_path):
    local_pattern = write_inputs(tmp_path / "in", "jsonl")
    for path in sorted(glob.glob(local_pattern)):
        sample._write_file(
            f"{gcs}/in/{path.rsplit('/', 1)[-1]}",
            lambda handle, path=path: handle.write(open(path, "rb").read()),
        )
    args = ("--dedup_key=url", "--num_piles=3", "--max_pile_bytes=16KiB")
    local = run_shuffle(local_pattern, str(tmp_path / "o"), *args)
    remote = run_shuffle(f"{gcs}/in/*.jsonl", f"{gcs}/o", *args)
    assert [s["crc32c"] for s in remote["shards"]] == [s["crc32c"] for s in local["shards"]]
    assert remote["dedup"] == local["dedup"] and remote["piles_split"] > 0
    assert verify_shards(f"{gcs}/in/*.jsonl", f"{gcs}/o") == []


def test_quality_measures_a_dedup_output_against_the_distinct_input(tmp_path, capsys):
    from pileshuffle.commands.quality import main as quality_main

    pattern = write_inputs(tmp_path / "in", "jsonl")
    run_shuffle(pattern, str(tmp_path / "o"), "--dedup_key=url", "--num_piles=4")
    capsys.readouterr()
    assert (
        quality_main(
            [f"--input={pattern}", f"--output={tmp_path / 'o'}", f"--report={tmp_path / 'r'}"]
        )
        == 0
    )
    report = json.loads((tmp_path / "r" / "quality.json").read_text())
    distinct = len(expected("url"))
    assert (
        report["records"] == distinct and report["records_used"] == distinct and report["uniform"]
    ), report
    assert "consistent with a uniform permutation" in capsys.readouterr().out


def test_one_record_repeated_a_million_times_is_streamed_never_loaded_whole(tmp_path, monkeypatch):
    """The issue's hot record at full count: 1,000,000 copies (14 MB) in a run whose piles hold 1 MiB.
    Its pile is split, the one-key sub-pile streamed: no table pass 2 loads is larger than a pile."""
    import pileshuffle.engine.pile_groups as pile_groups  # where pass 2 joins a pile's parts (in_key_order)

    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl").write_bytes(
        b'{"hot": true}\n' * 1_000_000 + b"".join(b'{"i": %d}\n' % i for i in range(20_000))
    )
    loaded, real_read_joined = [], pile_groups.read_joined
    monkeypatch.setattr(
        pile_groups,
        "read_joined",
        lambda fragments: (
            loaded.append(real_read_joined(fragments).nbytes) or real_read_joined(fragments)
        ),
    )
    found = run_shuffle(
        str(tmp_path / "in" / "*.jsonl"),
        str(tmp_path / "o"),
        "--dedup=exact",
        "--num_piles=4",
        "--max_pile_bytes=1MiB",
    )
    assert (
        found["dedup"]["records_kept"] == 20_001
        and found["dedup"]["largest_groups"][0]["copies"] == 1_000_000
    )
    assert found["piles_split"] >= 1 and loaded and max(loaded) <= 1 << 20, loaded
    lines = b"".join(shard_bytes(str(tmp_path / "o"))).splitlines()
    assert len(lines) == 20_001 and lines.count(b'{"hot": true}') == 1
    assert verify_shards(str(tmp_path / "in" / "*.jsonl"), str(tmp_path / "o")) == []


@pytest.mark.parametrize(
    "fmt, says",
    [("parquet", "the input has no column 'nope'"), ("tfrecord", "has no feature 'nope'")],
)
def test_a_dedup_key_a_file_lacks_is_one_line_naming_the_file(tmp_path, capsys, fmt, says):
    pattern = write_inputs(tmp_path / "in", fmt)
    error = refused(
        capsys,
        "run",
        "--input",
        pattern,
        "--output",
        str(tmp_path / "o"),
        "--dedup_key=nope",
        "--direct_running_mode=in_memory",
        "--run_bytes=1GiB",
    )
    if fmt == "parquet":  # the schema says it before anything runs
        assert "--dedup_key: the input has no column 'nope' (columns: url, text)" in error, error
    else:
        assert (
            re.search(rf"part-\d\.{fmt}: ", error) and says in error and "--dedup_key nope" in error
        ), error
    assert "--balance" not in error, error
    assert not glob.glob(str(tmp_path / "o*"))


@settings(max_examples=25, deadline=None)
@given(
    contents=st.lists(
        st.integers(0, 40).map(lambda v: (v * 0x9E3779B97F4A7C15) % 2**64), max_size=300
    ),
    cut=st.integers(1, 50),
)
def test_the_distinct_input_on_disk_equals_a_set_kept_in_memory(tmp_path_factory, contents, cut):
    """verify's and quality's first-of-each (partitioned on disk) against a Python set in input order."""
    from pileshuffle.engine.dedup import distinct_fingerprint, first_occurrences
    from pileshuffle.records.fingerprint import Fingerprint

    values = np.array(contents, dtype=np.uint64)
    hashes, lengths = values ^ np.uint64(7), np.arange(len(values)) % 5
    seen, want = set(), []
    for value in contents:
        want.append(value not in seen)
        seen.add(value)
    chunks = [slice(a, a + cut) for a in range(0, len(values), cut)]
    got = first_occurrences((values[c] for c in chunks), str(tmp_path_factory.mktemp("first")))
    assert np.asarray(got).tolist() == want
    read, distinct = distinct_fingerprint((values[c], hashes[c], lengths[c]) for c in chunks)
    assert read == Fingerprint.of(hashes, int(lengths.sum()))
    assert distinct == Fingerprint.of(
        hashes[np.array(want, bool)], int(lengths[np.array(want, bool)].sum())
    )
