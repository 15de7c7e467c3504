"""Key derivation and pile arithmetic: pure functions, property-tested."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from pileshuffle.records import keys

seeds = st.integers(min_value=-(2**63), max_value=2**64 - 1)


@given(
    seed=seeds, source=st.integers(0, 10**6), start=st.integers(0, 5000), count=st.integers(0, 300)
)
@settings(max_examples=60, deadline=None)
def test_any_slice_of_a_stream_equals_the_same_slice_of_the_whole(seed, source, start, count):
    whole = keys.record_keys(seed, (0, source), 0, start + count)
    assert np.array_equal(keys.record_keys(seed, (0, source), start, count), whole[start:])


def test_streams_and_seeds_differ():
    a = keys.record_keys(1, (0, 0), 0, 1000)
    assert not np.array_equal(a, keys.record_keys(2, (0, 0), 0, 1000))
    assert not np.array_equal(a, keys.record_keys(1, (0, 1), 0, 1000))


@given(
    num_piles=st.integers(1, 2**31 - 1),
    values=st.lists(st.integers(0, 2**64 - 1), min_size=1, max_size=50),
)
@settings(max_examples=100, deadline=None)
def test_pile_is_the_top_digit_of_u_exactly(num_piles, values):
    u = np.array(values, dtype=np.uint64)
    expected = [(v * num_piles) >> 64 for v in values]
    assert keys.pile_of(u, num_piles).tolist() == expected


def test_piles_are_uniform():
    from scipy.stats import chisquare

    piles = keys.pile_of(keys.record_keys(7, (0, 3), 0, 200_000), 50)
    counts = np.bincount(piles, minlength=50)
    assert chisquare(counts).pvalue > 1e-4


@given(piles=st.lists(st.integers(0, 9), max_size=200))
def test_group_by_pile_is_stable_and_complete(piles):
    piles = np.array(piles, dtype=np.int64)
    order, bounds = keys.group_by_pile(piles, 10)
    assert sorted(order.tolist()) == list(range(len(piles)))
    for p in range(10):
        members = order[bounds[p] : bounds[p + 1]]
        assert (piles[members] == p).all()
        assert list(members) == sorted(members)


@given(
    num_piles=st.sampled_from([1, 2, 255, 256, 257, 65_536, 65_537, 2**31 - 1]),
    draws=st.lists(st.integers(0, 2**31 - 2), max_size=300),
)
@settings(max_examples=200, deadline=None)
def test_pile_order_is_the_stable_order_in_every_width(num_piles, draws):
    """Piles sorted as 8- or 16-bit integers where they fit (a radix sort) are in the order
    numpy's stable sort of the int64 piles gives, at and across each width's bound."""
    piles = np.array([d % num_piles for d in draws], dtype=np.int64)
    expected = np.argsort(piles, kind="stable")
    assert np.array_equal(keys.pile_order(piles, num_piles), expected)


@given(
    values=st.lists(st.integers(0, 2**64 - 1), max_size=300),
    repeats=st.lists(st.integers(0, 299), max_size=20),
)
@settings(max_examples=200, deadline=None)
def test_key_order_is_the_stable_order_with_or_without_ties(values, repeats):
    """Distinct keys in quicksort's order, tied keys (a duplicate's content key) in the stable
    order: equal to the stable sort either way."""
    values = values + [values[r % len(values)] for r in repeats] if values else values
    u = np.array(values, dtype=np.uint64)
    assert np.array_equal(keys.key_order(u), np.argsort(u, kind="stable"))


@given(total=st.integers(1, 10**13), mean=st.floats(1, 10**6), cap=st.integers(1 << 16, 1 << 34))
def test_auto_piles_keep_the_expected_largest_pile_under_the_cap(total, mean, cap):
    m = keys.auto_num_piles(total, mean, cap)
    s = (total / mean) / m
    if cap / mean >= 50:  # the headroom formula is meaningful for piles of many records
        assert s + 6 * s**0.5 <= cap / mean * 1.0001
        assert (
            m == 1
            or (total / mean) / (m - 1) + 6 * ((total / mean) / (m - 1)) ** 0.5
            > cap / mean * 0.9999
        )


def _reference_position_key(seed, stream, position, copy=0):
    """``position_keys`` for one value in Python integers: SplitMix64's finalizer, twice."""
    k0, k1 = (int(w) for w in keys.stream_key(seed, *stream))
    mask = 2**64 - 1

    def mix(z):
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
        return z ^ (z >> 31)

    return mix(mix((position + k0) & mask) ^ ((copy * 0x9E3779B97F4A7C15 + k1) & mask))


@given(
    seed=seeds,
    source=st.integers(0, 10**6),
    places=st.lists(st.integers(0, 2**48), min_size=1, max_size=40),
    copy=st.integers(0, 1000),
)
@settings(max_examples=80, deadline=None)
def test_a_position_key_depends_on_the_position_alone(seed, source, places, copy):
    """Any subset of places, in any order, gets the keys the places get anywhere (a span's reader
    computes its records' keys alone); the vectorized form is the one-value formula."""
    got = keys.position_keys(seed, (0, source), np.array(places))
    assert got.tolist() == [_reference_position_key(seed, (0, source), p) for p in places]
    assert (
        keys.position_keys(seed, (0, source), np.array(places[::-1])).tolist() == got.tolist()[::-1]
    )
    copies = keys.position_keys(seed, (0, source), np.array(places), np.full(len(places), copy))
    assert copies.tolist() == [_reference_position_key(seed, (0, source), p, copy) for p in places]
    assert (copy == 0) == (copies.tolist() == got.tolist())


def test_position_keys_are_distinct_and_uniform_over_byte_offsets_and_rows():
    """Distinct places never share a key (two bijections); the top digits of keys of regularly
    spaced offsets (a TFRecord of equal frames) and of row numbers are uniform piles, and the
    next digits (pass 2's order) are uniform within a pile."""
    from scipy.stats import chisquare

    for places in (np.arange(200_000), np.arange(200_000) * 36, np.arange(200_000) * 4096 + 17):
        u = keys.position_keys(7, (0, 3), places)
        assert len(np.unique(u)) == len(places)
        assert chisquare(np.bincount(keys.pile_of(u, 50), minlength=50)).pvalue > 1e-4
        # digits below the top 16 bits
        within = keys.pile_of(u << np.uint64(16), 64)[keys.pile_of(u, 4) == 0]
        assert chisquare(np.bincount(within, minlength=64)).pvalue > 1e-4
    assert not np.array_equal(
        keys.position_keys(1, (0, 0), np.arange(100)), keys.position_keys(2, (0, 0), np.arange(100))
    )
    assert not np.array_equal(
        keys.position_keys(1, (0, 0), np.arange(100)), keys.position_keys(1, (0, 1), np.arange(100))
    )
