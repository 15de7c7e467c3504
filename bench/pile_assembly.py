"""Pass 2's assembly of one pile from many parts: the regime of 10-100 TB jobs, where a pile of
about 1 GB is gathered from one segment per pass-1 run (10,000 runs of 100 kB at 10 TB).
Reproduced at the same parts per pile on one pile of 100,000 records of ~1 KB (100 MB): its
parts are segments of one run file, as pass 1 writes them (``pileshuffle.engine.runs``).

    python bench/pile_assembly.py                  # 10, 1,000 and 10,000 parts, 5 rounds
    python bench/pile_assembly.py --parts 1000 --rounds 9

Each row is a fresh process: the pile put in order (``Pile.ordered``: ``read_joined``, then the
sort on U) timed over ``--rounds`` (median), and the reading process's peak RSS above its
start (the pile is 100 MB; the runs are written by another process first). The reference row reads every part with its own stream reader
(``pa.ipc.open_stream`` per part, as pass 2 did before ``read_joined``), in the same process kind.
"""

import argparse
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
WRITE = r"""
import pickle, sys
import numpy as np, pyarrow as pa
from pileshuffle.engine.runs import PileRuns

parts, directory = int(sys.argv[1]), sys.argv[2]
records, rng = 100_000, np.random.default_rng(0)
table = pa.table({"payload": pa.array([rng.bytes(1000) for _ in range(records)], pa.binary())})
keys = rng.integers(0, 2**64 - 1, records, dtype=np.uint64)
fragments = []
for n, rows in enumerate(np.array_split(np.arange(records), parts)):  # one run per part, as 10,000 writers give
    writer = PileRuns(1, 1 << 40, f"w{n:05d}", directory, (n,))
    writer.add(table.take(rows), keys[rows], keys[rows], np.full(len(rows), 1000, np.uint64))
    fragments += [f for _, f in writer.flush()]
pickle.dump(fragments, open(directory + "/fragments.pickle", "wb"))
"""
READ = r"""
import pickle, resource, statistics, sys, time
import pyarrow as pa
from pileshuffle.engine.fragments import read_table
from pileshuffle.engine import pile as shuffle

directory, rounds, way = sys.argv[1], int(sys.argv[2]), sys.argv[3]
pile = shuffle.Pile(0, 1, tuple(pickle.load(open(directory + "/fragments.pickle", "rb"))))
if way == "stream-per-part":  # the same Pile.ordered, its parts read as before read_joined
    shuffle.read_joined = lambda fragments: pa.concat_tables([read_table(f) for f in fragments])
start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
times = []
for _ in range(rounds):
    began = time.perf_counter()
    for _ in pile.ordered():  # each ordered slice dropped at once, as the shard writer does
        pass
    times.append(time.perf_counter() - began)
print(statistics.median(times), (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - start) / 1024)
"""


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--parts", type=int, nargs="+", default=[10, 1000, 10000])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    print(
        "| parts | part size | Pile.ordered (read_joined) | MB/s | a stream reader per part | MB/s | ratio | peak above start, MB |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for parts in args.parts:
        seconds, peaks = {}, {}
        with tempfile.TemporaryDirectory() as directory:
            subprocess.run(
                [sys.executable, "-c", WRITE, str(parts), directory],
                check=True,
                cwd=os.path.dirname(HERE),
            )
            for way in ("read_joined", "stream-per-part"):
                out = subprocess.run(
                    [sys.executable, "-c", READ, directory, str(args.rounds), way],
                    capture_output=True,
                    text=True,
                    check=True,
                    cwd=os.path.dirname(HERE),
                )
                seconds[way], peaks[way] = map(float, out.stdout.split())
        new, old = seconds["read_joined"], seconds["stream-per-part"]
        print(
            f"| {parts:,} | {100_000 // parts * 1000 // 1024:,} KiB | {new:.3f} s | {100 / new:.0f} | {old:.3f} s | "
            f"{100 / old:.0f} | {old / new:.2f}x | {peaks['read_joined']:.0f} / {peaks['stream-per-part']:.0f} |"
        )


if __name__ == "__main__":
    main()
