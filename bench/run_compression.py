"""Should pass-1 runs be compressed? Arrow IPC's lz4 and zstd against none, on a run's segments.

    .venv/bin/python bench/run_compression.py            # 64 MB of each kind of record, medians of 5
    .venv/bin/python bench/run_compression.py --rounds 9

Three kinds of records, each one 64 MB record batch written as a run's segment is (one IPC stream):
- the bench's Parquet rows (index, label, weight, name, ~1 KB payload of random lowercase letters);
- the bench's JSONL lines (random lowercase letters: entropy-coded to ~0.6, no repeats for lz4);
- JSONL of real-looking sentences: words of a 50,000-word vocabulary drawn by Zipf's law (s = 1.1),
  as text corpora are (lz4 and zstd shrink English prose about as much).
Per codec: size against none, encode and decode MB/s on one core. Compressing pays when the disk is
the bottleneck and a core is idle; the rule in docs/performance.md ("Compressed runs?") comes from
these figures against the pipeline's own MB/s per core and the disk's write rate.
"""

import argparse
import glob
import json
import os
import statistics
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, ".data")
BATCH_BYTES = 64 << 20


def zipf_sentences(n: int, words_per_line: int = 80, seed: int = 0) -> list:
    """``n`` JSONL lines of Zipf-distributed pseudo-words (about 500 bytes each)."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(2, 11, 50_000)
    letters = rng.integers(97, 123, int(sizes.sum()), dtype=np.uint8).tobytes().decode()
    bounds = np.concatenate([[0], np.cumsum(sizes)]).tolist()
    vocabulary = [letters[a:b] for a, b in zip(bounds[:-1], bounds[1:])]
    weights = 1 / np.arange(1, 50_001) ** 1.1
    drawn = rng.choice(50_000, size=n * words_per_line, p=weights / weights.sum()).reshape(
        n, words_per_line
    )
    return [
        json.dumps(
            {
                "index": i,
                "label": i % 10,
                "text": " ".join(vocabulary[w] for w in row).capitalize() + ".",
            }
        ).encode()
        for i, row in enumerate(drawn.tolist())
    ]


def batches() -> dict:
    parquet = sorted(glob.glob(os.path.join(DATA, "parquet-1000000x1000-8f-s0", "*.parquet")))
    jsonl = sorted(glob.glob(os.path.join(DATA, "jsonl-2000000x500-8f-s0", "*.jsonl")))
    if not parquet or not jsonl:
        raise SystemExit(
            "make bench's 1 GB Parquet and JSONL sets are missing: run `make bench` (or bench/run.py) first"
        )
    table = pq.read_table(parquet[0])
    rows = int(BATCH_BYTES / (table.nbytes / table.num_rows))
    with open(jsonl[0], "rb") as handle:
        lines = handle.read(BATCH_BYTES).split(b"\n")[:-1]
    sentences = zipf_sentences(BATCH_BYTES // 520)
    return {
        "Parquet rows (bench)": table.slice(0, rows).combine_chunks().to_batches()[0],
        "JSONL, random letters (bench)": pa.record_batch(
            [pa.array(lines, pa.binary())], names=["line"]
        ),
        "JSONL, Zipf sentences": pa.record_batch(
            [pa.array(sentences, pa.binary())], names=["line"]
        ),
    }


def encode(batch, codec):
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(
        sink, batch.schema, options=pa.ipc.IpcWriteOptions(compression=codec)
    ) as writer:
        writer.write_batch(batch)
    return sink.getvalue()


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    print("| records | codec | size | encode | decode |\n|---|---|---|---|---|")
    for name, batch in batches().items():
        for codec in (None, "lz4", "zstd"):
            encodes, decodes = [], []
            for _ in range(args.rounds):
                began = time.perf_counter()
                encoded = encode(batch, codec)
                encodes.append(time.perf_counter() - began)
                began = time.perf_counter()
                decoded = pa.ipc.open_stream(encoded).read_next_batch()
                decodes.append(time.perf_counter() - began)
            assert decoded.equals(batch)
            megabytes = batch.nbytes / 1e6
            print(
                f"| {name} | {codec or 'none'} | {encoded.size / batch.nbytes:.2f}x | "
                f"{megabytes / statistics.median(encodes):,.0f} MB/s | {megabytes / statistics.median(decodes):,.0f} MB/s |"
            )


if __name__ == "__main__":
    main()
