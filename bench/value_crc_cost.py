"""What a record fingerprint's per-value CRC32C costs: Python (one call per value, short values all
at once) against the compiled loop (pileshuffle/records/compiled_crc.py), and what compiling costs a process.

    .venv/bin/python bench/value_crc_cost.py            # 16 MB chunks of 1,000-, 100- and 40-byte values
    .venv/bin/python bench/value_crc_cost.py --rounds 9

Per value size: the median of --rounds over one 16 MB chunk (random bytes, lengths +-50%), both ways
interleaved in one process; then, in fresh processes, the first compiled call (numba's import, typing
and compile, which holds the GIL). slice_crcs.py's _COMPILE_AFTER_SECONDS comes from it: a process
compiles once it has spent that long hashing in Python, on every thread the compile stops.
"""

import argparse
import os
import statistics
import subprocess
import sys
import time

import numpy as np

from pileshuffle.records import slice_crcs

CHUNK_BYTES = 16 << 20
FIRST_CALL = """
import time, numpy as np
began = time.perf_counter()
from pileshuffle.records import compiled_crc
compiled_crc.slice_crcs(np.zeros(64, np.uint8), np.array([0, 8]), np.array([8, 50]))
print(time.perf_counter() - began)
"""


def python_way(data, starts, lengths):
    offsets = np.append(starts, starts[-1] + lengths[-1])
    slice_crcs._python_seconds = 0.0  # never compiled: the Python way every call
    return slice_crcs.crc32c_of_slices(data, offsets)


def compiled_way(data, starts, lengths):
    from pileshuffle.records import compiled_crc

    return compiled_crc.slice_crcs(np.frombuffer(data, np.uint8), starts, lengths)


def chunk(value_bytes: int, seed: int = 0):
    lengths = np.random.default_rng(seed).integers(
        value_bytes // 2, value_bytes * 3 // 2 + 1, CHUNK_BYTES // value_bytes
    )
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    return os.urandom(int(lengths.sum())), starts, lengths.astype(np.int64)


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    print("| values | count per 16 MB | Python | compiled | ratio |\n|---|---|---|---|---|")
    for value_bytes in (1000, 100, 40):
        data, starts, lengths = chunk(value_bytes)
        assert (
            python_way(data, starts, lengths).tolist()
            == compiled_way(data, starts, lengths).tolist()
        )
        times = {"python": [], "compiled": []}
        for _ in range(args.rounds):
            for name, way in (("python", python_way), ("compiled", compiled_way)):
                began = time.perf_counter()
                way(data, starts, lengths)
                times[name].append(time.perf_counter() - began)
        py, co = statistics.median(times["python"]), statistics.median(times["compiled"])
        print(
            f"| {value_bytes:,} B | {len(starts):,} | {py * 1e3:.1f} ms | {co * 1e3:.1f} ms | {py / co:.1f}x |"
        )
    firsts = [
        float(
            subprocess.run(
                [sys.executable, "-c", FIRST_CALL], capture_output=True, text=True, check=True
            ).stdout
        )
        for _ in range(3)
    ]
    print(
        f"\nfirst compiled call in a fresh process (numba's import + compile), median of 3: {statistics.median(firsts):.2f} s"
    )


if __name__ == "__main__":
    main()
