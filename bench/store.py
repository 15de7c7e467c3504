"""Pile store rows, each against a baseline measured in the same run (see docs/stores.md).

    .venv/bin/python bench/store.py               # 1 GB + 100 MB of TFRecords, 3 rounds
    .venv/bin/python bench/store.py --rounds 1 --quick

Rows (every row is its own process; wall time and peak tree RSS as in bench/run.py):
- run (shards) vs run --layout store, 1 GB              target: store <= 0.6x run
- append 100 MB to the 1 GB store vs run --layout store
  of the same 100 MB into a new store                   target: append <= 1.2x; old files untouched
- the loader reading the 1 GB store vs the loader reading
  the shards `run` wrote of the same data (epoch 1, mix=1,
  batches of 256)                                       target: store >= 0.8x the shards' speed
- fused preprocessing: a Beam pipeline ReadFromTFRecord -> Map -> ShuffleToPiles ->
  WritePileStore vs the same pipeline -> WriteToTFRecord target: <= 1.3x
- run --layout store --dedup exact vs run --layout store, 1 GB (no copies in it)   target: <= 1.15x
- append --dedup (a store made with it) of 225 MB, half of it a copy of one of the 1 GB's files,
  vs a plain append of the same files: reported (a dedup append reads the window's files of each pile)
Results: bench/.out/store-results.json and a table on stdout.
"""

import argparse
import glob
import json
import os
import shutil
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import datagen  # noqa: E402
from measure import measure, wait_for_idle, warm  # noqa: E402
from workspace import GB, OUT, PY, log, pileshuffle_command  # noqa: E402

DATA = os.path.join(HERE, ".data")
SEED = 1


def dataset(name, records, files):
    directory = os.path.join(DATA, name)
    if os.path.exists(os.path.join(directory, ".done")):
        return directory
    shutil.rmtree(directory, ignore_errors=True)
    os.makedirs(directory)
    log(f"generating {name}")
    datagen.write_tfrecord(directory, records, files, 1000, seed=0 if "append" not in name else 7)
    open(os.path.join(directory, ".done"), "w").close()
    return directory


def fused_pipeline(args):
    """One fused preprocessing pipeline (this file, run as a row): read, a trivial map, and
    either pass 1 into a store (``store``) or Beam's own TFRecord sink (``plain``)."""
    import time

    import apache_beam as beam
    from apache_beam.io.tfrecordio import ReadFromTFRecord, WriteToTFRecord
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.runners.portability.fn_api_runner import FnApiRunner

    from pileshuffle import ShuffleToPiles
    from pileshuffle.store.composed import WritePileStore

    started = time.time()
    options = PipelineOptions(["--direct_running_mode=multi_threading", "--direct_num_workers=0"])
    with beam.Pipeline(runner=FnApiRunner(), options=options) as p:
        # a trivial preprocessing step
        records = p | ReadFromTFRecord(args.input) | beam.Map(lambda r: r[:-1] + b"!")
        if args.fused == "store":
            (
                records
                | ShuffleToPiles(num_piles=args.num_piles, seed=SEED, temp_location=args.temp)
                | WritePileStore(
                    args.output, format="tfrecord", num_piles=args.num_piles, seed=SEED
                )
            )
        else:
            records | WriteToTFRecord(args.output, file_name_suffix=".tfrecord")
    print(json.dumps({"seconds": time.time() - started}))


def read_epoch(args):
    """One epoch of the loader over ``args.read`` (shards or a store), in batches of 256 (a row)."""
    import time

    from pileshuffle.loader import ShuffledDataset

    started = time.time()
    records = sum(
        len(batch) for batch in ShuffledDataset(args.read, seed=SEED, epoch=1).batches(256)
    )
    print(json.dumps({"seconds": time.time() - started, "records": records}))


