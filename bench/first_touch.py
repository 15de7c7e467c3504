"""What this machine charges for touching memory: fresh memory (the process has not had it)
against memory it freed a moment ago. On a VM whose host takes back the guest's free pages, the
first touch costs many times the second, and which one a loader's pile load meets swings run to
run (docs/performance.md, mixtures).

    python bench/first_touch.py               # 8 rounds of 512 MB
    python bench/first_touch.py --mb 256 --rounds 16 --pause 3

Each round starts a fresh process that touches ``--mb`` of fresh memory, frees it and touches
the same amount again at once; rounds are ``--pause`` seconds apart (the kernel reports free
pages to the host about 2 s after they are freed). Prints ms per MB for both touches.
"""

import argparse
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
CHILD = """
import sys, time
sys.path.insert(0, sys.argv[2])
from loader_rows import touch_memory  # the loader bench's own touch, timed here
mb = int(sys.argv[1])
times = []
for _ in range(2):
    start = time.perf_counter()
    touch_memory(mb)
    times.append((time.perf_counter() - start) * 1000 / mb)
print(*times)
"""


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mb", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--pause", type=float, default=3.0)
    args = parser.parse_args(argv)
    if args.mb < 1 or args.rounds < 1:
        parser.error("--mb and --rounds need at least 1")
    first, again = [], []
    for index in range(args.rounds):
        out = subprocess.run(
            [sys.executable, "-c", CHILD, str(args.mb), HERE],
            capture_output=True,
            text=True,
            check=True,
        )
        a, b = map(float, out.stdout.split())
        first.append(a)
        again.append(b)
        print(f"round {index + 1}: first touch {a:.2f} ms/MB, again {b:.2f} ms/MB", flush=True)
        time.sleep(args.pause)
    print(
        f"first touch: median {statistics.median(first):.2f} ms/MB, range {min(first):.2f}-{max(first):.2f}; "
        f"again: median {statistics.median(again):.2f}, range {min(again):.2f}-{max(again):.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
