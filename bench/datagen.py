"""Fast (numpy-vectorized) generators for the benchmark data sets, cached under bench/.data/.

Records carry their input index like ``pileshuffle.sample`` does, so the same helpers
(``sample.index_of``) read it back:
- TFRecord: payload = 12 ASCII digits of the index, ``|``, random lowercase filler;
- JSONL: ``{"index": i, "label": l, "text": "<filler>"}`` lines of ~500 bytes (varying);
- Parquet: ``index`` int64, ``label`` int32, ``weight`` float64, ``name`` string,
  ``payload`` binary (index digits + filler); snappy (pyarrow's default), one row group per
  file as ``pq.write_table`` writes it.
A data set directory is complete only when its ``dataset.json`` exists (written last).
"""

import glob
import json
import os
import shutil
import struct
import time

import google_crc32c
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

INDEX_DIGITS = 12
BLOCK_RECORDS = 50_000
_MASK_DELTA = 0xA282EAD8
_U32 = 0xFFFFFFFF
VERSION = 1


def masked_crc(data) -> int:
    crc = google_crc32c.value(data)
    return ((((crc >> 15) | (crc << 17)) & _U32) + _MASK_DELTA) & _U32


def mask_array(crcs: np.ndarray) -> np.ndarray:
    c = crcs.astype(np.uint64)
    return ((((c >> np.uint64(15)) | (c << np.uint64(17))) & np.uint64(_U32)) + np.uint64(_MASK_DELTA)) & np.uint64(_U32)


def split_counts(records: int, files: int):
    base, extra = divmod(records, files)
    return [base + (1 if i < extra else 0) for i in range(files)]


def index_digits(index: np.ndarray) -> np.ndarray:
    """(n, 12) uint8 ASCII digits of each index, zero-padded."""
    out = np.empty((len(index), INDEX_DIGITS), dtype=np.uint8)
    value = index.astype(np.int64)
    for k in range(INDEX_DIGITS - 1, -1, -1):
        out[:, k] = (value % 10 + 48).astype(np.uint8)
        value //= 10
    return out


def payload_block(rng, start: int, count: int, payload_bytes: int) -> np.ndarray:
    """(count, payload_bytes) uint8: index digits, '|', lowercase filler."""
    block = np.empty((count, payload_bytes), dtype=np.uint8)
    block[:, :INDEX_DIGITS] = index_digits(np.arange(start, start + count))
    block[:, INDEX_DIGITS] = ord("|")
    block[:, INDEX_DIGITS + 1 :] = rng.integers(97, 123, size=(count, payload_bytes - INDEX_DIGITS - 1), dtype=np.uint8)
    return block


def _write_blocks(directory, records, files, extension, render):
    """Records 0..records-1 over ``files`` files, written BLOCK_RECORDS at a time;
    ``render(start, count)`` returns the bytes (or buffer) of one block."""
    start = 0
    for f, count in enumerate(split_counts(records, files)):
        with open(os.path.join(directory, f"part-{f:05d}.{extension}"), "wb") as handle:
            for block_start in range(start, start + count, BLOCK_RECORDS):
                handle.write(render(block_start, min(BLOCK_RECORDS, start + count - block_start)))
        start += count


def write_tfrecord(directory, records, files, record_bytes=1000, seed=0):
    header = struct.pack("<Q", record_bytes)
    header_crc = np.frombuffer(struct.pack("<I", masked_crc(header)), np.uint8)

    def render(block_start, n):
        rng = np.random.default_rng([seed, block_start])
        frames = np.empty((n, 16 + record_bytes), dtype=np.uint8)
        frames[:, 0:8] = np.frombuffer(header, np.uint8)
        frames[:, 8:12] = header_crc
        frames[:, 12 : 12 + record_bytes] = payload_block(rng, block_start, n, record_bytes)
        value = google_crc32c.value
        crcs = np.fromiter((value(row) for row in frames[:, 12 : 12 + record_bytes]), np.uint64, n)
        frames[:, 12 + record_bytes :] = mask_array(crcs).astype("<u4").view(np.uint8).reshape(n, 4)
        return frames.data

    _write_blocks(directory, records, files, "tfrecord", render)