def file_states(directory):
    return {
        p: (os.stat(p).st_size, os.stat(p).st_mtime_ns, os.stat(p).st_ino)
        for p in glob.glob(os.path.join(directory, "**", "*"), recursive=True)
        if os.path.isfile(p)
    }


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="1/20 of the sizes")
    parser.add_argument(
        "--idle_wait",
        type=float,
        default=15,
        help="wait up to this long for other processes to go quiet",
    )
    parser.add_argument("--fused", choices=("store", "plain"), help=argparse.SUPPRESS)
    parser.add_argument("--read", help=argparse.SUPPRESS)
    parser.add_argument("--input", help=argparse.SUPPRESS)
    parser.add_argument("--output", help=argparse.SUPPRESS)
    parser.add_argument("--temp", help=argparse.SUPPRESS)
    parser.add_argument("--num_piles", type=int, default=16, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.fused:
        return fused_pipeline(args)
    if args.read:
        return read_epoch(args)
    div = 20 if args.quick else 1
    big = dataset(f"tfrecord-{1_000_000 // div}x1000-8f-s0", 1_000_000 // div, 8)
    small = dataset(f"tfrecord-append-{100_000 // div}x1000-2f-s7", 100_000 // div, 2)
    many = dataset(f"tfrecord-many-{100_000 // div}x1000-2000f-s7", 100_000 // div, 2000)
    big_pattern, small_pattern = os.path.join(big, "*.tfrecord"), os.path.join(small, "*.tfrecord")
    ps = pileshuffle_command()
    root = os.path.join(OUT, "store")
    results = {}

    def row(name, cmd, before=None):
        warm(glob.glob(big_pattern) + glob.glob(small_pattern))
        wait_for_idle(args.idle_wait)
        m = measure(cmd, name, 1200)
        if m.returncode != 0:
            raise SystemExit(f"{name} failed (exit {m.returncode}); see bench/.out/logs/{name}.err")
        results.setdefault(name, []).append(
            {"wall": m.wall, "rss": m.peak_rss, "cpu": m.cpu, "others": m.others}
        )
        log(
            f"[{name}] {m.wall:.2f} s, peak RSS {m.peak_rss / GB:.2f} GB, other processes {m.others:.0%} of the machine"
        )
        return m

    untouched, layout_facts, dedup_facts = True, {}, {}
    for r in range(args.rounds):
        shutil.rmtree(root, ignore_errors=True)
        os.makedirs(root)
        out = lambda name: os.path.join(root, name)  # noqa: E731
        row(
            "run-shards-1g",
            [*ps, "run", "--input", big_pattern, "--output", out("shards"), "--seed", str(SEED)],
        )
        # outside root: the store run must not see them
        shards_kept = os.path.join(OUT, "store-shards")
        shutil.rmtree(shards_kept, ignore_errors=True)
        shutil.move(root, shards_kept)
        os.makedirs(root)
        row(
            "run-store-1g",
            [
                *ps,
                "run",
                "--layout",
                "store",
                "--input",
                big_pattern,
                "--output",
                out("big"),
                "--seed",
                str(SEED),
            ],
        )
        reader = [PY, os.path.abspath(__file__)]
        row("loader-epoch-shards-1g", [*reader, "--read", os.path.join(shards_kept, "shards")])
        row("loader-epoch-store-1g", [*reader, "--read", out("big")])
        shutil.rmtree(shards_kept)
        first = json.load(open(os.path.join(out("big") + "-store", "manifest-00000001.json")))
        piles = first["num_piles"]
        layout_facts = {
            "input_files": len(glob.glob(big_pattern)),
            "piles": piles,
            "writers": first["generations"][0]["writers"],
            "files": len(first["generations"][0]["files"]),
        }
        row(
            "run-store-100m",
            [
                *ps,
                "run",
                "--layout",
                "store",
                "--input",
                small_pattern,
                "--output",
                out("small"),
                "--seed",
                str(SEED),
                "--num_piles",
                str(piles),
            ],
        )
        before = file_states(out("big") + "-store")
        row("append-100m-to-1g", [*ps, "append", "--store", out("big"), "--input", small_pattern])
        after = file_states(out("big") + "-store")
        untouched &= all(
            after.get(p) == s for p, s in before.items() if "manifest" not in os.path.basename(p)
        )
        # 100 MB of new records and a copy of one 1 GB file (another file: append takes it)
        again = out("again")
        os.makedirs(again)
        shutil.copy(sorted(glob.glob(big_pattern))[0], os.path.join(again, "copy-of-big.tfrecord"))
        for path in glob.glob(small_pattern):
            os.symlink(path, os.path.join(again, os.path.basename(path)))
        again_pattern = os.path.join(again, "*.tfrecord")
        # the 100 MB are its generation 1 already
        row(
            "append-225m-to-1g",
            [
                *ps,
                "append",
                "--store",
                out("big"),
                "--input",
                again_pattern,
                "--allow_duplicate_inputs",
            ],
        )
        row(
            "run-store-dedup-1g",
            [
                *ps,
                "run",
                "--layout",
                "store",
                "--dedup",
                "exact",
                "--input",
                big_pattern,
                "--output",
                out("dedup"),
                "--seed",
                str(SEED),
            ],
        )
        row(
            "append-dedup-225m-to-1g",
            [*ps, "append", "--store", out("dedup"), "--input", again_pattern],
        )
        dedup_facts = json.load(
            open(sorted(glob.glob(os.path.join(out("dedup") + "-store", "manifest-*.json")))[-1])
        )
        dedup_facts = {
            "totals": dedup_facts["totals"],
            "appended": dedup_facts["generations"][-1]["dedup"],
        }
        shutil.rmtree(root)
        os.makedirs(root)
        fused = [PY, os.path.abspath(__file__), "--input", big_pattern, "--num_piles", str(piles)]
        row("fused-plain-tfrecord", [*fused, "--fused", "plain", "--output", out("plain/train")])
        shutil.rmtree(root)
        os.makedirs(root)
        row(
            "fused-store",
            [*fused, "--fused", "store", "--output", out("fused"), "--temp", out("tmp")],
        )
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    many_prefix = os.path.join(root, "many")
    row(
        "run-store-2000-files-100m",
        [
            *ps,
            "run",
            "--layout",
            "store",
            "--input",
            os.path.join(many, "*.tfrecord"),
            "--output",
            many_prefix,
            "--seed",
            str(SEED),
            "--num_piles",
            "64",
        ],
    )
    many_manifest = json.load(open(os.path.join(many_prefix + "-store", "manifest-00000001.json")))
    many_files = len(glob.glob(os.path.join(many_prefix + "-store", "g000000", "*.arrows")))
    many_facts = {
        "input_files": 2000,
        "piles": 64,
        "writers": many_manifest["generations"][0]["writers"],
        "files": many_files,
    }
    shutil.rmtree(root, ignore_errors=True)

    def med(name):
        return statistics.median(x["wall"] for x in results[name])

    def fastest(name):
        return min(x["wall"] for x in results[name])

    pairs = [
        ("run --layout store vs run", "run-store-1g", "run-shards-1g", 0.6),
        ("append 100 MB to 1 GB vs 100 MB store run", "append-100m-to-1g", "run-store-100m", 1.2),
        ("fused store vs fused WriteToTFRecord", "fused-store", "fused-plain-tfrecord", 1.3),
        (
            "loader epoch: store time vs shards time (speed >= 0.8x)",
            "loader-epoch-store-1g",
            "loader-epoch-shards-1g",
            1 / 0.8,
        ),
        (
            "run --layout store --dedup vs run --layout store",
            "run-store-dedup-1g",
            "run-store-1g",
            1.15,
        ),
        (
            "append --dedup 225 MB to 1 GB vs a plain append",
            "append-dedup-225m-to-1g",
            "append-225m-to-1g",
            None,
        ),
    ]
    targets = [
        (name, med(a) / med(b), fastest(a) / fastest(b), limit) for name, a, b, limit in pairs
    ]
    lines = [
        "| row | walls (s), in round order | median (s) | peak RSS (GB) | others busy |",
        "|---|---|---|---|---|",
    ]
    for name, runs in results.items():
        walls = ", ".join(f"{x['wall']:.2f}" for x in runs)
        busy = ", ".join(f"{x['others']:.0%}" for x in runs)
        lines.append(
            f"| {name} | {walls} | {med(name):.2f} | {max(x['rss'] for x in runs) / GB:.2f} | {busy} |"
        )
    lines += [
        "",
        "| target | ratio of medians | ratio of fastest | target | result (medians) |",
        "|---|---|---|---|---|",
    ]
    for name, ratio, best, limit in targets:
        if limit is None:
            lines.append(f"| {name} | {ratio:.2f}x | {best:.2f}x | none | reported |")
        else:
            lines.append(
                f"| {name} | {ratio:.2f}x | {best:.2f}x | <= {limit:.2f}x | {'PASS' if ratio <= limit else 'FAIL'} |"
            )
    lines.append(
        f"\n1 GB store, generation 0: {layout_facts['input_files']} input files, {layout_facts['writers']} writers x "
        f"{layout_facts['piles']} piles -> {layout_facts['files']} files (bound: writers x piles)"
    )
    lines.append(
        f"2,000 small inputs (100 MB): {many_facts['writers']} writers x 64 piles -> {many_facts['files']} files "
        f"(not 2,000 x 64 = 128,000)"
    )
    lines.append(
        f"append left the 1 GB store's existing files untouched (size, mtime, inode): {untouched}"
    )
    lines.append(
        f"dedup store after the append: {dedup_facts.get('totals')}; the appended generation: "
        f"{dedup_facts.get('appended')}"
    )
    print("\n".join(lines))
    with open(os.path.join(OUT, "store-results.json"), "w") as handle:
        json.dump(
            {
                "rows": results,
                "targets": [
                    {"name": n, "ratio_of_medians": r, "ratio_of_fastest": b, "limit": lim}
                    for n, r, b, lim in targets
                ],
                "untouched": untouched,
                "store_files": layout_facts,
                "dedup": dedup_facts,
                "many_inputs": many_facts,
                "command": " ".join([PY, *sys.argv]),
            },
            handle,
            indent=1,
        )


if __name__ == "__main__":
    main()
