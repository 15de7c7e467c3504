"""Cheap, untimed checks of a row's output: record count, and an order probe.

Order probe: the input index carried by the first ``PROBE_RECORDS`` output records (in
shard order); reported as the share of adjacent pairs whose index ascends. A uniform
shuffle gives about 50%; 100% means the output kept the input order. A WebDataset sample's index
is its key (bench/datagen.py's tar sets); a tar-as-tfrecord payload's is in the ``{"index": i}``
that ends it.
"""

import glob
import json
import re
import struct

import numpy as np
import pyarrow.parquet as pq

PROBE_RECORDS = 10_000
INDEX_DIGITS = 12


def output_files(prefix_glob):
    return sorted(p for p in glob.glob(prefix_glob) if not p.endswith(".json"))


def tfrecord_payloads(path, limit=None):
    """Payloads of a TFRecord file (lengths only, no CRC check: the count is what matters)."""
    out = []
    with open(path, "rb") as handle:
        data = handle.read()
    pos, size, unpack_from = 0, len(data), struct.unpack_from
    while pos + 12 <= size and (limit is None or len(out) < limit):
        (length,) = unpack_from("<Q", data, pos)
        out.append(data[pos + 12 : pos + 12 + length])
        pos += 16 + length
    return out


def count_tfrecord(path):
    with open(path, "rb") as handle:
        data = handle.read()
    pos, size, count, unpack_from = 0, len(data), 0, struct.unpack_from
    while pos + 12 <= size:
        pos += 16 + unpack_from("<Q", data, pos)[0]
        count += 1
    if pos != size:
        raise ValueError(f"{path}: ends inside a record")
    return count


def count_lines(path):
    count = 0
    with open(path, "rb") as handle:
        while True:
            block = handle.read(64 << 20)
            if not block:
                return count
            count += block.count(b"\n")


def tar_samples(path, limit=None):
    """WebDataset samples of a tar file as dicts (``__key__`` and one entry per member), in order."""
    from pileshuffle.formats import get_format

    tar, out = get_format("tar"), []
    for table in tar.read_chunks(path):
        if limit is not None:
            table = table.slice(0, limit - len(out))
        out += tar.records_of(table.column(0).to_pylist())
        if limit is not None and len(out) >= limit:
            break
    return out


def count_records(fmt, paths):
    if fmt == "tar":
        from pileshuffle.formats import get_format

        return sum(table.num_rows for p in paths for table in get_format("tar").read_chunks(p))
    if fmt == "tfrecord":
        return sum(count_tfrecord(p) for p in paths)
    if fmt == "jsonl":
        return sum(count_lines(p) for p in paths)
    return sum(pq.ParquetFile(p).metadata.num_rows for p in paths)


_JSON_INDEX = re.compile(rb'"index":\s*(\d+)')
_LAST_JSON_INDEX = re.compile(rb'\{"index": (\d+)\}$')


def payload_index(payload):
    """The input index of a TFRecord payload: its first 12 digits, or (tar-as-tfrecord: a sample's
    jpg + cls + json) the ``{"index": i}`` that ends it."""
    head = payload[:INDEX_DIGITS]
    return int(head) if head.isdigit() else int(_LAST_JSON_INDEX.search(payload).group(1))


def probe_indices(fmt, paths, limit=PROBE_RECORDS):
    out = []
    for path in paths:
        if len(out) >= limit:
            break
        need = limit - len(out)
        if fmt == "tfrecord":
            out += [payload_index(p) for p in tfrecord_payloads(path, need)]
        elif fmt == "tar":
            out += [int(sample["__key__"]) for sample in tar_samples(path, need)]
        elif fmt == "jsonl":
            with open(path, "rb") as handle:
                for line in handle:
                    # {"index": N, ... (DuckDB: no space)
                    out.append(int(_JSON_INDEX.search(line).group(1)))
                    if len(out) >= limit:
                        break
        else:
            parquet = pq.ParquetFile(path)
            for batch in parquet.iter_batches(batch_size=need, columns=["index"]):
                out += batch.column(0).to_pylist()[:need]
                break
    return out


def ascending_share(indices):
    if len(indices) < 2:
        return None
    values = np.asarray(indices)
    return float(np.mean(values[1:] > values[:-1]))


def check_output(fmt, paths, expected_records, manifest_path=None):
    """(ok, description, ascending share) of an output."""
    if not paths:
        return False, "no output files", None
    if manifest_path is not None:
        with open(manifest_path) as handle:
            manifest = json.load(handle)
        records = manifest["totals"]["records"]
        source = "manifest"
        # --balance: the input's records were all read; the output holds their copies
        if "balance" in manifest:
            read = manifest["input_fingerprint"]["records"]
            ok = read == expected_records and records == sum(
                manifest["balance"]["records_after"].values()
            )
            text = f"{'ok' if ok else 'FAIL'} {read:,} read, {records:,} with copies ({source})"
            return ok, text, ascending_share(probe_indices(fmt, paths))
    else:
        records = count_records(fmt, paths)
        source = "counted"
    ok = records == expected_records
    text = f"{'ok' if ok else 'FAIL'} {records:,} ({source})" + (
        "" if ok else f" != {expected_records:,}"
    )
    return ok, text, ascending_share(probe_indices(fmt, paths))


# the block table of pileshuffle's `quality` command on >= 2,560 records: 16 x 16, 225 dof
ORDER_BLOCKS = 16


def jsonl_indices(path, block_bytes=64 << 20):
    """The ``"index"`` of every line of a JSONL file, in order, read in blocks cut at line ends."""
    found, tail = [], b""
    with open(path, "rb") as handle:
        while block := handle.read(block_bytes):
            lines, _, tail = (tail + block).rpartition(b"\n")
            found += _JSON_INDEX.findall(lines)
    found += _JSON_INDEX.findall(tail)
    return np.array(found).astype(np.int64) if found else np.zeros(0, np.int64)


def order_indices(fmt, paths):
    """The input index of every output record, in output order (files in name order); None for tar."""
    if fmt == "parquet":
        return np.concatenate(
            [pq.read_table(p, columns=["index"]).column(0).to_numpy() for p in paths]
        )
    if fmt == "jsonl":
        return np.concatenate([jsonl_indices(p) for p in paths])
    if fmt == "tfrecord":
        return np.array(
            [payload_index(r) for p in paths for r in tfrecord_payloads(p)], dtype=np.int64
        )
    return None


def block_chi2(indices, blocks=ORDER_BLOCKS):
    """(chi2, dof) of the input block x output block table of a permutation given as the input
    index of each output position, as pileshuffle's `quality` command computes it (its
    ``metrics.block_table`` and ``independence``); a uniform permutation: chi2/dof ~ 1 +- sqrt(2/dof).
    None when ``indices`` is not a permutation of 0..n-1 (--balance copies)."""
    from pileshuffle.quality.metrics import block_table, independence

    n = len(indices)
    if (
        n < blocks
        or indices.min() < 0
        or indices.max() >= n
        or np.bincount(indices, minlength=n).max() != 1
    ):
        return None
    chi2, dof, _ = independence(block_table(indices, np.arange(n), n, blocks))
    return chi2, dof
