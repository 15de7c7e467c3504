"""The floor: a plain single-process 2-pass pile shuffle, no Beam.

    python bench/floor.py --format tfrecord --input 'dir/*.tfrecord' --output out/train --num_piles 8 --seed 1

Pass 1 reads every input in order (TFRecord: both CRCs of every record verified, as
pileshuffle does; JSONL: split at newlines; Parquet: pyarrow record batches), draws a
random pile per record with numpy, and appends each pile's records to one local pile
file (bytes formats: the records' bytes plus a sidecar of their sizes; Parquet: an Arrow
IPC stream). Pass 2 reads one pile at a time, permutes it in RAM with numpy and writes it
as shard ``{output}-NNNNN-of-MMMMM.<suffix>`` (TFRecord frames are copied verbatim, so
the output is valid TFRecord; Parquet shards are snappy-compressed like pileshuffle's).
Records are moved with Arrow ``take`` (one C-level gather per chunk), never per record in
Python; the only per-record Python is the TFRecord frame walk, which must be sequential.

Prints one JSON line: records, input bytes, seconds per pass.
"""

import argparse
import glob
import json
import os
import shutil
import struct
import sys
import time

import google_crc32c
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

CHUNK_BYTES = 32 << 20
_MASK_DELTA = 0xA282EAD8
_U32 = 0xFFFFFFFF
SUFFIX = {"tfrecord": ".tfrecord", "jsonl": ".jsonl", "parquet": ".parquet"}


class CorruptInput(Exception):
    pass


def unmask(masked: np.ndarray) -> np.ndarray:
    rot = (masked.astype(np.uint64) - np.uint64(_MASK_DELTA)) & np.uint64(_U32)
    return ((rot >> np.uint64(17)) | (rot << np.uint64(15))) & np.uint64(_U32)


def _crc32c_table() -> np.ndarray:
    table = np.zeros(256, dtype=np.uint32)
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table[i] = c
    return table


_CRC_TABLE = _crc32c_table()


