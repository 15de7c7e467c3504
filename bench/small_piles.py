"""Pass 2 at many small piles: what one pile's shard costs beside the bare work of writing it.

1 GB of Parquet in 4,096 piles (the local stand-in for 10 TB in 10,000 piles) gives 4,096 shards
of 240 kB. Two measures, both on the bench's 1 GB Parquet set:

- ``floor``: pyarrow alone writes the rows (already in memory, in order) as N Parquet files in
  2 threads, for N = 16 and 4,096: the cost of many small files that no code of ours can remove.
- ``groups``: ``WriteShard`` on the same piles in groups of G (``PileGroup``: one join, sort and take
  for G piles, the template's way for small piles) against ``WriteShard`` pile by pile,
  interleaved group by group.
- ``per_pile``: pass 2's ``WriteShard`` on each of the 4,096 piles (8 parts each, one per input file,
  as pass 1 gives them), timed pile by pile **interleaved** with a bare read-sort-write of the same
  pile (join the parts, sort on U, take, one Parquet file written and renamed). This machine kind's
  speed drifts by 2x within a minute; a ratio of two codes measured pile by pile does not.

    python bench/small_piles.py                   # both, shards in a temp folder
    python bench/small_piles.py --only per_pile --dir /dev/shm   # no disk: the Python cost alone

Deleting thousands of files just before a run slows the next file creations (ext4 scans past
recently deleted inodes: 0.8 ms an open against 0.07): every run here writes to a new folder and
the folders are removed at the end.
"""

import argparse
import concurrent.futures
import glob
import os
import shutil
import tempfile
import time
import uuid

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from datagen import dataset
from workspace import DATA


def _input():
    """The 1 GB Parquet set's files (generated once, cached in bench/.data)."""
    info = dataset(DATA, "parquet", 1_000_000, 8, 1000)
    return sorted(glob.glob(os.path.join(info["directory"], "*.parquet")))


def floor(folder: str, counts=(16, 4096, 16, 4096)):
    """Seconds pyarrow takes to write the whole input as N files in 2 threads."""
    table = pa.concat_tables([pq.read_table(f) for f in _input()]).combine_chunks()
    for count in counts:
        out = os.path.join(folder, f"floor-{uuid.uuid4().hex[:6]}")
        os.makedirs(out)
        rows = table.num_rows // count
        jobs = [
            (os.path.join(out, f"{i:05d}.parquet"), table.slice(i * rows, rows))
            for i in range(count)
        ]
        start = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda job: pq.write_table(job[1], job[0], compression="snappy"), jobs))
        print(
            f"floor      {count:5d} files: {time.perf_counter() - start:6.2f} s (pyarrow, 2 threads)",
            flush=True,
        )


def _piles(num_piles: int):
    """The input's piles as pass 1 would hand them over: one segment per (input file, pile)."""
    from pileshuffle.engine.fragments import Fragment, segment_encoder
    from pileshuffle.engine.pile import Pile
    from pileshuffle.formats import get_format
    from pileshuffle.names import HASH_COLUMN, KEY_COLUMN
    from pileshuffle.records import keys as keymath
    from pileshuffle.records.fingerprint import Fingerprint

    fmt, rng, parts = (
        get_format("parquet"),
        np.random.default_rng(1),
        [[] for _ in range(num_piles)],
    )
    for n, path in enumerate(_input()):
        table = pq.read_table(path)
        keys = rng.integers(0, 2**63, table.num_rows, dtype=np.uint64) * np.uint64(2)
        hashes, lengths = fmt.record_hashes(table), fmt.record_lengths(table)
        piles = keymath.pile_of(keys, num_piles)
        order = np.argsort(piles, kind="stable")
        table = (
            table.append_column(KEY_COLUMN, pa.array(keys))
            .append_column(HASH_COLUMN, pa.array(hashes))
            .take(order)
        )
        hashes, lengths, bounds = (
            hashes[order],
            lengths[order],
            np.searchsorted(piles[order], np.arange(num_piles + 1)),
        )
        encode = segment_encoder(table.schema)
        for pile in range(num_piles):
            a, b = int(bounds[pile]), int(bounds[pile + 1])
            if b > a:
                batch = table.slice(a, b - a).combine_chunks().to_batches()[0]
                fingerprint = Fingerprint.of(hashes[a:b], int(lengths[a:b].sum()))
                parts[pile].append(
                    Fragment(
                        (n,), b - a, int(lengths[a:b].sum()), fingerprint, payload=encode(batch)
                    )
                )
    return [Pile(p, num_piles, tuple(parts[p])) for p in range(num_piles)]


