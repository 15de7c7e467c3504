"""``loader.gather``: rows of several Parquet pile tables as one table, against Arrow's own
take over the tables joined; then through real outputs of a user's Parquet (several piles
per step, and a Mixture)."""

import collections
import gc
import hashlib
import json
import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import manifest, run_shuffle, shards
from hypothesis import given, settings
from hypothesis import strategies as st

from pileshuffle.loader import Mixture, ShuffledDataset, epoch_order
from pileshuffle.loader import gather as gathering

_TYPES = {  # column -> (type, how to make n values of it from a numpy generator)
    "i8": (pa.int8(), lambda g, n: g.integers(-128, 128, n)),
    "u16": (pa.uint16(), lambda g, n: g.integers(0, 2**16, n)),
    "i64": (pa.int64(), lambda g, n: g.integers(-(2**62), 2**62, n)),
    "f32": (pa.float32(), lambda g, n: g.standard_normal(n).astype(np.float32)),
    "f64": (pa.float64(), lambda g, n: g.standard_normal(n)),
    "flag": (pa.bool_(), lambda g, n: g.integers(0, 2, n).astype(bool)),
    # 0..12 bytes: inline views
    "short": (
        pa.string(),
        lambda g, n: ["é" * int(k) for k in g.integers(0, 7, n)],
    ),
    "text": (
        pa.string(),
        lambda g, n: [f"record {k:06d} " + "x" * int(k % 40) for k in g.integers(0, 10**6, n)],
    ),
    "blob": (
        pa.binary(),
        lambda g, n: [
            bytes(g.integers(0, 256, int(k), dtype=np.uint8)) for k in g.integers(0, 300, n)
        ],
    ),
    "empty": (pa.binary(), lambda g, n: [b""] * n),
    "vector": (
        pa.list_(pa.float32()),
        lambda g, n: [
            list(g.standard_normal(int(k)).astype(np.float32)) for k in g.integers(0, 4, n)
        ],
    ),
    "category": (
        pa.dictionary(pa.int8(), pa.string()),
        lambda g, n: [("a", "b", "c")[k] for k in g.integers(0, 3, n)],
    ),
}


def _table(g, n, names, nulls):
    """``n`` rows of the columns ``names``; ``nulls``: some values of each column null."""
    columns = {}
    for name in names:
        kind, make = _TYPES[name]
        values = list(make(g, n))
        if nulls:
            values = [None if g.random() < 0.2 else v for v in values]
        columns[name] = pa.array(
            values, type=pa.string() if kind == pa.dictionary(pa.int8(), pa.string()) else kind
        )
        if pa.types.is_dictionary(kind):
            columns[name] = columns[name].dictionary_encode().cast(kind)
    table = pa.table(columns).replace_schema_metadata({"source": "test"})
    return table


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 40), min_size=1, max_size=4),
    names=st.sets(st.sampled_from(sorted(_TYPES)), min_size=1),
    nulls=st.booleans(),
    sliced=st.booleans(),
    repeats=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_the_gather_is_arrows_take_over_the_tables_joined(
    sizes, names, nulls, sliced, repeats, seed
):
    """Any columns, nulls or not, sliced tables (offsets), rows repeated or not, empty tables and no rows."""
    g = np.random.default_rng(seed)
    names = sorted(names)
    tables = []
    for n in sizes:
        table = _table(g, n + 5 * sliced, names, nulls)
        tables.append(table.slice(3, n).combine_chunks() if sliced else table)
    total = sum(sizes)
    count = int(g.integers(0, 2 * total + 1)) if total else 0
    rows = g.integers(0, total, count) if repeats and total else g.permutation(total)[:count]
    got = gathering.gather(tuple(tables), rows.astype(np.int64))
    want = pa.concat_tables(tables).take(rows.astype(np.int64))
    assert got.schema == want.schema and got.schema.metadata == want.schema.metadata
    # dictionaries: the same values, each table's own dictionary
    assert got.to_pylist() == want.to_pylist()


def test_long_values_of_two_piles_are_copied_into_place_and_their_views_die_with_the_piles():
    g = np.random.default_rng(5)
    piles = tuple(_table(g, 1000, ["blob", "i64", "text"], nulls=False) for _ in range(2))
    rows = g.permutation(2000)[:1500]
    got = gathering.gather(piles, rows)
    assert got.equals(pa.concat_tables(piles).take(rows))
    assert got.column("blob").chunk(0).buffers()[2].size == sum(
        len(v) for v in got.column("blob").to_pylist()
    )
    assert {id(p) for p in piles} <= set(gathering._ITEMS)
    del piles
    gc.collect()
    assert not gathering._ITEMS


@pytest.mark.parametrize("nulls", [False, True])
def test_a_gather_of_one_table_is_its_take(nulls):
    table = _table(np.random.default_rng(1), 50, sorted(_TYPES), nulls)
    rows = np.random.default_rng(2).permutation(50)
    assert gathering.gather((table,), rows).equals(table.take(rows))


def _user_parquet(directory, seed, records=300, files=3):
    """A user's Parquet input of every column kind the gather treats apart, some values null."""
    g = np.random.default_rng(seed)
    os.makedirs(directory)
    start = 0
    for f in range(files):
        n = records // files
        table = _table(g, n, ["i8", "f32", "flag", "short", "blob", "vector"], nulls=False)
        table = table.append_column("id", pa.array(np.arange(start, start + n) + seed * 10**6))
        table = table.append_column(
            "maybe", pa.array([None if k % 7 == 0 else f"v{k}" for k in range(start, start + n)])
        )
        pq.write_table(table, os.path.join(directory, f"part-{f}.parquet"), row_group_size=37)
        start += n


