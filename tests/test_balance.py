"""Class rebalancing's arithmetic (issue 24's first step): targets per policy, and copies per
record that add up to each class's target exactly, spread evenly over the input's order."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pileshuffle.engine.balance import Policy, class_phase, copies


@settings(max_examples=300, deadline=None)
@given(
    count=st.integers(1, 5000),
    target=st.integers(0, 20000),
    phase_fraction=st.floats(0, 0.999),
    cuts=st.lists(st.integers(0, 5000), max_size=6),
)
def test_copies_add_up_to_the_target_and_spread_evenly_however_the_ranks_are_split(
    count, target, phase_fraction, cuts
):
    phase = int(phase_fraction * count)
    ranks = np.arange(count)
    whole = copies(ranks, count, target, phase)
    assert whole.sum() == target
    assert set(whole.tolist()) <= {target // count, -(-target // count)}
    window = max(1, count // 7)  # any run of ranks holds its share of the copies, within one
    running = np.concatenate(([0], np.cumsum(whole)))
    spans = running[window:] - running[:-window]
    assert np.all(np.abs(spans - window * target / count) < 1 + 1e-9)
    bounds = sorted({0, count, *(c for c in cuts if c < count)})
    pieces = [copies(ranks[a:b], count, target, phase) for a, b in zip(bounds[:-1], bounds[1:])]
    # a pure function of the rank: sources split anywhere
    assert np.concatenate(pieces).tolist() == whole.tolist()


def test_copies_are_exact_past_64_bit_products():
    count, target = 3_000_000_007, 5_000_000_011
    ranks = np.array([0, 1, count // 2, count - 1])
    got = copies(ranks, count, target, 12345)
    expected = [
        ((k + 1) * target + 12345) // count - (k * target + 12345) // count for k in ranks.tolist()
    ]
    assert got.tolist() == expected


def test_the_phase_is_seeded_per_class_and_in_range():
    assert class_phase(1, "cat", 1000) == class_phase(1, "cat", 1000)
    phases = {class_phase(seed, "cat", 10**9) for seed in range(20)}
    assert len(phases) == 20 and all(0 <= p < 10**9 for p in phases)
    assert class_phase(1, "cat", 10**9) != class_phase(1, "dog", 10**9)


COUNTS = {"cat": 9000, "dog": 900, "bird": 100}


def test_uniform_copies_every_class_up_to_the_largest_or_cuts_it_down_to_the_smallest():
    assert Policy.parse("uniform").targets(COUNTS) == {"cat": 9000, "dog": 9000, "bird": 9000}
    assert Policy.parse("uniform", undersample=True).targets(COUNTS) == {
        "cat": 100,
        "dog": 100,
        "bird": 100,
    }


def test_sqrt_keeps_the_square_root_of_each_ratio():
    up = Policy.parse("sqrt").targets(COUNTS)
    assert up == {
        "cat": 9000,
        "dog": round(math.sqrt(900 * 9000)),
        "bird": round(math.sqrt(100 * 9000)),
    }
    down = Policy.parse("sqrt", undersample=True).targets(COUNTS)
    assert down == {
        "cat": round(math.sqrt(9000 * 100)),
        "dog": round(math.sqrt(900 * 100)),
        "bird": 100,
    }
    for targets in (up, down):
        assert abs(targets["cat"] / targets["bird"] - math.sqrt(90)) < 0.05


@settings(max_examples=200, deadline=None)
@given(
    counts=st.dictionaries(st.sampled_from("abcdef"), st.integers(1, 10**6), min_size=1),
    weights=st.lists(st.floats(0.01, 100), min_size=6, max_size=6),
    undersample=st.booleans(),
)
def test_weights_give_their_shares_without_dropping_or_inventing(counts, weights, undersample):
    spec = ",".join(f"{c}={w!r}" for c, w in zip(sorted(counts), weights))
    targets = Policy.parse(spec, undersample).targets(counts)
    for c, n in counts.items():
        assert (targets[c] <= n) if undersample else (targets[c] >= n)
    shares = dict(zip(sorted(counts), weights))
    # the class that binds keeps its count
    scale = (min if undersample else max)(counts[c] / shares[c] for c in counts)
    for c in counts:  # every target is its weight's share of one scale, rounded
        assert abs(targets[c] - scale * shares[c]) <= 0.5 + 1e-9 * scale * shares[c]


@pytest.mark.parametrize(
    "text, words",
    [
        ("", "uniform, sqrt or weights"),
        ("cat=0.5,dog", "'dog'"),
        ("cat=-1", "positive"),
        ("cat=x", "'cat=x'"),
        ("cat=0.5,cat=0.2", "twice"),
        ("=0.5", "'=0.5'"),
        ("cat=nan", "positive"),
    ],
)
def test_bad_policies_are_refused_naming_the_part(text, words):
    with pytest.raises(ValueError, match="--balance") as error:
        Policy.parse(text)
    assert words in str(error.value)


def test_weights_must_name_exactly_the_classes_present():
    with pytest.raises(ValueError, match="no weight for 'bird'.*classes in the data"):
        Policy.parse("cat=1,dog=1").targets(COUNTS)
    with pytest.raises(ValueError, match="no record of 'fish'"):
        Policy.parse("cat=1,dog=1,bird=1,fish=1").targets(COUNTS)


# --- run --label_field FIELD --balance POLICY: real pipelines ----------------------------------------

import collections  # noqa: E402
import glob  # noqa: E402
import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

from helpers import (
    CLASS_ORDER,
    assert_verified,
    manifest,
    refused,
    run_shuffle,
    shard_bytes,
    shards,
    write_animals,
)  # noqa: E402

from pileshuffle.commands import sample  # noqa: E402


@pytest.fixture(scope="module")
def animals(tmp_path_factory):
    root = tmp_path_factory.mktemp("animals")
    return write_animals(root), root


def delivered(prefix):
    return [json.loads(line) for path in shards(prefix) for line in open(path)]


@pytest.mark.parametrize(
    "policy, undersample, expected",
    [
        ("uniform", False, {"cat": 900, "dog": 900, "bird": 900}),
        ("uniform", True, {"cat": 10, "dog": 10, "bird": 10}),
        (
            "sqrt",
            False,
            {"cat": 900, "dog": round(math.sqrt(90 * 900)), "bird": round(math.sqrt(10 * 900))},
        ),
        ("cat=2,dog=1,bird=1", False, {"cat": 900, "dog": 450, "bird": 450}),
    ],
)
def test_a_balanced_run_hits_every_target_exactly_and_verify_proves_it(
    animals, tmp_path, policy, undersample, expected
):
    pattern, _ = animals
    prefix = str(tmp_path / "out" / "t")
    args = ["--label_field=animal", f"--balance={policy}", "--num_piles=3", "--seed=9"] + (
        ["--undersample"] if undersample else []
    )
    written = run_shuffle(pattern, prefix, *args)
    records = delivered(prefix)
    assert collections.Counter(r["animal"] for r in records) == expected
    assert (
        written["balance"]["records_before"] == CLASS_ORDER
        and written["balance"]["records_after"] == expected
    )
    assert written["input_fingerprint"]["records"] == 1000 and written["totals"]["records"] == sum(
        expected.values()
    )
    # every record of a class copied floor or ceil of target / count times
    copies = collections.Counter()
    for r in records:
        copies[(r["animal"], r["i"])] += 1
    for (animal, _), k in copies.items():
        assert k in {
            expected[animal] // CLASS_ORDER[animal],
            -(-expected[animal] // CLASS_ORDER[animal]),
        }
    assert_verified(pattern, prefix)


def test_copies_spread_over_the_whole_output_and_a_rerun_gives_the_same_bytes(animals, tmp_path):
    pattern, _ = animals
    args = ["--label_field=animal", "--balance=uniform", "--num_piles=4", "--seed=3"]
    first, again = str(tmp_path / "a" / "t"), str(tmp_path / "b" / "t")
    run_shuffle(pattern, first, *args)
    run_shuffle(pattern, again, *args)
    assert shard_bytes(first) == shard_bytes(again)
    records = delivered(first)
    # each third holds each class's share
    for part in (
        records[:900],
        records[900:1800],
        records[1800:],
    ):
        shares = collections.Counter(r["animal"] for r in part)
        assert all(250 < shares[a] < 350 for a in CLASS_ORDER), shares
    birds = [n for n, r in enumerate(records) if r["animal"] == "bird" and r["i"] == 995]
    # one bird's copies, spread
    assert len(birds) == 90 and min(np.diff(birds)) > 0 and max(birds) - min(birds) > 1500
    other = str(tmp_path / "c" / "t")
    run_shuffle(pattern, other, *args[:-1], "--seed=4")
    assert shard_bytes(other) != shard_bytes(first)


def test_verify_finds_a_lost_copy_and_a_changed_label(animals, tmp_path):
    from pileshuffle.commands.verify import verify

    pattern, root = animals
    prefix = str(tmp_path / "out" / "t")
    run_shuffle(pattern, prefix, "--label_field=animal", "--balance=uniform", "--num_piles=2")
    first = shards(prefix)[0]
    lines = open(first).readlines()
    open(first, "w").writelines(lines[1:])
    assert verify(pattern, prefix, None)
    open(first, "w").writelines(lines)
    assert verify(pattern, prefix, None) == []
    changed = tmp_path / "changed"
    changed.mkdir()
    for path in glob.glob(pattern):
        text = open(path).read().replace('"animal": "dog"', '"animal": "cat"', 1)
        (changed / path.rsplit("/", 1)[-1]).write_text(text)
    problems = verify(str(changed / "*.jsonl"), prefix, None)
    assert any("input" in p for p in problems), problems


def test_balance_refusals_are_one_line(animals, tmp_path, capsys):
    pattern, _ = animals
    out = [f"--input={pattern}", f"--output={tmp_path}/o"]
    assert "needs --label_field" in refused(capsys, "run", *out, "--balance=uniform")
    assert "only means something with --balance" in refused(
        capsys, "run", *out, "--label_field=animal"
    )
    assert "'cat=x' is not one" in refused(
        capsys, "run", *out, "--label_field=animal", "--balance=cat=x"
    )
    for args, words in (
        (["--label_field=animal", "--balance=cat=1,dog=1"], ["no weight for 'bird'"]),
        (["--label_field=colour", "--balance=uniform"], [".jsonl: a line", "colour"]),
    ):
        # known only once the first pass has read the classes
        done = subprocess.run(
            [sys.executable, "-m", "pileshuffle", "run", *out, *args],
            capture_output=True,
            text=True,
            timeout=300,
        )
        errors = [
            line for line in done.stderr.splitlines() if line.startswith("pileshuffle: error: ")
        ]
        assert done.returncode == 2 and len(errors) == 1 and "Traceback" not in done.stderr, (
            done.stderr
        )
        assert all(word in errors[0] for word in words), errors
    assert not glob.glob(f"{tmp_path}/o-*")


def test_tar_samples_balance_by_their_cls_member(tmp_path):
    sample.write_tar(str(tmp_path / "in"), records=400, files=2, record_bytes=60, classes=4)
    prefix = str(tmp_path / "out" / "t")
    written = run_shuffle(
        str(tmp_path / "in" / "*.tar"),
        prefix,
        "--label_field=cls",
        "--balance=uniform",
        "--undersample",
        "--num_piles=2",
    )
    assert written["balance"]["records_after"] == {"0": 100, "1": 100, "2": 100, "3": 100}
    assert manifest(prefix)["totals"]["records"] == 400


def test_plan_says_a_counting_pass_reads_the_input_first(animals, tmp_path, capsys):
    from helpers import succeeded

    pattern, _ = animals
    args = [
        "plan",
        f"--input={pattern}",
        f"--output={tmp_path}/o",
        "--label_field=animal",
        "--balance=sqrt",
    ]
    out, _ = succeeded(capsys, *args)
    assert "balance" in out and "a first pass reads the input to count the classes" in out
    out, _ = succeeded(capsys, *args, "--json")
    found = json.loads(out)["balance"]
    assert found.pop("growth_estimate") > 1  # the animals are 900/90/10
    assert found == {
        "label_field": "animal",
        "policy": "sqrt",
        "undersample": False,
        "counting_pass": True,
    }


def test_quality_measures_a_balanced_output_against_its_input_with_the_copies(
    animals, tmp_path, capsys
):
    from pileshuffle.commands.quality import main as quality_main

    pattern, _ = animals
    prefix = str(tmp_path / "out" / "t")
    run_shuffle(pattern, prefix, "--label_field=animal", "--balance=uniform", "--num_piles=2")
    assert (
        quality_main(
            [
                f"--input={pattern}",
                f"--output={prefix}",
                f"--report={tmp_path / 'r'}",
                "--label_field=animal",
            ]
        )
        == 0
    )
    out, err = capsys.readouterr()
    assert (
        "2,700 records, 2,700 located by hash" in out
        and "1,000 records with their copies (2,700)" in out
    )
    assert "consistent with a uniform permutation" in out and "class shares (field 'animal')" in out
    assert "error" not in err and "Traceback" not in err
    assert (
        json.loads((tmp_path / "r" / "quality.json").read_text())["class_shares"]["batches_after"]
        == 2700 // 256
    )


def test_copies_of_tar_samples_are_refused_before_anything_runs(tmp_path, capsys):
    """A copy keeps its sample's key, which a shard cannot hold twice: refused at planning."""
    sample.write_tar(str(tmp_path / "in"), records=40, files=1, record_bytes=60, classes=4)
    err = refused(
        capsys,
        "run",
        f"--input={tmp_path}/in/*.tar",
        f"--output={tmp_path}/out/t",
        "--label_field=cls",
        "--balance=uniform",
        option="--undersample",
    )
    assert "WebDataset key" in err and not (tmp_path / "out").exists()


