"""Pass 2's parts fetched concurrently from an object store (``part_fetch``, called by
``fragments.read_joined``), on the real emulator, behind a proxy that delays every request by
30 ms (tests/delay_proxy.py) and counts what reaches it: the bytes and their order are the
ones asked for, neighbouring ranges of one object are one request and ranges of different
objects never are, the requests in flight stay within their bounds, a pile of N parts takes
far fewer sequential round trips than N, and a range that cannot be read is named."""

import dataclasses
import os
import random
from urllib.parse import unquote

import delay_proxy
import numpy as np
import pyarrow as pa
import pytest

from pileshuffle.engine.fragments import read_joined
from pileshuffle.engine.runs import PileRuns
from pileshuffle.errors import InputError
from pileshuffle.io import part_fetch, storage

DELAY = 0.03


@pytest.fixture(scope="module")
def proxy(gcs_root):
    """The emulator's endpoint behind a 30 ms proxy."""
    direct = os.environ.get("STORAGE_EMULATOR_HOST")
    if not direct:
        pytest.skip("only on the emulator: the proxy delays and counts the emulator's requests")
    process, endpoint = delay_proxy.start(direct, DELAY)
    yield endpoint
    process.kill()
    process.wait()


@pytest.fixture
def through(proxy, monkeypatch):
    """A function that makes the reads after it go through the proxy, with its counts zeroed
    after one warm-up read of ``path`` (the bucket's first contact)."""

    def switch(path):
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy)
        list(part_fetch.in_order([(path, 0, 1)]))
        delay_proxy.counts(proxy, reset=True)

    return switch


def counted(reset: bool = True) -> dict:
    """The proxy's counts since the last reset (``delay_proxy.counts``), zeroed after."""
    return delay_proxy.counts(os.environ["STORAGE_EMULATOR_HOST"], reset)


def objects(folder: str, count: int, size: int) -> dict:
    """``count`` objects of ``size`` random bytes under ``folder``, written to the emulator."""
    rng = random.Random(count * size)
    written = {f"{folder}/run-{n:04d}": rng.randbytes(size) for n in range(count)}
    for path, data in written.items():
        storage.write_whole(path, data)
    return written


def ranges_asked(seen: list) -> list:
    """``(object name, Range header)`` of each ranged request the proxy saw, in arrival order."""
    names = [unquote(target.split("?")[0]).rsplit("/", 1)[1] for _, target, _, _, _ in seen]
    return [(name, ranged) for name, (_, _, ranged, _, _) in zip(names, seen) if ranged]


def sequential_round_trips(seen: list) -> int:
    """The longest chain of requests each made after the one before it was answered: N for N
    requests one at a time, about N / k for k at once."""
    chain, last_answered = 0, float("-inf")
    for came, answered in sorted(((s[3], s[4]) for s in seen), key=lambda interval: interval[1]):
        if came >= last_answered:
            chain, last_answered = chain + 1, answered
    return chain


def test_the_bytes_come_in_the_order_asked(gcs, through):
    written = objects(gcs, 12, 20_000)
    rng = random.Random(1)
    asked = [
        (path, offset, length)
        for path in written
        for offset, length in ((0, 700), (9_000, 4_000), (19_000, 1_000))
    ]
    rng.shuffle(asked)
    through(next(iter(written)))
    got = [buffer.to_pybytes() for buffer in part_fetch.in_order(asked, in_flight=8)]
    assert got == [written[path][offset : offset + length] for path, offset, length in asked]


def test_a_pile_read_from_runs_on_the_store_equals_it_read_locally(gcs, through, tmp_path):
    """The real pass-2 reader (``read_joined``) over real runs (``PileRuns``): 3 piles' parts of
    40 runs, read from the store in canonical order, equal the local read, one request a part."""
    rng, fragments = np.random.default_rng(7), []
    for run in range(40):
        keys = rng.integers(0, 2**64 - 1, 300, dtype=np.uint64)
        payloads = [rng.bytes(int(n)) for n in rng.integers(10, 400, 300)]
        writer = PileRuns(3, 1 << 40, f"w{run:03d}", str(tmp_path), (run,))
        writer.add(
            pa.table({"payload": pa.array(payloads, pa.binary())}),
            keys,
            keys,
            np.full(300, 100, np.uint64),
        )
        fragments += writer.flush()
    for name in os.listdir(tmp_path):
        storage.write_whole(f"{gcs}/{name}", (tmp_path / name).read_bytes())
    through(f"{gcs}/{os.listdir(tmp_path)[0]}")
    for pile in range(3):
        local = sorted((f for p, f in fragments if p == pile), key=lambda f: f.order)
        remote = [dataclasses.replace(f, path=f"{gcs}/{os.path.basename(f.path)}") for f in local]
        assert read_joined(remote).equals(read_joined(local))
    seen = counted()
    assert len(ranges_asked(seen["seen"])) == len(fragments) and seen["peak"] > 1


def test_neighbours_in_one_object_are_one_request_and_other_objects_never_join(gcs, through):
    """Ranges of one object that touch, overlap, repeat or lie within 64 KiB are one request;
    the same offsets in another object are a request of their own, and so is a range past the
    gap."""
    written = objects(gcs, 2, 400_000)
    a, b = sorted(written)
    asked = [
        (a, 0, 1_000),
        (b, 1_000, 500),
        (a, 1_000, 2_000),
        (a, 500, 100),
        (a, 0, 1_000),
        (a, 3_000 + 60_000, 1_000),
        (b, 0, 1_000),
        (a, 300_000, 10),
    ]
    through(a)
    got = [buffer.to_pybytes() for buffer in part_fetch.in_order(asked)]
    assert got == [written[path][offset : offset + length] for path, offset, length in asked]
    assert sorted(ranges_asked(counted()["seen"])) == [
        ("run-0000", "bytes=0-63999"),
        ("run-0000", "bytes=300000-300009"),
        ("run-0001", "bytes=0-1499"),
    ]