def _bare(pile, folder: str):
    """The least pass 2 does for a pile: join, sort on U, take, write one file, rename it."""
    from pileshuffle.engine.fragments import read_joined
    from pileshuffle.names import HASH_COLUMN, KEY_COLUMN

    table = read_joined(pile.fragments)
    order = np.argsort(table.column(KEY_COLUMN).to_numpy(), kind="stable")
    records = table.drop_columns([KEY_COLUMN, HASH_COLUMN]).take(order)
    temp = os.path.join(folder, f"{pile.index:05d}.tmp")
    pq.write_table(records, temp, compression="snappy")
    os.replace(temp, os.path.join(folder, f"{pile.index:05d}.parquet"))


def per_pile(folder: str, piles: list):
    """``WriteShard.process`` against ``_bare``, pile by pile, in one process on one thread."""
    from pileshuffle.engine.transforms.shards import WriteShard

    num_piles = len(piles)
    ours, bare = (
        os.path.join(folder, f"ours-{uuid.uuid4().hex[:6]}"),
        os.path.join(folder, f"bare-{uuid.uuid4().hex[:6]}"),
    )
    os.makedirs(bare)
    write = WriteShard("parquet", "snappy", os.path.join(ours, "shard"))
    list(write.process(piles[0], direct=True))  # first-call costs (imports) out of the sums
    _bare(piles[0], bare)
    spent = [0.0, 0.0]
    for pile in piles:
        a = time.perf_counter()
        list(write.process(pile, direct=True))
        b = time.perf_counter()
        _bare(pile, bare)
        spent[0] += b - a
        spent[1] += time.perf_counter() - b
    print(
        f"per_pile   {num_piles} piles: WriteShard {spent[0]:.2f} s ({1000 * spent[0] / num_piles:.2f} ms a pile), "
        f"bare {spent[1]:.2f} s: {spent[0] / spent[1]:.2f}x",
        flush=True,
    )


def groups(folder: str, piles: list):
    """``WriteShard`` on ``PileGroup``s of the template's size against ``WriteShard`` per pile."""
    from pileshuffle.engine.pile_groups import GROUP_BYTES, PileGroup, group_size
    from pileshuffle.engine.transforms.shards import WriteShard

    num_piles = len(piles)
    size = group_size(sum(p.nbytes for p in piles) / num_piles, GROUP_BYTES)
    one = WriteShard(
        "parquet", "snappy", os.path.join(folder, f"one-{uuid.uuid4().hex[:6]}", "shard")
    )
    grouped = WriteShard(
        "parquet", "snappy", os.path.join(folder, f"groups-{uuid.uuid4().hex[:6]}", "shard")
    )
    list(one.process(piles[0], direct=True))
    list(grouped.process(PileGroup(tuple(piles[:1])), direct=True))
    spent = [0.0, 0.0]
    for start in range(0, num_piles, size):
        a = time.perf_counter()
        for pile in piles[start : start + size]:
            list(one.process(pile, direct=True))
        b = time.perf_counter()
        list(grouped.process(PileGroup(tuple(piles[start : start + size])), direct=True))
        spent[0] += b - a
        spent[1] += time.perf_counter() - b
    print(
        f"groups     {num_piles} piles in groups of {size}: {1000 * spent[1] / num_piles:.2f} ms a pile, "
        f"one at a time {1000 * spent[0] / num_piles:.2f} ms: {spent[0] / spent[1]:.2f}x faster",
        flush=True,
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", choices=("floor", "per_pile", "groups"))
    parser.add_argument("--dir", default=None, help="where shards go (default: a temp folder)")
    args = parser.parse_args()
    folder = tempfile.mkdtemp(prefix="pileshuffle-small-piles-", dir=args.dir)
    try:
        if args.only in (None, "floor"):
            floor(folder)
        piles = _piles(4096) if args.only != "floor" else None  # built once for both measures
        if args.only in (None, "per_pile"):
            per_pile(folder, piles)
        if args.only in (None, "groups"):
            groups(folder, piles)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