def test_auto_piles_and_the_space_check_are_sized_for_what_balance_writes(tmp_path, capsys):
    """A 70/20/10 input that --balance uniform writes 2.1x over: the plan estimates that from a
    sample of labels, so auto piles fit the output and pass 2 splits none of them."""
    from helpers import succeeded

    rng = np.random.default_rng(5)
    labels = rng.permutation(np.repeat(["a", "b", "c"], [7000, 2000, 1000]))
    (tmp_path / "in").mkdir()
    for part in range(2):
        with open(tmp_path / "in" / f"p{part}.jsonl", "w") as handle:
            for i, label in enumerate(labels[part::2]):
                handle.write(json.dumps({"i": i, "label": str(label), "pad": "x" * 300}) + "\n")
    pattern, prefix = str(tmp_path / "in" / "*.jsonl"), str(tmp_path / "out" / "t")
    args = [f"--input={pattern}", f"--output={prefix}", "--max_pile_bytes=1MiB", "--json"]
    plain = json.loads(succeeded(capsys, "plan", *args)[0])
    balanced = json.loads(
        succeeded(capsys, "plan", *args, "--label_field=label", "--balance=uniform")[0]
    )
    assert 1.9 < balanced["num_piles"] / plain["num_piles"] < 2.3, (
        plain["num_piles"],
        balanced["num_piles"],
    )
    assert "written 2.1" in balanced["reason"] or "written 2.0" in balanced["reason"], balanced[
        "reason"
    ]
    assert 1.9 < balanced["expected_pile_records"] * balanced["num_piles"] / 10000 < 2.3
    staged = [k for k in plain["space"] if "staging" in k]
    assert 1.9 < balanced["space"][staged[0]]["needed"] / plain["space"][staged[0]]["needed"] < 2.3
    found = run_shuffle(
        pattern, prefix, "--label_field=label", "--balance=uniform", "--max_pile_bytes=1MiB"
    )
    assert found["options"]["num_piles"] == balanced["num_piles"] and found["piles_split"] == 0
    assert found["balance"]["records_after"] == {"a": 7000, "b": 7000, "c": 7000}
