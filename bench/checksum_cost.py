"""What the loader's integrity check costs an epoch, in one process: epochs with the CRC-32C check
on and off, interleaved, medians (the first epoch of each is a warm-up).

    python bench/checksum_cost.py bench/.data/loader-parquet-1000000x1000-8f-s0-p16/train
    python bench/checksum_cost.py bench/.data/loader-tfrecord-1000000x1000-8f-s0-p16/train --rounds 7

The output is a finished run of bench/loader.py's data (that script makes it). "off" skips only the
comparison of the shard's CRC-32C with its manifest's; a Parquet shard is still read the way the
check reads it (held whole, parsed in place), which is faster than the loader before checksums
read it: against that loader, use fresh-process pairs of bench/loader.py in an older worktree
(docs/performance.md, "Integrity on read"). TFRecord's check is its frames' own, the same on and
off: its ratio is this measure's noise (0.93-1.0 here, 2026-11-28: Parquet gave 0.87x and 0.91x).
"""

import argparse
import statistics
import time

import pileshuffle.loader.piles as piles
from pileshuffle.loader import ShuffledDataset


def epoch_seconds(prefix: str, check: bool, real=piles.check_crc32c) -> float:
    piles.check_crc32c = real if check else (lambda *args, **kwargs: None)
    began = time.perf_counter()
    for _ in ShuffledDataset(prefix, seed=1).batches(256):
        pass
    return time.perf_counter() - began


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("prefix", help="a finished output's prefix")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    epoch_seconds(args.prefix, True), epoch_seconds(args.prefix, False)
    times = {True: [], False: []}
    for _ in range(args.rounds):
        for check in (False, True):
            times[check].append(epoch_seconds(args.prefix, check))
    off, on = statistics.median(times[False]), statistics.median(times[True])
    print(
        f"epoch without the check {off:.3f} s, with it {on:.3f} s (medians of {args.rounds}): {off / on:.2f}x the speed"
    )


if __name__ == "__main__":
    main()
