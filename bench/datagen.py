"""Fast (numpy-vectorized) generators for the benchmark data sets, cached under bench/.data/.

Records carry their input index like ``pileshuffle.commands.sample`` does, so the same helpers
(``sample.index_of``) read it back:
- TFRecord: payload = 12 ASCII digits of the index, ``|``, random lowercase filler;
- JSONL: ``{"index": i, "label": l, "text": "<filler>"}`` lines of ~500 bytes (varying);
- Parquet: ``index`` int64, ``label`` int32, ``weight`` float64, ``name`` string,
  ``payload`` binary (index digits + filler); snappy (pyarrow's default), one row group per
  file as ``pq.write_table`` writes it;
- labels (JSONL, Parquet) are 0-9 drawn uniformly, or with ``shares`` (e.g. ``(70, 20, 10)``)
  classes 0, 1, ... in exactly those percentages of every block (a file, for Parquet), in a
  random order: an imbalanced set for ``--balance`` (bench/shuffle_rows.py);
- tar (WebDataset): samples ``{key}.jpg`` (random bytes, 2,500-3,500), ``{key}.cls`` (class id
  ``i * 10 // N`` as ASCII: a capture written one class at a time), ``{key}.json``
  (``{"index": i}``), key = 9 index digits; USTAR headers as ``tarfile`` writes them;
- tar-as-tfrecord: the same samples as TFRecords, payload = jpg + cls + json data.
A data set directory is complete only when its ``dataset.json`` exists (written last).
"""

import glob
import json
import os
import shutil
import struct
import tarfile
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
    return (
        (((c >> np.uint64(15)) | (c << np.uint64(17))) & np.uint64(_U32)) + np.uint64(_MASK_DELTA)
    ) & np.uint64(_U32)


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
    block[:, INDEX_DIGITS + 1 :] = rng.integers(
        97, 123, size=(count, payload_bytes - INDEX_DIGITS - 1), dtype=np.uint8
    )
    return block


def class_labels(rng, n: int, shares) -> np.ndarray:
    """``n`` labels: class k in ``shares[k]`` percent of them (largest remainders), randomly ordered."""
    exact = np.asarray(shares, dtype=np.float64) * n / sum(shares)
    counts = np.floor(exact).astype(np.int64)
    counts[np.argsort(counts - exact)[: n - int(counts.sum())]] += 1
    return rng.permutation(np.repeat(np.arange(len(shares)), counts))


def _write_blocks(directory, records, files, extension, render, block=BLOCK_RECORDS, end=None):
    """Records 0..records-1 over ``files`` files, written ``block`` records at a time;
    ``render(start, count)`` returns the bytes (or buffer) of one block, ``end(handle)`` (if
    given) ends each file."""
    start = 0
    for f, count in enumerate(split_counts(records, files)):
        with open(os.path.join(directory, f"part-{f:05d}.{extension}"), "wb") as handle:
            for block_start in range(start, start + count, block):
                handle.write(render(block_start, min(block, start + count - block_start)))
            if end is not None:
                end(handle)
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


def write_parquet(directory, records, files, record_bytes=1000, seed=0, shares=None):
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
                "label": pa.array(
                    rng.integers(0, 10, count, dtype=np.int32)
                    if shares is None
                    else class_labels(rng, count, shares).astype(np.int32)
                ),
                "weight": pa.array(rng.random(count)),
                "name": pc.binary_join_element_wise(
                    "item-", pc.cast(pa.array(index), pa.string()), ""
                ),
                "payload": pa.Array.from_buffers(
                    pa.large_binary(), count, [None, pa.py_buffer(offsets), pa.py_buffer(payload)]
                ).cast(pa.binary()),
            }
        ).replace_schema_metadata({"source": "bench.datagen", "seed": str(seed)})
        pq.write_table(table, os.path.join(directory, f"part-{f:05d}.parquet"))
        start += count


def write_jsonl(directory, records, files, record_bytes=500, seed=0, shares=None):
    """Lines of about ``record_bytes`` (filler length varies by +-57 bytes)."""
    overhead = 43  # {"index": N, "label": L, "text": "..."}\n around the filler, for ~6-digit N
    low, high = max(1, record_bytes - overhead - 57), max(2, record_bytes - overhead + 58)

    def render(block_start, n):
        rng = np.random.default_rng([seed, 2, block_start])
        lengths = rng.integers(low, high, n)
        labels = (
            rng.integers(0, 10, n) if shares is None else class_labels(rng, n, shares)
        ).tolist()
        ends = np.cumsum(lengths).tolist()
        pool = rng.integers(97, 123, size=int(ends[-1]), dtype=np.uint8).tobytes()
        starts = [0] + ends[:-1]
        return b"".join(
            b'{"index": %d, "label": %d, "text": "%s"}\n'
            % (block_start + i, labels[i], pool[starts[i] : ends[i]])
            for i in range(n)
        )

    _write_blocks(directory, records, files, "jsonl", render)


# ~1 GB of tar: a sample is ~5.8 KB of it (3 headers, a ~3,000-byte jpg, cls and json, each padded to 512 B)
TAR_SAMPLES_PER_GB = 172_000
TAR_JPG_BYTES = 3000  # the tar sets' record_bytes: a sample's mean jpg size
# samples per rendered block (~58 MB of tar); both tar sets draw per block: keep equal
TAR_BLOCK_SAMPLES = 10_000
# a sample's jpg has record_bytes +- this many bytes: sizes vary a little, like photos'
JPG_SPREAD = 500
# sample i of N has class i * CLASSES // N: in order, a capture written one class at a time
CLASSES = 10
ZEROS = bytes(tarfile.BLOCKSIZE)