def _written(prefix):
    return [row for path in shards(prefix) for row in pq.read_table(path).to_pylist()]


@pytest.fixture(scope="module")
def user_outputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("gather")
    outputs = []
    for seed in (1, 2):
        _user_parquet(str(root / f"in{seed}"), seed)
        run_shuffle(
            str(root / f"in{seed}" / "*.parquet"),
            str(root / f"out{seed}"),
            "--num_piles=5",
            f"--seed={seed}",
        )
        outputs.append(str(root / f"out{seed}"))
    return outputs


@pytest.mark.parametrize("mix", [1, 2, 9])
def test_a_real_output_read_over_several_piles_is_each_record_where_the_epoch_order_says(
    user_outputs, mix
):
    """A shard output of a user's Parquet (nulls, lists, bools, short and long values) read with
    a step over ``mix`` piles: the rows of every batch are the shards' rows in the epoch order."""
    prefix = user_outputs[0]
    written = _written(prefix)
    sizes = [s["records"] for s in manifest(prefix)["shards"]]
    starts = np.concatenate(([0], np.cumsum(sizes)))
    pile, index = epoch_order(sizes, seed=9, epoch=3, mix=mix)
    want = [written[i] for i in (starts[pile] + index).tolist()]
    got = [
        row
        for batch in ShuffledDataset(prefix, seed=9, mix=mix, epoch=3).batches(7)
        for row in batch.to_pylist()
    ]
    assert got == want
    assert {r["id"] for r in got} == set(range(1_000_000, 1_000_300))


def test_a_mixture_of_real_outputs_puts_each_sources_next_row_where_its_pattern_says(user_outputs):
    alone = [
        [row for row in ShuffledDataset(prefix, seed=s, mix=2)]
        for s, prefix in enumerate(user_outputs)
    ]
    mixture = Mixture(
        [ShuffledDataset(prefix, seed=s, mix=2) for s, prefix in enumerate(user_outputs)],
        [1, 2],
        seed=4,
    )
    rows = [row for batch in mixture.batches(50) for row in batch.to_pylist()]
    sources = mixture.sources_at(0, len(rows)).tolist()
    assert [r for r, s in zip(rows, sources) if s == 0] == alone[0][: sources.count(0)]
    assert [r for r, s in zip(rows, sources) if s == 1] == alone[1][: sources.count(1)]
    assert sum(r["maybe"] is None for r in rows) > 0 and any(r["vector"] for r in rows)


def _mixture_of(outputs, **options):
    return Mixture(
        [ShuffledDataset(prefix, seed=s, mix=2) for s, prefix in enumerate(outputs)],
        [1, 2],
        seed=4,
        stop="restart",
        records_per_epoch=500,
        **options,
    )


def _digests(rows):
    return [hashlib.sha256(repr(sorted(row.items())).encode()).hexdigest() for row in rows]


def test_a_parquet_mixture_resumes_exactly_in_a_fresh_process_then_reads_its_next_epoch(
    user_outputs,
):
    """The state taken between gathered batches: a fresh process reads exactly the rest, rows
    whole (nulls, lists, bytes), then the uninterrupted next epoch."""
    mix = _mixture_of(user_outputs)
    batches = mix.batches(32)
    head = [row for _ in range(7) for row in next(batches).to_pylist()]
    state = mix.state_dict()
    rest = [row for batch in batches for row in batch.to_pylist()]
    following = [row for batch in mix.batches(32) for row in batch.to_pylist()]
    script = (
        "import hashlib, json, sys\n"
        "from pileshuffle.loader import Mixture, ShuffledDataset\n"
        f"m = Mixture([ShuffledDataset(p, seed=s, mix=2) for s, p in enumerate({list(user_outputs)!r})], [1, 2], "
        "seed=4, stop='restart', records_per_epoch=500)\n"
        "m.load_state_dict(json.loads(sys.stdin.read()))\n"
        "rows = [r for b in m.batches(32) for r in b.to_pylist()] + [r for b in m.batches(32) for r in b.to_pylist()]\n"
        "print(json.dumps([hashlib.sha256(repr(sorted(r.items())).encode()).hexdigest() for r in rows]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        input=json.dumps(state),
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(done.stdout) == _digests(rest + following)
    assert len(head) + len(rest) == 500 and len(following) == 500


def test_a_parquet_mixture_resumes_from_two_ranks_onto_three_losing_and_repeating_nothing(
    user_outputs,
):
    whole = collections.Counter(
        _digests(
            row for batch in _mixture_of(user_outputs).batches(50) for row in batch.to_pylist()
        )
    )
    two = [_mixture_of(user_outputs, rank=r, world_size=2) for r in range(2)]
    streams = [m.batches(10) for m in two]
    taken = [
        row
        for n, stream in zip((3, 11), streams)
        for _ in range(n)
        for row in next(stream).to_pylist()
    ]
    states = json.loads(json.dumps([m.state_dict() for m in two]))
    three = [_mixture_of(user_outputs, rank=r, world_size=3) for r in range(3)]
    for m in three:
        m.load_state_dict(states)
    rest = [row for m in three for batch in m.batches(10) for row in batch.to_pylist()]
    delivered = collections.Counter(_digests(taken + rest))
    # the splits' remainder="drop"
    assert delivered <= whole and sum((whole - delivered).values()) <= 1 + 2