def test_the_requests_in_flight_stay_within_both_bounds(gcs, through):
    written = objects(gcs, 64, 100_000)
    asked = [(path, 0, 100_000) for path in written]
    through(asked[0][0])
    assert sum(b.size for b in part_fetch.in_order(asked, in_flight=8)) == 64 * 100_000
    by_count = counted()
    assert by_count["requests"] == 64 and 4 <= by_count["peak"] <= 8
    fetched = part_fetch.in_order(asked, in_flight=16, bytes_in_flight=300_000)
    assert sum(b.size for b in fetched) == 64 * 100_000
    by_bytes = counted()
    assert by_bytes["requests"] == 64 and 2 <= by_bytes["peak"] <= 3


def test_a_pile_of_many_parts_takes_far_fewer_sequential_round_trips(gcs, through):
    """200 parts in 200 objects: 200 requests either way, but 200 round trips one after another
    at one in flight (the old pass 2), and at most a fifth of that at the default."""
    written = objects(gcs, 200, 2_000)
    asked = [(path, 100, 1_000) for path in written]
    through(asked[0][0])
    for in_flight in (1, part_fetch.IN_FLIGHT):
        got = [b.to_pybytes() for b in part_fetch.in_order(asked, in_flight=in_flight)]
        assert got == [written[path][100:1_100] for path in written]
        counts = counted()
        trips, peak = sequential_round_trips(counts["seen"]), counts["peak"]
        assert counts["requests"] == 200
        if in_flight == 1:
            assert trips == 200 and peak == 1
        else:
            assert trips <= 40 and part_fetch.IN_FLIGHT // 2 <= peak <= part_fetch.IN_FLIGHT, peak


def test_a_range_that_cannot_be_read_is_named_with_its_object_and_bytes(gcs, through):
    written = objects(gcs, 3, 5_000)
    first, second, _ = sorted(written)
    through(first)
    with pytest.raises(part_fetch.RangeReadError) as short:
        list(part_fetch.in_order([(first, 0, 100), (second, 4_000, 2_000)]))
    assert f"{second}: cannot read bytes 4,000-5,999" in str(short.value)
    with pytest.raises(part_fetch.RangeReadError) as missing:
        list(part_fetch.in_order([(first, 0, 100), (f"{gcs}/run-gone", 1_000, 1_000)]))
    said = f"{gcs}/run-gone: cannot read bytes 1,000-1,999 (1 part(s) of a pass-1 run): not found"
    assert said in str(missing.value)


def test_a_refusal_and_an_outage_keep_their_meaning(gcs, through):
    """A refused read is the one-line refusal every read gives (``InputError`` naming the path);
    a 503 outage of a part's object (7 s) is retried through, the bytes as written."""
    import gcs_emulator

    refused = f"{gcs}/{gcs_emulator.FORBIDDEN}/run"
    flaky = f"{gcs}/{gcs_emulator.FLAKY}-fetch/run"
    written = objects(gcs, 4, 3_000)
    storage.write_whole(flaky, b"f" * 3_000)
    through(next(iter(written)))
    with pytest.raises(InputError) as error:
        list(part_fetch.in_order([(path, 0, 10) for path in written] + [(refused, 0, 10)]))
    assert str(error.value).startswith(f"{refused}: permission denied")
    asked = [(path, 10, 100) for path in written] + [(flaky, 5, 20)]
    assert [b.to_pybytes() for b in part_fetch.in_order(asked)] == [
        written[path][10:110] for path in written
    ] + [b"f" * 20]


def test_a_request_dropped_midway_delivers_the_bytes_as_written(gcs):
    """The emulator drops the first read of an object under CUT after 64 KiB (read directly: the
    proxy would relay the short answer whole): the request is retried, the bytes as written."""
    import gcs_emulator

    if not os.environ.get("STORAGE_EMULATOR_HOST"):
        pytest.skip("only on the emulator: it drops the read")
    path = f"{gcs}/{gcs_emulator.CUT}/run"
    data = random.Random(5).randbytes(400_000)
    storage.write_whole(path, data)
    asked = [(path, 1_000, 300_000), (path, 350_000, 50_000)]  # one request of 399,000 bytes
    got = [b.to_pybytes() for b in part_fetch.in_order(asked)]
    assert got == [data[1_000:301_000], data[350_000:400_000]]
    cut = gcs_emulator.cut_paths(os.environ["STORAGE_EMULATOR_HOST"])
    assert any(unquote(p).endswith(path.split("/", 3)[3]) for p in cut), cut


def test_coalesce_orders_requests_by_the_first_range_each_serves():
    past_gap = 10 + part_fetch.GAP_BYTES + 1
    asked = [
        ("gs://b/y", 50, 10),
        ("gs://b/x", 0, 10),
        ("gs://b/y", 0, 10),
        ("gs://b/x", past_gap, 5),
    ]
    assert [(r.path, r.offset, r.length, r.parts) for r in part_fetch.coalesce(asked)] == [
        ("gs://b/y", 0, 60, ((0, 50, 10), (2, 0, 10))),
        ("gs://b/x", 0, 10, ((1, 0, 10),)),
        ("gs://b/x", past_gap, 5, ((3, 0, 5),)),
    ]
    big = [("gs://b/z", n * (1 << 20), 1 << 20) for n in range(40)]
    assert [r.length for r in part_fetch.coalesce(big)] == [16 << 20, 16 << 20, 8 << 20]