def tar_samples(block_start, n, records, jpg_bytes, seed):
    """Samples block_start..block_start+n-1 of ``records``: [(key, [(extension, data), ...])]."""
    rng = np.random.default_rng([seed, 3, block_start])
    ends = np.cumsum(rng.integers(jpg_bytes - JPG_SPREAD, jpg_bytes + JPG_SPREAD + 1, n)).tolist()
    pool = rng.bytes(ends[-1])
    starts = [0] + ends[:-1]
    return [
        (
            f"{i:09d}",
            [
                ("jpg", pool[starts[k] : ends[k]]),
                ("cls", b"%d" % (i * CLASSES // records)),
                ("json", b'{"index": %d}' % i),
            ],
        )
        for k, i in enumerate(range(block_start, block_start + n))
    ]


def tar_member(name, data):
    """[header, data, padding] of one member: the USTAR header ``tarfile`` writes (mode 0o644, mtime 0)."""
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), 0o644, 0
    return [
        info.tobuf(tarfile.USTAR_FORMAT, "utf-8", "strict"),
        data,
        ZEROS[: -len(data) % tarfile.BLOCKSIZE],
    ]


def end_tar(handle):
    """tarfile's end of archive: two zero blocks, then zeros up to a whole record (10 KiB)."""
    handle.write(ZEROS * 2)
    handle.write(bytes(-handle.tell() % tarfile.RECORDSIZE))


def write_tar(directory, records, files, record_bytes=3000, seed=0):
    """WebDataset shards: ``records`` samples (jpg of about ``record_bytes``, cls, json)."""

    def render(block_start, n):
        return b"".join(
            part
            for key, members in tar_samples(block_start, n, records, record_bytes, seed)
            for ext, data in members
            for part in tar_member(f"{key}.{ext}", data)
        )

    _write_blocks(directory, records, files, "tar", render, TAR_BLOCK_SAMPLES, end_tar)


def tfrecord_frame(payload):
    """One TFRecord: length, its masked CRC, ``payload``, its masked CRC."""
    length = struct.pack("<Q", len(payload))
    return b"".join(
        (
            length,
            struct.pack("<I", masked_crc(length)),
            payload,
            struct.pack("<I", masked_crc(payload)),
        )
    )


def write_tar_as_tfrecord(directory, records, files, record_bytes=3000, seed=0):
    """The tar set's samples as TFRecords: one per sample, payload = its jpg + cls + json data."""

    def render(block_start, n):
        return b"".join(
            tfrecord_frame(b"".join(data for _, data in members))
            for _, members in tar_samples(block_start, n, records, record_bytes, seed)
        )

    _write_blocks(directory, records, files, "tfrecord", render, TAR_BLOCK_SAMPLES)


WRITERS = {
    "tfrecord": write_tfrecord,
    "parquet": write_parquet,
    "jsonl": write_jsonl,
    "tar": write_tar,
    "tar-as-tfrecord": write_tar_as_tfrecord,
}
SUFFIX = {
    "tfrecord": "tfrecord",
    "parquet": "parquet",
    "jsonl": "jsonl",
    "tar": "tar",
    "tar-as-tfrecord": "tfrecord",
}
# the pileshuffle format of a set's files, where not its name
FILE_FORMAT = {"tar-as-tfrecord": "tfrecord"}


def _located(info: dict, directory: str) -> dict:
    """A cached set's description with its paths under ``directory`` (where it is now, from any cwd)."""
    files = [os.path.join(directory, os.path.basename(p)) for p in info["files"]]
    pattern = os.path.join(directory, os.path.basename(info["pattern"]))
    return {**info, "directory": directory, "pattern": pattern, "files": files}


def dataset(root, fmt, records, files, record_bytes, seed=0, log=print, shares=None):
    """The directory of a cached data set (generated if missing); returns its description.
    ``shares``: imbalanced labels (JSONL, Parquet; module docstring)."""
    name = f"{fmt}-{records}x{record_bytes}-{files}f-s{seed}" + (
        "" if shares is None else "-c" + "-".join(map(str, shares))
    )
    # the description holds absolute paths: any cwd reads it
    directory = os.path.abspath(os.path.join(root, name))
    stamp = os.path.join(directory, "dataset.json")
    params = {
        "version": VERSION,
        "format": fmt,
        "records": records,
        "files": files,
        "record_bytes": record_bytes,
        "seed": seed,
        **({} if shares is None else {"shares": list(shares)}),
    }
    if os.path.exists(stamp):
        with open(stamp) as handle:
            info = json.load(handle)
        if info.get("params") == params:
            return _located(info, directory)
    shutil.rmtree(directory, ignore_errors=True)
    os.makedirs(directory)
    log(f"generating {name} ...")
    started = time.perf_counter()
    WRITERS[fmt](
        directory,
        records,
        files,
        record_bytes,
        seed,
        **({} if shares is None else {"shares": shares}),
    )
    paths = sorted(glob.glob(os.path.join(directory, f"*.{SUFFIX[fmt]}")))
    info = {
        "name": name,
        "params": params,
        "format": FILE_FORMAT.get(fmt, fmt),
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
