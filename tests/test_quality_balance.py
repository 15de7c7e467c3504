"""``pileshuffle quality`` on ``--balance`` outputs, and the class shares per batch on any
labelled output: the order measured against the input with each record repeated by its
copies (paired by pass-1 key: exactly the run's own order), the displacement test kept exact
on clustered copies, and each class's share of all records and of every batch before and
after. Statistical bounds are binomial (4 standard deviations) on fixed seeds."""

import collections
import glob
import json
import math

import numpy as np
import pytest
from helpers import CLASS_ORDER, run_shuffle, shards, write_animals
from helpers import manifest as read_manifest
from scipy import stats

from pileshuffle.commands.quality import main as quality_main
from pileshuffle.formats import get_format
from pileshuffle.quality import metrics
from pileshuffle.quality.label import Label
from pileshuffle.quality.report import ALPHA, measure

BATCH = 32
PER_BATCH = ("mean", "p5", "p95", "empty")


@pytest.fixture(scope="module")
def animals(tmp_path_factory):
    root = tmp_path_factory.mktemp("animals")
    return write_animals(root), root


def run(animals, name, *args):
    pattern, root = animals
    prefix = str(root / name / "t")
    run_shuffle(pattern, prefix, "--num_piles=3", "--seed=9", *args)
    return prefix


@pytest.fixture(scope="module")
def balanced(animals):
    return run(animals, "uniform", "--label_field=animal", "--balance=uniform")


@pytest.fixture(scope="module")
def unbalanced(animals):
    return run(animals, "plain")


def report_of(animals, prefix, **options):
    pattern, _ = animals
    return measure(
        get_format("jsonl"),
        sorted(glob.glob(pattern)),
        shards(prefix),
        read_manifest(prefix),
        label=Label(field="animal"),
        batch_size=BATCH,
        **options,
    )


def delivered(prefix):
    return [json.loads(line) for path in shards(prefix) for line in open(path)]


def expanded_input(prefix):
    """The input's record indices with each repeated by its copies (counted in the output), in input order."""
    copies = collections.Counter(r["i"] for r in delivered(prefix))
    return np.repeat(np.arange(1000), [copies[i] for i in range(1000)])


def noise(p: float, trials: int) -> float:
    """4 binomial standard deviations of a share p over ``trials`` draws (sampling without
    replacement, as batches of one output are, varies less: the bound is conservative)."""
    return 4 * math.sqrt(p * (1 - p) / trials)


def shares_by_class(report):
    return {row["class"]: row for row in report.summary["class_shares"]["classes"]}


@pytest.mark.parametrize("sample", [100_000, 500], ids=["every record", "a hash sample"])
def test_a_balanced_order_is_measured_against_the_input_with_its_copies(animals, balanced, sample):
    report = report_of(animals, balanced, sample=sample, compare=True)
    summary = report.summary
    own = report.rows[-1]
    output = np.array([r["i"] for r in delivered(balanced)])
    # every located output record sits at its own copy's place in the input with its copies
    assert np.array_equal(expanded_input(balanced)[own.x], output[own.y])
    assert summary["records"] == 2700 and summary["duplicates_left_out"] == 0
    if sample > 2700:
        assert np.array_equal(np.sort(own.x), np.arange(2700)) and summary["records_used"] == 2700
    # copies paired by pass-1 key: the run's own order
    assert summary["pileshuffle_order_reproduced"] == 1.0
    assert summary["uniform"] is True
    assert all(
        summary[k] >= ALPHA
        for k in ("spearman_p", "block_chi2_p", "displacement_p", "batch_dispersion_p")
    )
    assert summary["balance"]["input_records"] == 1000 and summary["balance"]["records"] == 2700
    policies = {p["policy"].split(" (")[0]: p for p in summary["policies"]}
    assert (
        policies["no shuffle"]["uniform"] is False
        and policies["no shuffle"]["batch_dispersion"] > 5
    )
    assert policies["loader, mix=4"]["uniform"] is True


