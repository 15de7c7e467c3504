"""Cloud Storage benchmark: a run and a loader epoch on gs:// (a local gcp-storage-emulator) against
the same on local disk, one run, one table.

    python bench/gcs.py                 # 256 MB of TFRecord (256,000 x 1,000 bytes, 8 files), 3 rounds
    python bench/gcs.py --mb 1000       # 1 GB
    python bench/gcs.py --repeat 1

The emulator is a single-threaded Python HTTP server holding objects in RAM: gs:// figures here
measure pileshuffle's own overhead and request pattern (requests, sizes, retries), not Cloud
Storage's bandwidth. The emulator's memory is not counted in the peaks (it is the service).

Rows (each its own process; peak RSS of its process tree, sampled every 50 ms):

- ``run-local`` / ``run-gcs``       ``pileshuffle run --num_piles 4 --seed 1``, input and output local / on gs://
- ``epoch-local``                   one epoch of ``ShuffledDataset(local output).batches(256)``
- ``epoch-gcs``                     the same over the gs:// output, no cache
- ``epoch-gcs-cache-cold``          with ``cache_dir`` empty: the epoch fills the local pile cache
- ``epoch-gcs-cache-warm``          with that cache filled: the epoch reads local files

Run rows time the whole command; epoch rows time the epoch inside the child (imports and
opening the output excluded), MB/s is the shards' bytes over that time.
"""

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from measure import measure, stdout_json  # noqa: E402
from workspace import DATA, MB, OUT, PY, log, pileshuffle_command  # noqa: E402

BUCKET = "pileshuffle-bench"
BATCH = 256
ROWS = [
    "run-local",
    "run-gcs",
    "epoch-local",
    "epoch-gcs",
    "epoch-gcs-cache-cold",
    "epoch-gcs-cache-warm",
]
EPOCH_CHILD = (
    """
import json, sys, time
from pileshuffle.loader import ShuffledDataset
path, cache = sys.argv[1], sys.argv[2] or None
ds = ShuffledDataset(path, seed=3, epoch=1, **({"cache_dir": cache, "cache_limit": "50GB"} if cache else {}))
started = time.perf_counter()
records = sum(len(b) for b in ds.batches(%d))
print(json.dumps({"seconds": time.perf_counter() - started, "records": records}))
"""
    % BATCH
)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_emulator():
    """``(process, endpoint)`` of an in-memory emulator holding BUCKET."""
    port = free_port()
    script = os.path.join(os.path.dirname(PY), "gcp-storage-emulator")
    process = subprocess.Popen(
        [
            script,
            "start",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--in-memory",
            "--default-bucket",
            BUCKET,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return answering(process, port)


def answering(process, port: int):
    """``(process, endpoint)`` once the emulator ``process`` accepts connections on ``port``."""
    for _ in range(300):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return process, f"http://127.0.0.1:{port}"
        except OSError:
            time.sleep(0.1)
    process.kill()
    raise SystemExit("gcp-storage-emulator did not start")


def local_input(mb: int) -> str:
    """bench/datagen's TFRecord set of ``mb`` MB (1,000-byte records, 8 files), cached."""
    import datagen

    return datagen.dataset(DATA, "tfrecord", mb * 1000, 8, 1000, log=log)["directory"]


def upload(directory: str, prefix: str):
    """Copy the data set's .tfrecord files to ``prefix`` on the emulator (pyarrow, one stream each)."""
    from pileshuffle.io import storage

    for name in sorted(os.listdir(directory)):
        if name.endswith(".tfrecord"):
            with (
                open(os.path.join(directory, name), "rb") as source,
                storage.open_write(f"{prefix}/{name}") as target,
            ):
                shutil.copyfileobj(source, target, 16 * 2**20)


def shard_bytes(prefix: str) -> int:
    from pileshuffle.io import storage

    return storage.read_json(f"{prefix}-manifest.json")["totals"]["shard_bytes"]


def row_command(name: str, where: dict) -> list:
    run = pileshuffle_command() + [
        "run",
        "--num_piles",
        "4",
        "--seed",
        "1",
        "--overwrite",
        "--quiet",
    ]
    if name == "run-local":
        return run + ["--input", f"{where['local_in']}/*.tfrecord", "--output", where["local_out"]]
    if name == "run-gcs":
        return run + ["--input", f"{where['gcs_in']}/*.tfrecord", "--output", where["gcs_out"]]
    output = where["local_out"] if name == "epoch-local" else where["gcs_out"]
    cache = where["cache"] if "cache" in name else ""
    return [PY, "-c", EPOCH_CHILD, output, cache]


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mb", type=int, default=256, help="MB of TFRecord input (default 256)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument(
        "--rows", default=",".join(ROWS), help="comma-separated rows (default: all, in order)"
    )
    args = parser.parse_args(argv)
    rows = [r for r in args.rows.split(",") if r]

    emulator, endpoint = start_emulator()
    os.environ["STORAGE_EMULATOR_HOST"] = endpoint  # the rows inherit it
    work = os.path.join(OUT, "gcs")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    where = {
        "local_in": local_input(args.mb),
        "gcs_in": f"gs://{BUCKET}/in",
        "local_out": os.path.join(work, "t"),
        "gcs_out": f"gs://{BUCKET}/out/t",
        "cache": os.path.join(work, "cache"),
    }
    try:
        upload(where["local_in"], where["gcs_in"])
        results = {name: [] for name in rows}
        for round_number in range(args.repeat):
            for name in rows:
                if name == "epoch-gcs-cache-cold":
                    shutil.rmtree(where["cache"], ignore_errors=True)
                log(f"round {round_number + 1}/{args.repeat}: {name}")
                measured = measure(row_command(name, where), f"gcs-{name}", args.timeout)
                if measured.returncode != 0:
                    raise SystemExit(
                        f"{name} failed ({measured.returncode}): see bench/.out/logs/gcs-{name}.err"
                    )
                inside = stdout_json(f"gcs-{name}")
                results[name].append(
                    {
                        "seconds": inside.get("seconds", measured.wall),
                        "peak_mb": measured.peak_rss / MB,
                    }
                )
        report(results, shard_bytes(where["local_out"]), args)
    finally:
        emulator.kill()


def report(results: dict, nbytes: int, args):
    lines = [
        f"Cloud Storage bench: {args.mb} MB TFRecord, emulator at STORAGE_EMULATOR_HOST, "
        f"median of {args.repeat} round(s)",
        "",
        "| row | median s | MB/s | x local | peak MB |",
        "|---|---|---|---|---|",
    ]
    medians = {
        name: statistics.median(r["seconds"] for r in runs) for name, runs in results.items()
    }
    for name, runs in results.items():
        local = medians.get("run-local" if name.startswith("run") else "epoch-local")
        ratio = f"{local / medians[name]:.2f}" if local else "-"
        lines.append(
            f"| {name} | {medians[name]:.2f} | {nbytes / MB / medians[name]:.0f} | {ratio} | "
            f"{max(r['peak_mb'] for r in runs):.0f} |"
        )
    text = "\n".join(lines)
    print(text)
    with open(os.path.join(OUT, "gcs-results.md"), "w") as handle:
        handle.write(text + "\n")
    with open(os.path.join(OUT, "gcs-results.json"), "w") as handle:
        json.dump({"mb": args.mb, "bytes": nbytes, "results": results}, handle, indent=1)


if __name__ == "__main__":
    main()
