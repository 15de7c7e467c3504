"""The DuckDB rows of bench/dedup.py: what users do today to deduplicate and shuffle Parquet,
``SELECT DISTINCT`` then ``ORDER BY random()`` (two steps, or as one query), in one DuckDB process.

    bench/.peers-venv/bin/python bench/dedup_duckdb.py FORM PATTERN OUT_DIR THREADS MEMORY_LIMIT

FORM is ``two-step`` or ``one-query``; MEMORY_LIMIT ``''`` is DuckDB's default. The output is
OUT_DIR/out.parquet; the last stdout line is a JSON object (the version, the times of the steps).
It runs in the peers' venv, so it imports only duckdb and the standard library.
"""

import json
import os
import sys
import time

DUCKDB_PARQUET = "(FORMAT parquet, COMPRESSION snappy)"


def duckdb_dedup(form, pattern, out_dir, threads, memory_limit):
    """The DuckDB rows, run in the peers' venv (only duckdb and the standard library imported)."""
    import duckdb

    config = {
        "threads": threads,
        "temp_directory": os.path.join(out_dir, "spill"),
        **({"memory_limit": memory_limit} if memory_limit else {}),
    }
    source, output = f"read_parquet('{pattern}')", os.path.join(out_dir, "out.parquet")
    started, steps, tmp_bytes = time.perf_counter(), {}, None
    with duckdb.connect(config=config) as connection:
        if form == "two-step":
            tmp = os.path.join(out_dir, "distinct.parquet")
            connection.execute(
                f"COPY (SELECT DISTINCT * FROM {source}) TO '{tmp}' {DUCKDB_PARQUET}"
            )
            steps["distinct"] = time.perf_counter() - started
            connection.execute(
                f"COPY (SELECT * FROM read_parquet('{tmp}') ORDER BY random()) TO '{output}' {DUCKDB_PARQUET}"
            )
            steps["shuffle"] = time.perf_counter() - started - steps["distinct"]
            tmp_bytes = os.path.getsize(tmp)
            os.remove(tmp)
        else:
            connection.execute(
                f"COPY (SELECT * FROM (SELECT DISTINCT * FROM {source}) ORDER BY random()) "
                f"TO '{output}' {DUCKDB_PARQUET}"
            )
    return {
        "duckdb": duckdb.__version__,
        "form": form,
        "threads": threads,
        "memory_limit": memory_limit or "default",
        "seconds": time.perf_counter() - started,
        "steps": steps,
        "tmp_bytes": tmp_bytes,
    }


def main(argv):
    form, pattern, folder, threads, limit = argv[:5]  # limit '': DuckDB's default
    print(json.dumps(duckdb_dedup(form, pattern, folder, int(threads), limit)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