def test_an_undersampled_output_is_measured_though_most_records_are_not_in_it(animals, tmp_path):
    prefix = run(animals, "under", "--label_field=animal", "--balance=sqrt", "--undersample")
    kept = {"cat": round(math.sqrt(900 * 10)), "dog": round(math.sqrt(90 * 10)), "bird": 10}
    report = report_of(animals, prefix)
    output = np.array([r["i"] for r in delivered(prefix)])
    assert report.summary["records"] == report.summary["records_used"] == sum(kept.values())
    assert np.array_equal(expanded_input(prefix)[report.rows[0].x], output[report.rows[0].y])
    classes = shares_by_class(report)
    assert {c: row["records_after"] for c, row in classes.items()} == kept
    assert {c: row["records_before"] for c, row in classes.items()} == CLASS_ORDER


def test_uniform_balance_gives_every_class_an_equal_share_of_every_batch(animals, balanced):
    report = report_of(animals, balanced)
    section = report.summary["class_shares"]
    batches = section["batches_after"]
    assert (
        section["batch_size"] == BATCH
        and batches == 2700 // BATCH
        and section["batches_before"] == 1000 // BATCH
    )
    classes = shares_by_class(report)
    for name, row in classes.items():
        assert row["records_after"] == 900 and row["share_after"] == pytest.approx(1 / 3)
        assert abs(row["after"]["mean"] - 1 / 3) <= noise(1 / 3, batches * BATCH), name
        # a uniform order of the output leaves a class out of a batch this often
        empty = row["after_uniform"]["empty"]
        assert empty < 1e-5 and row["after"]["empty"] <= empty + noise(empty, batches), name
        assert row["after"]["p5"] < 1 / 3 < row["after"]["p95"], name
    bird = classes["bird"]
    assert bird["share_before"] == pytest.approx(0.01)
    # before: the input's order holds the 10 birds in its last batch; a uniform shuffle of it leaves most batches
    # without a bird (hypergeometric: no bird among 32 of 1000 records of which 10 are birds)
    assert bird["before"]["empty"] == pytest.approx(1 - 1 / (1000 // BATCH))
    no_bird = math.prod((990 - j) / (1000 - j) for j in range(BATCH))
    assert bird["before_uniform"]["empty"] == pytest.approx(no_bird) and no_bird > 0.7
    assert bird["after"]["empty"] < bird["before_uniform"]["empty"] - noise(no_bird, batches)


def test_without_balance_the_shares_are_the_same_before_and_after(animals, unbalanced):
    report = report_of(animals, unbalanced)
    section = report.summary["class_shares"]
    assert "balance" not in report.summary
    batches = section["batches_after"]
    for name, row in shares_by_class(report).items():
        assert row["records_before"] == row["records_after"] == CLASS_ORDER[name]
        assert row["share_before"] == row["share_after"]
        # the same records: the same uniform expectation
        assert row["before_uniform"] == row["after_uniform"]
        share = row["share_after"]
        assert abs(row["after"]["mean"] - share) <= noise(share, batches * BATCH), name
        empty = row["after_uniform"]["empty"]
        assert abs(row["after"]["empty"] - empty) <= noise(empty, batches) + 1e-12, name
    assert report.summary["uniform"] is True


def test_the_report_prints_and_writes_the_class_shares(animals, balanced, tmp_path, capsys):
    pattern, _ = animals
    report_dir = tmp_path / "report"
    assert (
        quality_main(
            [
                f"--input={pattern}",
                f"--output={balanced}",
                f"--report={report_dir}",
                "--label_field=animal",
                f"--batch_size={BATCH}",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert (
        "balanced ('animal', uniform, oversampling)" in out
        and "1,000 records with their copies (2,700)" in out
    )
    assert (
        "vs its law given the sampled input positions" in out
        and "consistent with a uniform permutation" in out
    )
    lines = out.splitlines()
    header = next(
        n for n, line in enumerate(lines) if line.startswith("  class shares (field 'animal')")
    )
    # the rarest first
    assert lines[header + 2].split()[0] == "bird" and "1.0% -> 33.3%" in lines[header + 2]
    summary = json.loads((report_dir / "quality.json").read_text())
    section = summary["class_shares"]
    assert set(section) == {"label", "batch_size", "batches_before", "batches_after", "classes"}
    for row in section["classes"]:
        assert set(row) == {
            "class",
            "records_before",
            "records_after",
            "share_before",
            "share_after",
            "before",
            "before_uniform",
            "after",
            "after_uniform",
        }
        assert all(
            set(row[side]) == set(PER_BATCH)
            for side in ("before", "before_uniform", "after", "after_uniform")
        )
    assert set(summary["balance"]) == {
        "label_field",
        "policy",
        "undersample",
        "input_records",
        "records",
        "order_input",
    }
    assert (report_dir / "quality.png").read_bytes()[:4] == b"\x89PNG"


def test_the_displacement_law_given_clustered_positions_keeps_the_test_exact():
    """Uniform permutations of an input with copies (the animals' 900 x 1, 90 x 10, 10 x 90),
    sampled by record as quality samples by hash: the KS test against the law given the
    sampled positions rejects as often as its level says; against the triangle it does not."""
    copies = np.repeat([1, 10, 90], [900, 90, 10])
    n, starts = int(copies.sum()), np.concatenate(([0], np.cumsum(copies)))[:-1]
    runs, level = 200, 0.01
    given, triangle = [], []
    for seed in range(runs):
        rng = np.random.default_rng([seed, 24])
        where = rng.permutation(n)
        kept = rng.random(len(copies)) < 0.3
        x = np.concatenate([np.arange(s, s + c) for s, c in zip(starts[kept], copies[kept])])
        given.append(metrics.order_metrics(x, where[x], n, given_x=True)["displacement_p"])
        triangle.append(metrics.order_metrics(x, where[x], n)["displacement_p"])
    bound = runs * level + 4 * math.sqrt(runs * level * (1 - level))
    assert np.sum(np.array(given) < level) <= bound
    # why: the copies' clusters look like a bad order to the triangle
    assert np.sum(np.array(triangle) < level) > bound
    # the law itself: the mean over the sample of clip(x/n + d, 0, 1), and the triangle on evenly spread x
    x = np.random.default_rng(5).integers(0, 1000, 300)
    grid = np.linspace(-1, 1, 41)
    brute = np.clip(x[:, None] / 1000 + grid[None, :], 0, 1).mean(axis=0)
    assert np.allclose(metrics.displacement_law(x, 1000)(grid), brute)
    assert np.allclose(
        metrics.displacement_law(np.arange(10_000), 10_000)(grid),
        stats.triang(0.5, -1, 2).cdf(grid),
        atol=2e-4,
    )


def test_a_balanced_store_of_one_generation_is_the_run_and_more_generations_are_refused(
    animals, balanced, tmp_path, capsys
):
    """Generation 0 of a balanced store draws ``run``'s keys and copies: the same pairs and
    shares as the run's shards. An appended generation is balanced on its own counts, which
    quality does not recompute: one line."""
    from helpers import refused, succeeded

    from pileshuffle.commands.quality import finished_output

    pattern, root = animals
    store = str(tmp_path / "store" / "s")
    run_shuffle(
        pattern,
        store,
        "--num_piles=3",
        "--seed=9",
        "--layout=store",
        "--label_field=animal",
        "--balance=uniform",
    )
    manifest, output = finished_output(store)
    from_store = measure(
        get_format("jsonl"),
        sorted(glob.glob(pattern)),
        output,
        manifest,
        label=Label(field="animal"),
        batch_size=BATCH,
    )
    from_shards = report_of(animals, balanced)
    assert np.array_equal(from_store.rows[0].x, from_shards.rows[0].x)
    assert np.array_equal(from_store.rows[0].y, from_shards.rows[0].y)
    assert from_store.summary["class_shares"] == from_shards.summary["class_shares"]
    more = tmp_path / "more"
    more.mkdir()
    (more / "c.jsonl").write_text("".join(open(sorted(glob.glob(pattern))[1]).readlines()[-20:]))
    succeeded(
        capsys,
        "append",
        f"--store={store}",
        f"--input={more}/*.jsonl",
        "--direct_running_mode=in_memory",
        "--direct_num_workers=1",
    )
    error = refused(
        capsys,
        "quality",
        f"--input={pattern},{more}/*.jsonl",
        f"--output={store}",
        f"--report={tmp_path / 'r'}",
    )
    assert "holds 2 generations, each balanced" in error and not (tmp_path / "r").exists()