def write_parquet(directory, records, files, record_bytes=1000, seed=0):
    payload_bytes = max(INDEX_DIGITS + 1, record_bytes - 40)
    start = 0
    for f, count in enumerate(split_counts(records, files)):
        rng = np.random.default_rng([seed, 1, start])
        index = np.arange(start, start + count, dtype=np.int64)
        payload = payload_block(rng, start, count, payload_bytes)
        offsets = np.arange(count + 1, dtype=np.int64) * payload_bytes
        table = pa.table(
            {
                "index": index,
                "label": pa.array(rng.integers(0, 10, count, dtype=np.int32)),
                "weight": pa.array(rng.random(count)),
                "name": pc.binary_join_element_wise("item-", pc.cast(pa.array(index), pa.string()), ""),
                "payload": pa.Array.from_buffers(pa.large_binary(), count, [None, pa.py_buffer(offsets), pa.py_buffer(payload)])
                .cast(pa.binary()),
            }
        ).replace_schema_metadata({"source": "bench.datagen", "seed": str(seed)})
        pq.write_table(table, os.path.join(directory, f"part-{f:05d}.parquet"))
        start += count


def write_jsonl(directory, records, files, record_bytes=500, seed=0):
    """Lines of about ``record_bytes`` (filler length varies by +-57 bytes)."""
    overhead = 43  # {"index": N, "label": L, "text": "..."}\n around the filler, for ~6-digit N
    low, high = max(1, record_bytes - overhead - 57), max(2, record_bytes - overhead + 58)

    def render(block_start, n):
        rng = np.random.default_rng([seed, 2, block_start])
        lengths = rng.integers(low, high, n)
        labels = rng.integers(0, 10, n).tolist()
        ends = np.cumsum(lengths).tolist()
        pool = rng.integers(97, 123, size=int(ends[-1]), dtype=np.uint8).tobytes()
        starts = [0] + ends[:-1]
        return b"".join(
            b'{"index": %d, "label": %d, "text": "%s"}\n' % (block_start + i, labels[i], pool[starts[i] : ends[i]])
            for i in range(n)
        )

    _write_blocks(directory, records, files, "jsonl", render)


WRITERS = {"tfrecord": write_tfrecord, "parquet": write_parquet, "jsonl": write_jsonl}
SUFFIX = {"tfrecord": "tfrecord", "parquet": "parquet", "jsonl": "jsonl"}


def dataset(root, fmt, records, files, record_bytes, seed=0, log=print):
    """The directory of a cached data set (generated if missing); returns its description."""
    name = f"{fmt}-{records}x{record_bytes}-{files}f-s{seed}"
    directory = os.path.join(root, name)
    stamp = os.path.join(directory, "dataset.json")
    params = {"version": VERSION, "format": fmt, "records": records, "files": files, "record_bytes": record_bytes, "seed": seed}
    if os.path.exists(stamp):
        with open(stamp) as handle:
            info = json.load(handle)
        if info.get("params") == params:
            return info
    shutil.rmtree(directory, ignore_errors=True)
    os.makedirs(directory)
    log(f"generating {name} ...")
    started = time.perf_counter()
    WRITERS[fmt](directory, records, files, record_bytes, seed)
    paths = sorted(glob.glob(os.path.join(directory, f"*.{SUFFIX[fmt]}")))
    info = {
        "name": name,
        "params": params,
        "format": fmt,
        "records": records,
        "directory": directory,
        "pattern": os.path.join(directory, f"*.{SUFFIX[fmt]}"),
        "files": paths,
        "bytes": sum(os.path.getsize(p) for p in paths),
    }
    with open(stamp + ".tmp", "w") as handle:
        json.dump(info, handle, indent=1)
    os.rename(stamp + ".tmp", stamp)
    log(f"generated {name}: {info['bytes'] / 1e6:,.0f} MB in {time.perf_counter() - started:.1f} s")
    return info
