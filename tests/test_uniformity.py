"""Is the order a uniform random permutation? Tested over 20 seeds for the pipeline's two
intermediate modes (real runs) and for the loader's epochs, each paired with a known-bad
order that the same test must reject, so every test is shown to be able to fail.

Four statistics per order, each combined over the seeds (independent chi-square
statistics add up; their dofs too):
- input block x output block table (10 x 10): chi-square independence test;
- Spearman's rho: z = rho * sqrt(n - 1), sum of z^2 ~ chi2(seeds);
- ascents (output neighbours in increasing input order): mean (n-1)/2, variance (n+1)/12
  for a uniform permutation; sum of z^2 ~ chi2(seeds) (catches a pile written unsorted);
- "cats then dogs": the batch x label table of batches of 50 (chi-square).
An order passes when all four combined p-values are >= ALPHA = 1e-4. The seeds are
fixed, so the outcome is deterministic; over fresh seed sets a uniform order would fail
a test with probability <= 4e-4 (Bonferroni), about 1.6e-3 for the four uniform tests here.
"""

import glob

import numpy as np
import pytest
from helpers import input_places, read_tfrecord_payloads, run_shuffle, shards
from scipy import stats

from pileshuffle.commands import sample
from pileshuffle.quality import metrics, orders
from pileshuffle.records import keys as keymath

ALPHA = 1e-4
SEEDS = range(20)
RECORDS, FILES, PILES = 2000, 4, 8
FILE_RECORDS = sample.split_counts(RECORDS, FILES)


def uniformity_pvalues(orders_by_seed) -> dict:
    """Combined p-values of the four statistics over the seeds' orders (``order[t]`` =
    input position delivered t-th)."""
    block, block_dof, rank_z2, ascent_z2, batch, batch_dof = [], [], [], [], [], []
    for order in orders_by_seed:
        n = len(order)
        position = orders.inverse(order)
        chi2, dof, _ = metrics.independence(metrics.block_table(np.arange(n), position, n, 10))
        block.append(chi2)
        block_dof.append(dof)
        rank_z2.append(stats.spearmanr(np.arange(n), position).statistic ** 2 * (n - 1))
        ascents = np.count_nonzero(np.diff(order) > 0)
        ascent_z2.append((ascents - (n - 1) / 2) ** 2 / ((n + 1) / 12))
        chi2, dof, _ = metrics.independence(metrics.batch_counts((order >= n // 2).astype(int), 50))
        batch.append(chi2)
        batch_dof.append(dof)
    seeds = len(block)
    return {
        "blocks": metrics.combined_p(block, block_dof),
        "spearman": metrics.combined_p(rank_z2, [seeds]),
        "ascents": metrics.combined_p(ascent_z2, [seeds]),
        "batches": metrics.combined_p(batch, batch_dof),
    }


def assert_uniform(orders_by_seed):
    pvalues = uniformity_pvalues(orders_by_seed)
    assert min(pvalues.values()) >= ALPHA, pvalues


def assert_rejected(orders_by_seed):
    pvalues = uniformity_pvalues(orders_by_seed)
    assert min(pvalues.values()) < ALPHA, pvalues


def pass_two_without_its_sort(seed):
    """A known bug: piles right, but each pile written in input order (pass 2 not sorting)."""
    piles = keymath.pile_of(orders.pileshuffle_keys(FILE_RECORDS, seed), PILES)
    return np.argsort(piles, kind="stable")


def one_pile_buffer(seed):
    """A shuffle buffer holding one pile's worth of records, over the files in order."""
    return orders.shuffle_buffer(np.arange(RECORDS), RECORDS // PILES, np.random.default_rng(seed))


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    directory = tmp_path_factory.mktemp("uniformity")
    sample.write_tfrecord(str(directory / "in"), records=RECORDS, files=FILES, record_bytes=20)
    return directory


@pytest.mark.parametrize("mode", ["files", "shuffle"])
def test_pipeline_order_is_uniform_over_20_seeds_and_a_bad_order_is_rejected(generated, mode):
    found = []
    for seed in SEEDS:
        out = str(generated / mode / f"s{seed}" / "o")
        run_shuffle(
            str(generated / "in" / "*.tfrecord"),
            out,
            f"--num_piles={PILES}",
            f"--seed={seed}",
            f"--intermediate={mode}",
        )
        order = np.array([sample.index_of(r) for r in read_tfrecord_payloads(shards(out))])
        assert sorted(order.tolist()) == list(range(RECORDS))
        # the position-level simulation the loader and report tests build on is the pipeline's order exactly
        places = input_places(glob.glob(str(generated / "in" / "*.tfrecord")))
        assert np.array_equal(order, orders.pileshuffle_order(places, seed))
        found.append(order)
    assert_uniform(found)
    assert_rejected([pass_two_without_its_sort(seed) for seed in SEEDS])
    assert_rejected([one_pile_buffer(seed) for seed in SEEDS])


@pytest.mark.parametrize("mix", [1, 4])
def test_each_loader_epoch_is_uniform_over_20_seeds_and_unshuffled_piles_are_rejected(mix):
    """Piles from the 2-pass shuffle, visited and mixed as the loader does: each epoch is
    uniform. The same loader over piles that are not random subsets (16 input files read
    as they are, WebDataset-style shard shuffling) is not."""
    epochs, bad = [], []
    for seed in SEEDS:
        written = orders.pileshuffle_order(FILE_RECORDS, seed)
        piles = orders.pile_records(FILE_RECORDS, seed, PILES)
        for epoch in (0, 1):
            epochs.append(written[orders.epoch_positions(piles, seed + 1000 * epoch, epoch, mix)])
        bad.append(orders.epoch_positions(sample.split_counts(RECORDS, 16), seed, 1, mix))
    assert_uniform(epochs[0::2])
    assert_uniform(epochs[1::2])
    assert_rejected(bad)


def test_loader_epochs_carry_pile_membership_over_and_mixing_dilutes_it():
    """What a pile-order reshuffle gives up: two records that shared a batch share one
    again about M/mix^2 + 1 - 1/mix times as often as in independent uniform epochs."""
    records, piles_count, batch = 64_000, 32, 64
    file_records = sample.split_counts(records, 8)
    written = orders.pileshuffle_order(file_records, 5)
    piles = orders.pile_records(file_records, 5, piles_count)
    for mix in (1, 4):
        first, second = (
            orders.inverse(written[orders.epoch_positions(piles, 5, e, mix)]) for e in (1, 2)
        )
        carried = metrics.carry_over(first, second, batch)
        ratio = carried["remeet"] / carried["remeet_uniform"]
        assert ratio == pytest.approx(piles_count / mix**2 + 1 - 1 / mix, rel=0.2), (mix, ratio)
    independent = metrics.carry_over(
        orders.inverse(written), orders.inverse(orders.pileshuffle_order(file_records, 6)), batch
    )
    assert independent["remeet"] / independent["remeet_uniform"] == pytest.approx(1, abs=0.2)
