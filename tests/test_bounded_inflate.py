"""A compressed input is inflated a bounded read at a time (``storage.open_read``).

Beam's decompressing reader inflates each compressed read whole, and read 16 MiB at a time: a
6.8 MB gzip file of repetitive JSONL lines (1 GB inside) took `pileshuffle plan`, which samples
only its first MiB, 48 s and 2.2 GB. Reads of 64 KiB bound what one read can inflate.
"""

import gzip
import os
import sys

from helpers import with_peak_rss

LINE = b'{"text": "' + b"x" * 500 + b'"}\n'
GiB = 1 << 30


def test_plan_samples_a_gzip_file_of_repetitive_lines_in_bounded_memory(tmp_path):
    source = tmp_path / "in" / "a.jsonl.gz"
    os.makedirs(source.parent)
    with gzip.open(source, "wb", compresslevel=1) as handle:
        for _ in range(200):
            handle.write(LINE * 10_000)  # 1 GB of lines in about 7 MB
    command = [
        sys.executable,
        "-m",
        "pileshuffle",
        "plan",
        "--json",
        "--input",
        f"{source}",
        "--output",
        f"{tmp_path}/out/t",
    ]
    done, out, peak = with_peak_rss(command)
    assert done.returncode == 0, done.stderr[-2000:]
    assert '"num_piles"' in out
    assert int(peak) < GiB // 2, f"plan held {int(peak) / 1e6:,.0f} MB to sample a 7 MB file"
