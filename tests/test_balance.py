"""Class rebalancing's arithmetic (issue 24's first step): targets per policy, and copies per
record that add up to each class's target exactly, spread evenly over the input's order."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pileshuffle.balance import Policy, class_phase, copies


@settings(max_examples=300, deadline=None)
@given(count=st.integers(1, 5000), target=st.integers(0, 20000), phase_fraction=st.floats(0, 0.999),
       cuts=st.lists(st.integers(0, 5000), max_size=6))
def test_copies_add_up_to_the_target_and_spread_evenly_however_the_ranks_are_split(count, target, phase_fraction, cuts):
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
    assert np.concatenate(pieces).tolist() == whole.tolist()  # a pure function of the rank: sources split anywhere


def test_copies_are_exact_past_64_bit_products():
    count, target = 3_000_000_007, 5_000_000_011
    ranks = np.array([0, 1, count // 2, count - 1])
    got = copies(ranks, count, target, 12345)
    expected = [((k + 1) * target + 12345) // count - (k * target + 12345) // count for k in ranks.tolist()]
    assert got.tolist() == expected


def test_the_phase_is_seeded_per_class_and_in_range():
    assert class_phase(1, "cat", 1000) == class_phase(1, "cat", 1000)
    phases = {class_phase(seed, "cat", 10**9) for seed in range(20)}
    assert len(phases) == 20 and all(0 <= p < 10**9 for p in phases)
    assert class_phase(1, "cat", 10**9) != class_phase(1, "dog", 10**9)


COUNTS = {"cat": 9000, "dog": 900, "bird": 100}


def test_uniform_copies_every_class_up_to_the_largest_or_cuts_it_down_to_the_smallest():
    assert Policy.parse("uniform").targets(COUNTS) == {"cat": 9000, "dog": 9000, "bird": 9000}
    assert Policy.parse("uniform", undersample=True).targets(COUNTS) == {"cat": 100, "dog": 100, "bird": 100}


def test_sqrt_keeps_the_square_root_of_each_ratio():
    up = Policy.parse("sqrt").targets(COUNTS)
    assert up == {"cat": 9000, "dog": round(math.sqrt(900 * 9000)), "bird": round(math.sqrt(100 * 9000))}
    down = Policy.parse("sqrt", undersample=True).targets(COUNTS)
    assert down == {"cat": round(math.sqrt(9000 * 100)), "dog": round(math.sqrt(900 * 100)), "bird": 100}
    for targets in (up, down):
        assert abs(targets["cat"] / targets["bird"] - math.sqrt(90)) < 0.05


@settings(max_examples=200, deadline=None)
@given(counts=st.dictionaries(st.sampled_from("abcdef"), st.integers(1, 10**6), min_size=1),
       weights=st.lists(st.floats(0.01, 100), min_size=6, max_size=6), undersample=st.booleans())
def test_weights_give_their_shares_without_dropping_or_inventing(counts, weights, undersample):
    spec = ",".join(f"{c}={w!r}" for c, w in zip(sorted(counts), weights))
    targets = Policy.parse(spec, undersample).targets(counts)
    for c, n in counts.items():
        assert (targets[c] <= n) if undersample else (targets[c] >= n)
    shares = dict(zip(sorted(counts), weights))
    scale = (min if undersample else max)(counts[c] / shares[c] for c in counts)  # the class that binds keeps its count
    for c in counts:  # every target is its weight's share of one scale, rounded
        assert abs(targets[c] - scale * shares[c]) <= 0.5 + 1e-9 * scale * shares[c]


@pytest.mark.parametrize("text, words", [
    ("", "uniform, sqrt or weights"), ("cat=0.5,dog", "'dog'"), ("cat=-1", "positive"), ("cat=x", "'cat=x'"),
    ("cat=0.5,cat=0.2", "twice"), ("=0.5", "'=0.5'"), ("cat=nan", "positive"),
])
def test_bad_policies_are_refused_naming_the_part(text, words):
    with pytest.raises(ValueError, match="--balance") as error:
        Policy.parse(text)
    assert words in str(error.value)


def test_weights_must_name_exactly_the_classes_present():
    with pytest.raises(ValueError, match="no weight for 'bird'.*classes in the data"):
        Policy.parse("cat=1,dog=1").targets(COUNTS)
    with pytest.raises(ValueError, match="no record of 'fish'"):
        Policy.parse("cat=1,dog=1,bird=1,fish=1").targets(COUNTS)
