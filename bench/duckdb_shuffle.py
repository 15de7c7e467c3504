"""DuckDB as the Parquet and JSONL peer: what a user with DuckDB installed would run to shuffle a
data set, ``COPY (SELECT * FROM <input> ORDER BY random()) TO <output>``, on 2 threads.

    python bench/duckdb_shuffle.py --format parquet --input 'data/*.parquet' --output out/train
    python bench/duckdb_shuffle.py ... --memory_limit 800MB   # out of core: spills to --output's folder

Out of core, a ``memory_limit`` DuckDB cannot finish under ("Out of Memory Error") is doubled
and the query run again, up to ``MAX_LIMIT_GB``: the JSON line it prints last says which limit
finished and how many attempts it took (the time is the finishing attempt's alone; the row's
wall time, measured outside, includes the failed ones).
"""

import argparse
import json
import os
import time

import duckdb

MAX_LIMIT_GB = 16  # the machine has 24 GiB: above this DuckDB is not out of core any more
SUFFIX = {"parquet": ".parquet", "jsonl": ".jsonl"}


def megabytes(limit: str) -> float:
    """``800MB`` or ``1GB`` (DuckDB's decimal units) in MB."""
    number, unit = limit.upper()[:-2], limit.upper()[-2:]
    return float(number) * {"MB": 1, "GB": 1000}[unit]


def query(fmt: str, pattern: str, output: str) -> str:
    source = (
        f"read_parquet('{pattern}')"
        if fmt == "parquet"
        else f"read_json('{pattern}', format='newline_delimited')"
    )
    options = "FORMAT parquet, COMPRESSION snappy" if fmt == "parquet" else "FORMAT json"
    return f"COPY (SELECT * FROM {source} ORDER BY random()) TO '{output}' ({options})"


def shuffle(fmt: str, pattern: str, output: str, memory_limit: str, threads: int) -> float:
    config = {"threads": threads}
    if memory_limit:
        config |= {
            "memory_limit": memory_limit,
            "temp_directory": os.path.join(os.path.dirname(output), "spill"),
        }
    started = time.perf_counter()
    with duckdb.connect(config=config) as connection:
        connection.execute(query(fmt, pattern, output))
    return time.perf_counter() - started


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--format", choices=sorted(SUFFIX), required=True)
    parser.add_argument("--input", required=True)
    parser.add_argument(
        "--output", required=True, help="output prefix: writes PREFIX.parquet or PREFIX.jsonl"
    )
    parser.add_argument(
        "--memory_limit", default="", help="e.g. 1GB: out of core (default: DuckDB's, 80%% of RAM)"
    )
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    args = parser.parse_args(argv)
    output = args.output + SUFFIX[args.format]
    limit, attempts = args.memory_limit, 0
    while True:
        attempts += 1
        try:
            seconds = shuffle(args.format, args.input, output, limit, args.threads)
            break
        except duckdb.OutOfMemoryException:
            if not limit or megabytes(limit) * 2 > MAX_LIMIT_GB * 1000:
                raise
            limit = f"{megabytes(limit) * 2:g}MB"
    print(
        json.dumps({"seconds": seconds, "memory_limit": limit or "default", "attempts": attempts})
    )


if __name__ == "__main__":
    main()
