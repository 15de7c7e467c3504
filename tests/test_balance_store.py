"""Class rebalancing on a pile store: ``run --layout store --label_field F --balance P`` balances
generation 0, and ``append`` balances each new generation on its own class counts with the
policy the store was created with. Real pipelines on small generated JSONL data."""

import collections
import glob
import json
import os
import subprocess
import sys

import pyarrow as pa
import pytest
from helpers import FAST, assert_verified, run_shuffle, shard_bytes, shards, succeeded

from pileshuffle import names
from pileshuffle.commands import append as append_command
from pileshuffle.commands import materialize as materialize_command
from pileshuffle.commands.verify import verify
from pileshuffle.loader import ShuffledDataset
from pileshuffle.store import layout
from pileshuffle.store.expire import expire
from pileshuffle.store.lock import lock_path

DAY0 = {"cat": 900, "dog": 90, "bird": 10}  # generation 0, one class after the other over two files
DAY1 = {"cat": 50, "dog": 200, "bird": 20}  # generation 1: imbalanced the other way
BALANCE = ["--label_field=animal", "--balance=uniform", "--num_piles=3", "--seed=9"]


def write_day(directory, counts, start, files):
    """JSONL records ``{"i", "animal", "text"}`` of ``counts`` (ids from ``start``) in ``files`` files."""
    lines, i = [], start
    for animal, n in counts.items():
        for _ in range(n):
            lines.append(json.dumps({"i": i, "animal": animal, "text": "x" * (i % 40)}) + "\n")
            i += 1
    os.makedirs(directory)
    step = -(-len(lines) // files)
    for f in range(files):
        with open(os.path.join(directory, f"part-{f}.jsonl"), "w") as handle:
            handle.writelines(lines[f * step : (f + 1) * step])
    return os.path.join(directory, "*.jsonl")


@pytest.fixture(scope="module")
def days(tmp_path_factory):
    root = tmp_path_factory.mktemp("days")
    return write_day(str(root / "day0"), DAY0, 0, 2), write_day(str(root / "day1"), DAY1, 10_000, 1)


def store_run(pattern, prefix, *args):
    return run_shuffle(pattern, prefix, "--layout=store", *BALANCE, *args)


def append(prefix, pattern, *args):
    return append_command.append([f"--store={prefix}", f"--input={pattern}", *FAST, *args])


def loaded(prefix):
    """Every record the loader yields in one epoch, parsed."""
    return [json.loads(record) for record in ShuffledDataset(prefix, seed=1)]


def stored_records(prefix):
    """``(generation, pile, record)`` of every row of every live data file."""
    manifest = layout.read_store_manifest(prefix)
    rows = []
    for generation in manifest["generations"]:
        for entry in generation["files"]:
            with pa.OSFile(layout.join(names.store_dir(prefix), entry["path"])) as handle:
                lines = pa.ipc.open_stream(handle).read_all().column("line").to_pylist()
            rows += [(generation["generation"], entry["pile"], json.loads(line)) for line in lines]
    return rows


def data_files(prefix):
    return {
        os.path.relpath(p, names.store_dir(prefix)): open(p, "rb").read()
        for p in sorted(glob.glob(os.path.join(names.store_dir(prefix), "g*", "*.arrows")))
    }


def test_a_balanced_store_hits_every_target_exactly_spreads_the_copies_and_verifies(
    days, tmp_path, capsys
):
    day0, _ = days
    prefix = str(tmp_path / "out" / "t")
    out, _ = succeeded(
        capsys,
        "run",
        f"--input={day0}",
        f"--output={prefix}",
        "--layout=store",
        "--quiet",
        *BALANCE,
        *FAST,
    )
    assert (
        "balance   'animal', uniform, oversampling: bird 10 -> 900, cat 900 -> 900, dog 90 -> 900"
        in out
    )
    manifest = layout.read_store_manifest(prefix)
    assert manifest["options"] == {
        "label_field": "animal",
        "balance": "uniform",
        "undersample": False,
    }
    generation = manifest["generations"][0]
    assert generation["balance"]["records_before"] == DAY0
    assert generation["balance"]["records_after"] == {"cat": 900, "dog": 900, "bird": 900}
    assert [i["records"] for i in generation["inputs"]] == [500, 500] and manifest["totals"][
        "records"
    ] == 2700
    assert collections.Counter(r["animal"] for r in loaded(prefix)) == {
        "cat": 900,
        "dog": 900,
        "bird": 900,
    }
    piles_of = collections.defaultdict(collections.Counter)  # a record's copies over the piles
    for _, pile, record in stored_records(prefix):
        piles_of[record["i"]][pile] += 1
    for i in range(990, 1000):  # each bird's 90 copies: in every pile, about a third in each
        assert sum(piles_of[i].values()) == 90 and all(
            15 <= piles_of[i][p] <= 45 for p in range(3)
        ), piles_of[i]
    assert_verified(day0, prefix)


def test_append_balances_its_own_generation_the_window_adds_up_and_expire_drops_its_copies(
    days, tmp_path
):
    day0, day1 = days
    prefix = str(tmp_path / "out" / "t")
    store_run(day0, prefix)
    manifest = append(prefix, day1)
    balance = manifest["generations"][1]["balance"]
    assert balance["records_before"] == DAY1 and balance["records_after"] == {
        "cat": 200,
        "dog": 200,
        "bird": 200,
    }
    assert (
        manifest["totals"]["records"]
        == 2700 + 600
        == sum(g["records"] for g in manifest["generations"])
    )
    assert collections.Counter(r["animal"] for r in loaded(prefix)) == {
        "cat": 1100,
        "dog": 1100,
        "bird": 1100,
    }
    assert_verified(f"{day0},{day1}", prefix)
    problems = verify(day0, prefix)  # day 1's input left out: its copies cannot be recomputed
    assert (
        len(problems) == 1 and "generation 1" in problems[0] and "not in --input" in problems[0]
    ), problems
    manifest, dropped, _ = expire(prefix, keep_generations=1, grace_seconds=0)
    assert dropped == [0] and manifest["totals"]["records"] == 600
    assert not glob.glob(os.path.join(names.store_dir(prefix), "g000000"))
    records = loaded(prefix)
    assert collections.Counter(r["animal"] for r in records) == {
        "cat": 200,
        "dog": 200,
        "bird": 200,
    }
    # no copy of a dropped generation's record is left
    assert all(r["i"] >= 10_000 for r in records)
    assert_verified(day1, prefix)


def test_a_rerun_gives_the_same_bytes(days, tmp_path):
    day0, day1 = days
    first, again = str(tmp_path / "a" / "t"), str(tmp_path / "b" / "t")
    for prefix in (first, again):
        store_run(day0, prefix)
        append(prefix, day1)
    assert data_files(first) == data_files(again) and len(data_files(first)) > 6
    other = str(tmp_path / "c" / "t")
    run_shuffle(day0, other, "--layout=store", *BALANCE[:-1], "--seed=10")
    assert data_files(other) != {
        k: v for k, v in data_files(first).items() if k.startswith("g000000")
    }


def test_the_loader_gives_every_copy_and_materialize_gives_the_balanced_runs_bytes(days, tmp_path):
    day0, _ = days
    prefix = str(tmp_path / "store" / "t")
    store_run(day0, prefix)
    copies = collections.Counter(r["i"] for r in loaded(prefix))
    assert copies == collections.Counter(record["i"] for _, _, record in stored_records(prefix))
    assert {copies[i] for i in range(900)} == {1} and {copies[i] for i in range(900, 990)} == {10}
    assert {copies[i] for i in range(990, 1000)} == {90}
    materialized, ran = str(tmp_path / "mat" / "t"), str(tmp_path / "run" / "t")
    materialize_command.materialize([f"--store={prefix}", f"--output={materialized}", *FAST])
    run_shuffle(day0, ran, *BALANCE)  # generation 0 draws run's keys: the same shards
    assert shard_bytes(materialized) == shard_bytes(ran) and len(shards(ran)) == 3
    assert_verified(None, materialized)


def test_verify_recomputes_each_generations_copies_from_its_input_even_moved(days, tmp_path):
    day0, _ = days
    prefix = str(tmp_path / "out" / "t")
    store_run(day0, prefix)
    moved, changed = tmp_path / "moved", tmp_path / "changed"
    for directory, edit in (
        (moved, lambda text: text),
        (changed, lambda t: t.replace('"dog"', '"cat"', 1)),
    ):
        directory.mkdir()
        for path in glob.glob(day0):
            (directory / os.path.basename(path)).write_text(edit(open(path).read()))
    # the same files elsewhere: found by name and size
    assert verify(str(moved / "*.jsonl"), prefix) == []
    # one dog became a cat: other counts, other copies
    problems = verify(str(changed / "*.jsonl"), prefix)
    assert len(problems) == 1 and "generation 0 is not its input with the copies" in problems[0], (
        problems
    )
    extra = tmp_path / "extra.jsonl"
    extra.write_text(open(glob.glob(day0)[0]).readline())
    problems = verify(f"{day0},{extra}", prefix)
    assert (
        len(problems) == 1
        and "no live generation was read from" in problems[0]
        and str(extra) in problems[0]
    )


def refused_by_cli(*args):
    """``python -m pileshuffle *args`` in its own process: exit 2 and one error line; returns it."""
    done = subprocess.run(
        [sys.executable, "-m", "pileshuffle", *args], capture_output=True, text=True, timeout=300
    )
    errors = [line for line in done.stderr.splitlines() if line.startswith("pileshuffle: error: ")]
    assert done.returncode == 2 and len(errors) == 1 and "Traceback" not in done.stderr, done.stderr
    return errors[0]


def test_append_refuses_another_policy_and_balance_on_an_unbalanced_store_in_one_line(
    days, tmp_path
):
    day0, day1 = days
    balanced, plain = str(tmp_path / "balanced" / "t"), str(tmp_path / "plain" / "t")
    store_run(day0, balanced)
    run_shuffle(day0, plain, "--layout=store", "--num_piles=3")
    before = {p: sorted(os.listdir(names.store_dir(p))) for p in (balanced, plain)}
    for option, given, stored in (
        ("--balance=sqrt", "'sqrt'", "'uniform'"),
        ("--label_field=text", "'text'", "'animal'"),
        ("--undersample", "true", "false"),
    ):
        error = refused_by_cli("append", f"--store={balanced}", f"--input={day1}", option)
        assert f"differs from the store's {stored}" in error and given in error, error
        assert (
            names.store_dir(balanced) in error and "--label_field animal --balance uniform" in error
        ), error
    error = refused_by_cli(
        "append", f"--store={plain}", f"--input={day1}", "--label_field=animal", "--balance=uniform"
    )
    assert (
        "created without --balance" in error
        and "new store" in error
        and names.store_dir(plain) in error
    ), error
    # known only once this generation's classes are counted
    weights = str(tmp_path / "weights" / "t")
    run_shuffle(
        day0,
        weights,
        "--layout=store",
        "--label_field=animal",
        "--balance=cat=2,dog=1,bird=1",
        "--num_piles=3",
    )
    no_birds = write_day(str(tmp_path / "no-birds"), {"cat": 30, "dog": 30}, 20_000, 1)
    error = refused_by_cli("append", f"--store={weights}", f"--input={no_birds}")
    assert "no record of 'bird'" in error, error
    assert layout.manifest_versions(weights) == [1] and sorted(
        os.listdir(names.store_dir(weights))
    ) == ["g000000", "manifest-00000001.json"]  # no lock, nor the refused generation's folder, left
    after = {p: sorted(os.listdir(names.store_dir(p))) for p in (balanced, plain)}
    assert after == before  # nothing written, no lock left


def test_write_pile_store_refuses_a_balanced_store(days, tmp_path):
    import apache_beam as beam

    from pileshuffle import ShuffleToPiles
    from pileshuffle.errors import OutputError
    from pileshuffle.store.composed import WritePileStore

    day0, _ = days
    prefix = str(tmp_path / "out" / "t")
    store_run(day0, prefix)
    pipeline = beam.Pipeline()
    piles = pipeline | beam.Create([b'{"animal": "cat"}\n']) | ShuffleToPiles(num_piles=3, seed=9)
    with pytest.raises(
        OutputError, match="balances every generation by 'animal'.*pileshuffle append"
    ):
        _ = piles | WritePileStore(prefix, format="jsonl", num_piles=3, seed=9)
    assert not os.path.exists(lock_path(prefix))


def test_a_store_keeps_unlabeled_records_as_the_class_null_in_every_generation(days, tmp_path):
    """--keep_unlabeled on a store: recorded in its options, used by every append (a store made
    without it refuses an unlabeled record, and refuses the option on append), by verify, by
    materialize (the bytes of run --keep_unlabeled)."""
    day0, _ = days

    def with_unlabeled(name, counts, start):
        pattern = write_day(str(tmp_path / name), counts, start, 1)
        with open(glob.glob(pattern)[0], "a") as handle:  # 5 records without the label
            handle.writelines(
                json.dumps({"i": start + 5000 + k, "text": "none"}) + "\n" for k in range(5)
            )
        return pattern

    unlabeled, later = (
        with_unlabeled("mixed", {"cat": 40, "dog": 10}, 30_000),
        with_unlabeled("later", {"dog": 8}, 40_000),
    )
    prefix = str(tmp_path / "keep" / "t")
    store_run(unlabeled, prefix, "--keep_unlabeled")
    manifest = layout.read_store_manifest(prefix)
    assert manifest["options"] == {
        "label_field": "animal",
        "balance": "uniform",
        "undersample": False,
        "keep_unlabeled": True,
    }
    assert manifest["generations"][0]["balance"]["records_before"] == {
        "cat": 40,
        "dog": 10,
        "null": 5,
    }
    manifest = append(prefix, later)
    assert manifest["generations"][1]["balance"]["records_after"] == {"dog": 8, "null": 8}
    assert_verified(f"{unlabeled},{later}", prefix)
    materialized, ran = str(tmp_path / "mat" / "t"), str(tmp_path / "run" / "t")
    one = str(tmp_path / "one" / "t")
    store_run(unlabeled, one, "--keep_unlabeled")
    materialize_command.materialize([f"--store={one}", f"--output={materialized}", *FAST])
    run_shuffle(unlabeled, ran, *BALANCE, "--keep_unlabeled")
    assert shard_bytes(materialized) == shard_bytes(ran)
    plain = str(tmp_path / "plain" / "t")
    store_run(day0, plain)
    error = refused_by_cli("append", f"--store={plain}", f"--input={unlabeled}", "--keep_unlabeled")
    assert "--keep_unlabeled true differs from the store's false" in error, error
    error = refused_by_cli("append", f"--store={plain}", f"--input={unlabeled}")
    assert "line 51 of the file" in error and "--keep_unlabeled" in error, error


def test_materialize_records_the_stores_balance_and_verify_says_what_it_can_check(days, tmp_path):
    """One generation: run --balance's manifest (options, counts) and verify --input recomputes its
    copies. Several: each generation was balanced on its own counts, so verify --input points
    at the store, which it verifies."""
    day0, day1 = days
    prefix, ran = str(tmp_path / "store" / "t"), str(tmp_path / "run" / "t")
    store_run(day0, prefix)
    run_shuffle(day0, ran, *BALANCE)
    one = str(tmp_path / "one" / "t")
    materialize_command.materialize([f"--store={prefix}", f"--output={one}", *FAST])
    written, expected = (json.load(open(f"{p}-manifest.json")) for p in (one, ran))
    assert written["balance"] == expected["balance"]
    assert {k: written["options"][k] for k in ("label_field", "balance", "undersample")} == {
        k: expected["options"][k] for k in ("label_field", "balance", "undersample")
    }
    assert verify(day0, one) == []
    append(prefix, day1)
    two = str(tmp_path / "two" / "t")
    materialize_command.materialize([f"--store={prefix}", f"--output={two}", *FAST])
    assert "balance" not in json.load(open(f"{two}-manifest.json"))
    problems = verify(f"{day0},{day1}", two)
    assert (
        len(problems) == 1
        and "2 generations are each balanced on their own class counts" in problems[0]
    ), problems
    assert verify(f"{day0},{day1}", prefix) == []
