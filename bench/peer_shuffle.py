"""Polars, Ray Data and Hugging Face ``datasets`` as Parquet and JSONL peers: each shuffles a
whole data set to files the way its documentation shows. Runs in the peers' own venv
(``make peers``: bench/.peers-venv from bench/peers-requirements.txt), never pileshuffle's.

    bench/.peers-venv/bin/python bench/peer_shuffle.py --peer polars --format parquet \\
        --input 'data/*.parquet' --output out/train

- polars: read everything, ``sample(fraction=1, shuffle=True, seed=)``, write one file
  PREFIX.EXT (in RAM; all cores);
- ray: ``read_parquet/read_json`` + ``random_shuffle(seed=)`` + ``write_parquet/write_json``
  into the folder PREFIX/ (one file per write task), 2 CPUs, an object store of
  ``--object_store_gb``, objects spilled to ``ray-spill/`` beside PREFIX;
- datasets: ``load_dataset("parquet"/"json", data_files=)``, ``.shuffle(seed=)``,
  ``.flatten_indices()``, ``to_parquet/to_json`` into PREFIX.EXT; its Arrow cache in
  ``hf-cache/`` beside PREFIX.

Parquet is written with snappy, as pileshuffle and the DuckDB row write it. The last line printed
is JSON: the peer, its version, the seconds from the first read to the last write (start-up
excluded) and ``start_seconds`` (imports, and Ray's cluster start).
"""

import argparse
import glob
import importlib
import json
import os
import time

EXT = {"parquet": "parquet", "jsonl": "jsonl"}
MODULES = {"polars": "polars", "ray": "ray.data", "datasets": "datasets"}


def polars_shuffle(fmt, files, prefix, seed):
    """Polars in RAM: the whole frame, sampled without replacement at fraction 1."""
    import polars as pl

    frame = pl.read_parquet(files) if fmt == "parquet" else pl.scan_ndjson(files).collect()
    frame = frame.sample(fraction=1.0, shuffle=True, seed=seed)
    target = f"{prefix}.{EXT[fmt]}"
    if fmt == "parquet":
        frame.write_parquet(target, compression="snappy")
    else:
        frame.write_ndjson(target)
    return {"version": pl.__version__}


def ray_start(folder, object_store_gb):
    """A local Ray cluster of 2 CPUs whose spilled objects go to FOLDER/ray-spill."""
    import ray

    ray.init(
        num_cpus=2,
        object_store_memory=int(object_store_gb * 1e9),
        include_dashboard=False,
        object_spilling_directory=os.path.join(folder, "ray-spill"),
        log_to_driver=False,
    )
    ray.data.DataContext.get_current().enable_progress_bars = False


def ray_shuffle(fmt, files, prefix, seed):
    """Ray Data: a distributed random_shuffle, written one file per write task into PREFIX/."""
    import ray
    from ray.data.datasource import FilenameProvider

    read = ray.data.read_parquet if fmt == "parquet" else ray.data.read_json
    shuffled = read(files).random_shuffle(seed=seed)
    names = FilenameProvider(file_format=EXT[fmt])  # .jsonl, not Ray's default .json
    if fmt == "parquet":
        shuffled.write_parquet(prefix, filename_provider=names)
    else:
        shuffled.write_json(prefix, filename_provider=names)
    return {"version": ray.__version__, "files": len(os.listdir(prefix))}


def datasets_shuffle(fmt, files, prefix, seed):
    """Hugging Face datasets: an index mapping shuffled, then flattened into a new Arrow table."""
    import datasets

    cache = os.path.join(os.path.dirname(prefix), "hf-cache")
    loaded = datasets.load_dataset(
        "parquet" if fmt == "parquet" else "json", data_files=files, split="train", cache_dir=cache
    )
    shuffled = loaded.shuffle(seed=seed).flatten_indices()
    target = f"{prefix}.{EXT[fmt]}"
    if fmt == "parquet":
        shuffled.to_parquet(target)  # snappy: pyarrow's default
    else:
        shuffled.to_json(target)  # JSON lines: the default
    return {"version": datasets.__version__}


PEERS = {"polars": polars_shuffle, "ray": ray_shuffle, "datasets": datasets_shuffle}


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--peer", choices=sorted(PEERS), required=True)
    parser.add_argument("--format", choices=sorted(EXT), required=True)
    parser.add_argument("--input", required=True, help="glob of the input files")
    parser.add_argument(
        "--output", required=True, help="output prefix: PREFIX.EXT (ray: the folder PREFIX/)"
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--object_store_gb", type=float, default=2.0, help="ray: the object store's size"
    )
    args = parser.parse_args(argv)
    started = time.perf_counter()
    files = sorted(glob.glob(args.input))
    if not files:
        parser.error(f"--input {args.input} matches no file")
    importlib.import_module(MODULES[args.peer])
    if args.peer == "ray":
        ray_start(os.path.dirname(os.path.abspath(args.output)), args.object_store_gb)
    begun = time.perf_counter()
    info = PEERS[args.peer](args.format, files, args.output, args.seed)
    print(
        json.dumps(
            {
                "peer": args.peer,
                **info,
                "seconds": time.perf_counter() - begun,
                "start_seconds": begun - started,
            }
        )
    )


if __name__ == "__main__":
    main()
