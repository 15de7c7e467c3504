"""One large file against the same records in 8 files: pass 1 reads a large file in spans on
every worker (``pileshuffle.engine.sources.split_sources``), so one file should cost what 8 do.

    python bench/large_file.py                 # 1 GB of JSONL and of Parquet, 3 rounds
    python bench/large_file.py --scale 2 --rounds 5

The 8-file sets are ``bench/datagen``'s (JSONL: ~500-byte lines; Parquet: ~1 KB rows); the one
file holds the same records in the same order (JSONL: the 8 files concatenated; Parquet: their
rows rewritten as row groups of 16,384 rows, as Spark and pyarrow write large files). Each round
runs ``pileshuffle run --num_piles 16 --seed 1`` on both, interleaved, on a warm page cache; the
rows are medians: wall time, CPU seconds over wall (2.0 = both cores busy the whole run), peak
RSS of the process tree, and the one file's time over the 8 files'.
"""

import argparse
import os
import shutil
import statistics
import sys

import pyarrow.parquet as pq
from datagen import dataset
from measure import measure_run
from workspace import DATA, OUT

ROW_GROUP_ROWS = 16_384
# records, bytes per record at scale 1
SETS = {
    "jsonl": (2_000_000, 500),
    "parquet": (1_000_000, 1000),
}


def one_file(info) -> str:
    """The data set's records in one file beside it (made once)."""
    fmt = "jsonl" if info["format"] == "jsonl" else "parquet"
    path = os.path.join(DATA, f"{info['name']}-one", f"all.{fmt}")
    if os.path.exists(path):
        return path
    os.makedirs(os.path.dirname(path), exist_ok=True)
    temp = path + ".tmp"
    if fmt == "jsonl":
        with open(temp, "wb") as out:
            for part in info["files"]:
                with open(part, "rb") as source:
                    shutil.copyfileobj(source, out, 16 << 20)
    else:
        schema = pq.read_schema(info["files"][0])
        with pq.ParquetWriter(temp, schema) as writer:
            for part in info["files"]:
                writer.write_table(pq.read_table(part), row_group_size=ROW_GROUP_ROWS)
    os.rename(temp, path)
    return path


def run(fmt, pattern, name, files):
    out = os.path.join(OUT, "large_file", name)
    cmd = [
        sys.executable,
        "-m",
        "pileshuffle",
        "run",
        "--input",
        pattern,
        "--output",
        os.path.join(out, "s"),
        "--num_piles",
        "16",
        "--seed",
        "1",
        "--quiet",
    ]
    return measure_run(cmd, f"large_file-{name}", out, files)


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--scale", type=float, default=1.0, help="GB of each format (default 1)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--formats", nargs="+", default=list(SETS))
    args = parser.parse_args(argv)
    print("| format | input | wall (median) | CPU / wall | peak RSS | one file / 8 files |")
    print("|---|---|---|---|---|---|")
    for fmt in args.formats:
        records, record_bytes = SETS[fmt]
        info = dataset(DATA, fmt, int(records * args.scale), 8, record_bytes)
        single = one_file(info)
        inputs = {"8 files": (info["pattern"], info["files"]), "one file": (single, [single])}
        seen = {name: [] for name in inputs}
        for _ in range(args.rounds):
            for name, (pattern, files) in inputs.items():
                seen[name].append(run(fmt, pattern, f"{fmt}-{name.replace(' ', '_')}", files))
        wall = {name: statistics.median(m.wall for m in got) for name, got in seen.items()}
        for name, got in seen.items():
            cores = statistics.median(m.cpu / m.wall for m in got)
            peak = max(m.peak_rss for m in got) / 1e9
            ratio = f"{wall['one file'] / wall['8 files']:.2f}x" if name == "one file" else ""
            size = sum(os.path.getsize(f) for f in inputs[name][1]) / 1e9
            print(
                f"| {fmt} | {name} ({size:.2f} GB) | {wall[name]:.1f} s | {cores:.2f} | {peak:.2f} GB | {ratio} |"
            )


if __name__ == "__main__":
    main()
