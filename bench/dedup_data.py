"""The data set of bench/dedup.py: Parquet like datagen's in which a given share of the records are
exact copies of other records (one hot record with many of them), in a random order across the
files, generated once and cached under bench/.data/ with a dataset.json that says what is in it
(``distinct_records``, where the copies landed). A record is a function of its id and the seed.
"""

import glob
import json
import os
import shutil
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from datagen import INDEX_DIGITS, index_digits, split_counts
from workspace import DATA, GB, log

# a record's share of the files, as datagen's Parquet (988 MB per 1,000,000 rows)
RECORD_BYTES = 1000
PAYLOAD_BYTES = 960
GROUP_RECORDS = 131_072  # rows per row group (~128 MB): 1 GB in 8 files is one group per file, as datagen writes
FILLER_WORDS = -(-(PAYLOAD_BYTES - INDEX_DIGITS - 1) // 8)  # uint64 hash words per payload's filler
_GOLDEN, _M1, _M2 = (
    np.uint64(0x9E3779B97F4A7C15),
    np.uint64(0xBF58476D1CE4E5B9),
    np.uint64(0x94D049BB133111EB),
)


def mixed(x):
    """splitmix64's finalizer over a uint64 array, in place: every output bit depends on every input bit."""
    for shift, factor in ((30, _M1), (27, _M2)):
        x ^= x >> np.uint64(shift)
        x *= factor
    x ^= x >> np.uint64(31)
    return x


def records_of(ids, seed):
    """The table of the records of these distinct ids, every column a function of (id, seed)."""
    n, key = len(ids), ids.astype(np.uint64)
    salt = np.uint64((seed * 0xD1B54A32D192ED03 + 1) % 2**64)
    h = mixed(key * _GOLDEN + salt)
    words = key[:, None] * np.uint64(FILLER_WORDS) + np.arange(FILLER_WORDS, dtype=np.uint64)
    words *= _GOLDEN
    words ^= salt
    filler = mixed(words).view(np.uint8).reshape(n, FILLER_WORDS * 8)
    payload = np.empty((n, PAYLOAD_BYTES), dtype=np.uint8)
    payload[:, :INDEX_DIGITS] = index_digits(ids)
    payload[:, INDEX_DIGITS] = ord("|")
    tail = payload[:, INDEX_DIGITS + 1 :]
    np.remainder(filler[:, : tail.shape[1]], 26, out=tail)
    tail += 97
    offsets = np.arange(n + 1, dtype=np.int32) * PAYLOAD_BYTES
    return pa.table(
        {
            "index": pa.array(ids.astype(np.int64)),
            "label": pa.array((h % np.uint64(10)).astype(np.int32)),
            "weight": pa.array((h >> np.uint64(11)).astype(np.float64) * 2.0**-53),
            "name": pc.binary_join_element_wise("item-", pc.cast(pa.array(ids), pa.string()), ""),
            "payload": pa.Array.from_buffers(
                pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(payload)]
            ),
        }
    ).replace_schema_metadata({"source": "bench.dedup", "seed": str(seed)})


def layout(records, dup_fraction, hot_fraction, seed):
    """(the distinct id of every input position, distinct count, hot id, hot copies)."""
    rng = np.random.default_rng([seed, 7])
    copies, distinct = round(dup_fraction * records), records - round(dup_fraction * records)
    hot = min(copies, max(1, round(hot_fraction * records))) if copies else 0
    hot_id = int(rng.integers(distinct))
    source = np.concatenate(
        [np.arange(distinct), np.full(hot, hot_id), rng.integers(0, distinct, copies - hot)]
    )
    rng.shuffle(source)
    return source, distinct, hot_id, hot


def placement(source, counts):
    """Where the copies are: a copy is every occurrence of an id after its first (in file order)."""
    file_of = np.repeat(np.arange(len(counts)), counts)
    ids, first, occurrences = np.unique(source, return_index=True, return_counts=True)
    assert len(ids) == ids[-1] + 1, "every id 0..U-1 occurs"
    copy = np.ones(len(source), dtype=bool)
    copy[first] = False
    same = file_of[copy] == file_of[first[source[copy]]]
    return {
        "copies_in_their_originals_file": int(same.sum()),
        "copies_in_other_files": int((~same).sum()),
        "records_with_copies": int((occurrences > 1).sum()),
        "max_occurrences": int(occurrences.max()),
    }


def dataset(size_bytes, dup_fraction, files, seed, hot_fraction):
    """The cached data set (generated if missing): its dataset.json, with ``distinct_records``."""
    records = max(files, round(size_bytes / RECORD_BYTES))
    params = {
        "version": 2,
        "records": records,
        "files": files,
        "record_bytes": RECORD_BYTES,
        "dup_fraction": dup_fraction,
        "hot_fraction": hot_fraction,
        "seed": seed,
    }
    name = f"parquet-dedup-{records}x{RECORD_BYTES}-{files}f-d{dup_fraction:g}-h{hot_fraction:g}-s{seed}"
    directory = os.path.join(DATA, name)
    stamp = os.path.join(directory, "dataset.json")
    if os.path.exists(stamp):
        with open(stamp) as handle:
            if (info := json.load(handle)).get("params") == params:
                return info
    shutil.rmtree(directory, ignore_errors=True)
    os.makedirs(directory)
    if shutil.disk_usage(directory).free < 2 * records * RECORD_BYTES:
        raise SystemExit(
            f"{name}: less than {2 * records * RECORD_BYTES / GB:.1f} GB free under {DATA}"
        )
    log(f"generating {name} ...")
    started = time.perf_counter()
    source, distinct, hot_id, hot = layout(records, dup_fraction, hot_fraction, seed)
    counts, start = split_counts(records, files), 0
    for f, count in enumerate(counts):
        with pq.ParquetWriter(
            os.path.join(directory, f"part-{f:05d}.parquet"), records_of(source[:1], seed).schema
        ) as writer:
            for group in range(start, start + count, GROUP_RECORDS):
                writer.write_table(
                    records_of(source[group : min(group + GROUP_RECORDS, start + count)], seed)
                )
        start += count
    paths = sorted(glob.glob(os.path.join(directory, "*.parquet")))
    info = {
        "name": name,
        "params": params,
        "format": "parquet",
        "records": records,
        "distinct_records": distinct,
        "duplicate_records": records - distinct,
        "hot_record_index": hot_id,
        "hot_record_occurrences": int((source == hot_id).sum()),
        **placement(source, counts),
        "directory": directory,
        "pattern": os.path.join(directory, "*.parquet"),
        "files": paths,
        "bytes": sum(os.path.getsize(p) for p in paths),
    }
    with open(stamp + ".tmp", "w") as handle:
        json.dump(info, handle, indent=1)
    os.rename(stamp + ".tmp", stamp)
    log(
        f"generated {name}: {info['bytes'] / 1e6:,.0f} MB, {distinct:,} distinct of {records:,}, "
        f"in {time.perf_counter() - started:.1f} s"
    )
    return info