def crc32c_of_8(raw: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """CRC32C of the 8 bytes at each of ``starts`` (the length fields), vectorized."""
    c = np.full(len(starts), 0xFFFFFFFF, dtype=np.uint32)
    for k in range(8):
        c = _CRC_TABLE[(c ^ raw[starts + k]) & 0xFF] ^ (c >> np.uint32(8))
    return c ^ np.uint32(0xFFFFFFFF)


def tfrecord_frames(buf: bytes, path: str, offset: int):
    """Bounds of the complete frames at the start of ``buf``, both CRCs verified: the
    walk (sequential by nature) computes each payload's CRC32C with google_crc32c; the
    length fields' CRCs are checked afterwards with numpy."""
    crc, unpack_from = google_crc32c.value, struct.unpack_from
    size, pos = len(buf), 0
    starts, data_crcs = [], []
    add_start, add_crc = starts.append, data_crcs.append
    while pos + 12 <= size:
        end = pos + 16 + unpack_from("<Q", buf, pos)[0]
        if end > size:
            break
        add_crc(crc(buf[pos + 12 : end - 4]))
        add_start(pos)
        pos = end
    bounds = np.array(starts + [pos], dtype=np.int64)
    if starts:
        raw = np.frombuffer(buf, dtype=np.uint8)
        first = bounds[:-1]
        stored_length_crc = raw[first[:, None] + np.arange(8, 12)].copy().view("<u4").ravel()
        stored_data_crc = raw[bounds[1:, None] + np.arange(-4, 0)].copy().view("<u4").ravel()
        checks = (
            (stored_length_crc, crc32c_of_8(raw, first), "length"),
            (stored_data_crc, np.array(data_crcs, dtype=np.uint64), "data"),
        )
        for stored, computed, what in checks:
            bad = np.flatnonzero(unmask(stored) != computed)
            if len(bad):
                raise CorruptInput(
                    f"{path}: record at byte {offset + int(bounds[bad[0]])} fails its {what} CRC"
                )
    return bounds


def line_bounds(buf) -> np.ndarray:
    newlines = np.flatnonzero(np.frombuffer(buf, dtype=np.uint8) == 10)
    return np.concatenate(([0], newlines + 1)).astype(np.int64)


def binary_array(buf, bounds: np.ndarray) -> pa.Array:
    """Zero-copy binary array over ``buf`` split at ``bounds`` (bounds[0] may be > 0)."""
    return pa.Array.from_buffers(
        pa.binary(),
        len(bounds) - 1,
        [None, pa.py_buffer(bounds.astype(np.int32)), pa.py_buffer(buf)],
    )


def array_bytes(array: pa.Array):
    """(data buffer, sizes) of a binary array (take() output: offset 0, contiguous)."""
    offsets = np.frombuffer(array.buffers()[1], dtype=np.int32)[
        array.offset : array.offset + len(array) + 1
    ]
    data = array.buffers()[2]
    return data.slice(int(offsets[0]), int(offsets[-1] - offsets[0])), np.diff(offsets).astype(
        np.uint32
    )


class BlockReader:
    """Reads a file in blocks into ONE reused buffer: the unconsumed tail of a block is
    moved to the front and the next read appends to it. Reusing the buffer matters on
    this VM, where first-touching fresh memory (a new 32 MiB ``bytes`` per read) costs
    more than the copy itself."""

    def __init__(self, size=CHUNK_BYTES):
        self.buf = np.empty(size, dtype=np.uint8)

    def blocks(self, path, splitter):
        """Yield ``(view, bounds)`` per block: ``view`` is valid until the next block."""
        with open(path, "rb", buffering=0) as handle:
            filled, offset = 0, 0  # bytes held in buf; file offset of buf[0]
            while True:
                if filled == len(self.buf):  # a record longer than the buffer: grow it
                    self.buf = np.concatenate([self.buf, np.empty(len(self.buf), dtype=np.uint8)])
                got = handle.readinto(memoryview(self.buf)[filled:])
                filled += got
                view = self.buf[:filled]
                bounds = splitter(view, path, offset)
                end = int(bounds[-1])
                if got == 0:
                    if end != filled:
                        yield None, (view, end, offset)  # a partial record at the end of the file
                    return
                if len(bounds) > 1:
                    yield view, bounds
                self.buf[: filled - end] = self.buf[end:filled]
                filled, offset = filled - end, offset + end


def tfrecord_chunks(path, reader):
    """Binary arrays of whole frames (both CRCs verified), ~CHUNK_BYTES at a time."""
    for view, bounds in reader.blocks(path, tfrecord_frames):
        if view is None:
            raise CorruptInput(f"{path}: truncated record at byte {bounds[2] + bounds[1]}")
        yield binary_array(view, bounds)


def jsonl_chunks(path, reader):
    """Binary arrays of whole lines (with their newline); a last line without one gets one."""
    for view, bounds in reader.blocks(path, lambda view, path, offset: line_bounds(view)):
        if view is None:
            view, end, _ = bounds
            tail = view[end:].tobytes() + b"\n"
            yield binary_array(tail, np.array([0, len(tail)], dtype=np.int64))
        else:
            yield binary_array(view, bounds)


def split_by_pile(rng, table_or_array, num_piles):
    """(taken, bounds): records grouped by a random pile (stable within a pile)."""
    n = len(table_or_array)
    piles = rng.integers(0, num_piles, n)
    order = np.argsort(piles, kind="stable")
    bounds = np.searchsorted(piles[order], np.arange(num_piles + 1))
    return table_or_array.take(order), bounds


def shuffle_bytes(paths, fmt, output, num_piles, seed, work):
    rng = np.random.default_rng(seed)
    data_files = [open(os.path.join(work, f"pile-{p:05d}.dat"), "wb") for p in range(num_piles)]
    size_files = [open(os.path.join(work, f"pile-{p:05d}.len"), "wb") for p in range(num_piles)]
    records = 0
    reader = BlockReader()
    chunks = tfrecord_chunks if fmt == "tfrecord" else jsonl_chunks
    t0 = time.perf_counter()
    for path in paths:
        for array in chunks(path, reader):
            records += len(array)
            taken, bounds = split_by_pile(rng, array, num_piles)
            for p in np.flatnonzero(np.diff(bounds)).tolist():
                data, sizes = array_bytes(
                    taken.slice(int(bounds[p]), int(bounds[p + 1] - bounds[p]))
                )
                data_files[p].write(data)
                size_files[p].write(sizes.data)
    for handle in data_files + size_files:
        handle.close()
    t1 = time.perf_counter()
    largest = max(
        os.path.getsize(os.path.join(work, f"pile-{p:05d}.dat")) for p in range(num_piles)
    )
    pile_buffer = np.empty(max(1, largest), dtype=np.uint8)  # one buffer for every pile
    for p in range(num_piles):
        with open(os.path.join(work, f"pile-{p:05d}.dat"), "rb", buffering=0) as handle:
            size = handle.readinto(memoryview(pile_buffer))
        sizes = np.fromfile(os.path.join(work, f"pile-{p:05d}.len"), dtype=np.uint32)
        bounds = np.zeros(len(sizes) + 1, dtype=np.int64)
        np.cumsum(sizes, out=bounds[1:])
        assert bounds[-1] == size
        shuffled = binary_array(pile_buffer[:size], bounds).take(rng.permutation(len(sizes)))
        with open(shard_path(output, p, num_piles, fmt), "wb") as handle:
            handle.write(array_bytes(shuffled)[0])
        os.remove(os.path.join(work, f"pile-{p:05d}.dat"))
        os.remove(os.path.join(work, f"pile-{p:05d}.len"))
    return records, t1 - t0, time.perf_counter() - t1


def shuffle_parquet(paths, output, num_piles, seed, work):
    rng = np.random.default_rng(seed)
    schema = pq.ParquetFile(paths[0]).schema_arrow
    sinks = [pa.OSFile(os.path.join(work, f"pile-{p:05d}.arrows"), "wb") for p in range(num_piles)]
    writers = [pa.ipc.new_stream(sink, schema) for sink in sinks]
    records = 0
    t0 = time.perf_counter()
    for path in paths:
        parquet = pq.ParquetFile(path)
        meta = parquet.metadata
        row_bytes = sum(
            meta.row_group(i).total_byte_size for i in range(meta.num_row_groups)
        ) / max(1, meta.num_rows)
        for batch in parquet.iter_batches(
            batch_size=max(1, int(CHUNK_BYTES / max(1.0, row_bytes))), use_threads=False
        ):
            records += batch.num_rows
            taken, bounds = split_by_pile(rng, batch, num_piles)
            for p in np.flatnonzero(np.diff(bounds)).tolist():
                writers[p].write_batch(taken.slice(int(bounds[p]), int(bounds[p + 1] - bounds[p])))
    for writer, sink in zip(writers, sinks):
        writer.close()
        sink.close()
    t1 = time.perf_counter()
    for p in range(num_piles):
        pile_path = os.path.join(work, f"pile-{p:05d}.arrows")
        with pa.memory_map(pile_path) as source:
            table = pa.ipc.open_stream(source).read_all()
        shuffled = table.take(rng.permutation(table.num_rows))
        pq.write_table(
            shuffled,
            shard_path(output, p, num_piles, "parquet"),
            compression="snappy",
            row_group_size=max(
                1, int((64 << 20) / max(1.0, shuffled.nbytes / max(1, shuffled.num_rows)))
            ),
        )
        del table, shuffled
        os.remove(pile_path)
    return records, t1 - t0, time.perf_counter() - t1


def shard_path(output, index, num_piles, fmt):
    return f"{output}-{index:05d}-of-{num_piles:05d}{SUFFIX[fmt]}"


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--format", choices=sorted(SUFFIX), required=True)
    parser.add_argument("--input", required=True, help="glob of input files (read in sorted order)")
    parser.add_argument("--output", required=True, help="output prefix")
    parser.add_argument("--num_piles", type=int, required=True)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    paths = sorted(glob.glob(args.input))
    if not paths:
        sys.exit(f"floor: {args.input} matches no file")
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    work = os.path.abspath(args.output) + ".floor-work"
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    try:
        if args.format == "parquet":
            records, pass1, pass2 = shuffle_parquet(
                paths, args.output, args.num_piles, args.seed, work
            )
        else:
            records, pass1, pass2 = shuffle_bytes(
                paths, args.format, args.output, args.num_piles, args.seed, work
            )
    except CorruptInput as error:
        sys.exit(f"floor: {error}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(
        json.dumps(
            {
                "records": records,
                "input_bytes": sum(os.path.getsize(p) for p in paths),
                "num_piles": args.num_piles,
                "pass1_seconds": round(pass1, 3),
                "pass2_seconds": round(pass2, 3),
                "seconds": round(time.perf_counter() - started, 3),
            }
        )
    )


if __name__ == "__main__":
    main()
