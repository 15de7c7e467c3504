"""Read-side benchmark: the loader against tf.data and an in-order read, one run, one table.

    python bench/loader.py                  # 1 GB TFRecord and Parquet, 3 rounds
    python bench/loader.py --scale 4        # 4 GB of each (piles stay ~64 MB: 16 x scale piles)
    python bench/loader.py --quick          # 1/50 of the sizes: a smoke run
    python bench/loader.py --only 'tfrecord-*' --repeat 1
    python bench/loader.py --list

Data: ``bench/datagen.py``'s 1,000,000 x 1,000-byte records (TFRecord, and the same rows as
Parquet) in 8 files, shuffled once by ``python -m pileshuffle run --num_piles 16 --seed 1`` into
16 piles of 62,500 records (~64 MB), cached under ``bench/.data/``. Every row reads those 16
shards and delivers batches of 256 records:

- ``tf-inorder``      ``tf.data.TFRecordDataset(files).batch(256)``
- ``tf-shuffle``      ``tf.data.TFRecordDataset(files).shuffle(62_500).batch(256)`` (one pile of memory)
- ``pyarrow-inorder`` ``pq.ParquetFile(f).iter_batches(256)`` over the files (Parquet's plain reader)
- ``inorder``         ``ShuffledDataset(reshuffle=False).batches(256)``: the loader's own reader, no shuffle
- ``kK``              ``ShuffledDataset(epoch=1, mix=K).batches(256)``: the reshuffling loader, in-process
- ``kK-dl2``          ``DataLoader(ds.torch(batch_size=256), batch_size=None, num_workers=2)``
                      (Parquet: dicts of numpy arrays, which the DataLoader turns into tensors)
- ``k1-dl2-arrow``    the same with ``ds.torch(batch_size=256, as_numpy=False)``: Parquet batches
                      cross as ``pyarrow.RecordBatch``es
- ``kK-tf``           ``ds.tf(batch_size=256)``: the same batches as a tf.data.Dataset

Each row runs in its own process (``--row``); the parent samples the RSS of the row's process
tree every 20 ms. The time is the child's: from just before the first batch is asked for to the
last (imports, interpreter start and building the pipeline excluded); MB/s is the shards' file
bytes over that time, so MB/s and records/s give the same ratios.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)

DATA = os.path.join(HERE, ".data")
PY = sys.executable
SEED = 1
BATCH = 256
RECORDS_PER_PILE = 62_500
QUICK_DIVISOR = 50
SAMPLE_SECONDS = 0.02
MB = 1e6
RSS_ALLOWANCE = 200 * MB


def log(message):
    print(message, file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- data

def shuffled_output(fmt, scale, quick):
    """The prefix of a finished ``pileshuffle run`` output of the bench data (made once)."""
    import datagen

    records = 1_000_000 * scale // (QUICK_DIVISOR if quick else 1)
    piles = max(1, records // RECORDS_PER_PILE)
    source = datagen.dataset(DATA, fmt, records, 8 * scale, 1000, seed=0, log=log)
    directory = os.path.join(DATA, f"loader-{source['name']}-p{piles}")
    prefix = os.path.join(directory, "train")
    if not os.path.exists(prefix + "-manifest.json"):
        shutil.rmtree(directory, ignore_errors=True)
        os.makedirs(directory)
        log(f"shuffling {source['name']} into {piles} piles ...")
        subprocess.run([PY, "-m", "pileshuffle", "run", "--input", source["pattern"], "--output", prefix,
                        "--format", fmt, "--num_piles", str(piles), "--seed", str(SEED)],
                       check=True, cwd=REPO, env=child_env())
    with open(prefix + "-manifest.json") as handle:
        manifest = json.load(handle)
    files = [os.path.join(directory, os.path.basename(s["path"])) for s in manifest["shards"]]
    return {"prefix": prefix, "format": fmt, "files": files, "records": manifest["totals"]["records"],
            "bytes": sum(os.path.getsize(f) for f in files), "piles": len(files)}


def child_env():
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return env


# ----------------------------------------------------------------------------- rows (run in a child)

def rss_now():
    import psutil

    return psutil.Process().memory_info().rss


def cpu_seconds():
    """CPU seconds of this process (all threads) and of its reaped children (DataLoader workers)."""
    import resource

    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def drain(batches, count):
    """Time the consumption of ``batches``; returns (records, seconds, CPU seconds)."""
    records, started, cpu = 0, time.perf_counter(), cpu_seconds()
    for batch in batches:
        records += count(batch)
    seconds = time.perf_counter() - started
    return records, seconds, cpu_seconds() - cpu  # an exhausted DataLoader has joined its workers


def tf_rows(files, shuffle):
    import tensorflow as tf

    dataset = tf.data.TFRecordDataset(files)
    if shuffle:
        dataset = dataset.shuffle(RECORDS_PER_PILE, seed=SEED)
    return dataset.batch(BATCH), lambda b: int(b.shape[0])


def pyarrow_rows(files):
    import pyarrow.parquet as pq

    def batches():
        for path in files:
            yield from pq.ParquetFile(path).iter_batches(batch_size=BATCH)

    return batches(), lambda b: b.num_rows


def loader_dataset(prefix, mix, reshuffle=True):
    from pileshuffle.loader import ShuffledDataset

    return ShuffledDataset(prefix, seed=SEED, epoch=1, reshuffle=reshuffle, mix=mix)


def count_any(batch):
    if isinstance(batch, dict):
        return len(next(iter(batch.values())))
    if hasattr(batch, "num_rows"):
        return batch.num_rows
    if hasattr(batch, "shape"):
        return int(batch.shape[0])
    return len(batch)


def loader_rows(prefix, mix, reshuffle=True):
    return loader_dataset(prefix, mix, reshuffle).batches(BATCH), count_any


def dataloader_rows(prefix, mix, workers, as_numpy=True):
    from torch.utils.data import DataLoader

    torch_dataset = loader_dataset(prefix, mix).torch(batch_size=BATCH, as_numpy=as_numpy)
    loader = DataLoader(torch_dataset, batch_size=None, num_workers=workers)
    return loader, count_any


def tf_adapter_rows(prefix, mix):
    dataset = loader_dataset(prefix, mix).tf(batch_size=BATCH)
    return dataset, count_any


def row_batches(kind, data, mix):
    if kind == "tf-inorder":
        return tf_rows(data["files"], shuffle=False)
    if kind == "tf-shuffle":
        return tf_rows(data["files"], shuffle=True)
    if kind == "pyarrow-inorder":
        return pyarrow_rows(data["files"])
    if kind == "inorder":
        return loader_rows(data["prefix"], 1, reshuffle=False)
    if kind == "loader":
        return loader_rows(data["prefix"], mix)
    if kind == "dl2":
        return dataloader_rows(data["prefix"], mix, workers=2)
    if kind == "dl2-arrow":
        return dataloader_rows(data["prefix"], mix, workers=2, as_numpy=False)
    if kind == "tf-adapter":
        return tf_adapter_rows(data["prefix"], mix)
    raise ValueError(kind)


def run_row_here(kind, data, mix):
    """The child's side: build the row's pipeline, time its batches, print one JSON line."""
    batches, count = row_batches(kind, data, mix)
    rss_before = rss_now()
    records, seconds, cpu = drain(batches, count)
    print(json.dumps({"records": records, "seconds": seconds, "cpu_seconds": cpu, "rss_before": rss_before}), flush=True)


# ----------------------------------------------------------------------------- rows (the parent)

ROWS = [  # (name suffix, kind, mix, formats)
    ("tf-inorder", "tf-inorder", None, ("tfrecord",)),
    ("tf-shuffle", "tf-shuffle", None, ("tfrecord",)),
    ("pyarrow-inorder", "pyarrow-inorder", None, ("parquet",)),
    ("inorder", "inorder", 1, ("tfrecord", "parquet")),
    ("k1", "loader", 1, ("tfrecord", "parquet")),
    ("k4", "loader", 4, ("tfrecord", "parquet")),
    ("k1-dl2", "dl2", 1, ("tfrecord", "parquet")),
    ("k4-dl2", "dl2", 4, ("tfrecord", "parquet")),
    ("k1-dl2-arrow", "dl2-arrow", 1, ("parquet",)),
    ("k1-tf", "tf-adapter", 1, ("tfrecord",)),
]


def row_plan():
    return [(f"{fmt}-{suffix}", kind, mix, fmt) for fmt in ("tfrecord", "parquet")
            for suffix, kind, mix, formats in ROWS if fmt in formats]


def tree_rss(proc):
    """(sum of RSS over the process and its descendants, largest single RSS)."""
    import psutil

    try:
        procs = [proc] + proc.children(recursive=True)
    except psutil.Error:
        return 0, 0
    sizes = []
    for p in procs:
        try:
            sizes.append(p.memory_info().rss)
        except psutil.Error:
            pass
    return sum(sizes), max(sizes, default=0)


def measure_row(name, kind, mix, data, timeout):
    import psutil

    subprocess.run(["cat", *data["files"]], stdout=subprocess.DEVNULL, check=True)  # warm page cache, untimed
    cmd = [PY, os.path.abspath(__file__), "--row", kind, "--mix", str(mix or 1), "--data", json.dumps(data)]
    peak = [0, 0]
    stop = threading.Event()
    proc = psutil.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO, env=child_env())

    def sample():
        while not stop.is_set():
            total, largest = tree_rss(proc)
            peak[0], peak[1] = max(peak[0], total), max(peak[1], largest)
            stop.wait(SAMPLE_SECONDS)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        for child in proc.children(recursive=True):
            child.kill()
        proc.kill()
        out, err = proc.communicate()
    stop.set()
    sampler.join()
    lines = [line for line in out.decode(errors="replace").splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = "\n".join(err.decode(errors="replace").splitlines()[-12:])
        log(f"[{name}] failed (exit {proc.returncode}):\n{tail}")
        return {"name": name, "ok": False, "error": tail.splitlines()[-1] if tail else f"exit {proc.returncode}"}
    result = json.loads(lines[-1])
    row = {"name": name, "kind": kind, "mix": mix, "format": data["format"], "ok": result["records"] == data["records"],
           "records": result["records"], "seconds": result["seconds"], "cpu_seconds": result["cpu_seconds"],
           "records_per_s": result["records"] / result["seconds"], "mb_per_s": data["bytes"] / MB / result["seconds"],
           "peak_rss": peak[0], "peak_rss_process": peak[1], "rss_before": result["rss_before"]}
    if not row["ok"]:
        row["error"] = f"delivered {result['records']} records, expected {data['records']}"
    log(f"[{name}] {row['seconds']:.2f} s, {row['mb_per_s']:,.0f} MB/s, peak RSS {peak[0] / MB:,.0f} MB"
        + ("" if row["ok"] else f" ({row['error']})"))
    return row


# ----------------------------------------------------------------------------- targets and table

def pile_bytes(data):
    return data["bytes"] / data["piles"]


def targets(row, by_name, data):
    """The issue's targets for a reshuffling loader row, judged on medians: [(target, ok, value)]."""
    if row["kind"] not in ("loader", "dl2", "dl2-arrow", "tf-adapter") or not row.get("ok"):
        return []
    fmt, out = row["format"], []
    base = by_name.get(f"{fmt}-inorder")
    if base and base.get("ok") and row["kind"] == "loader":
        ratio = base["median_seconds"] / row["median_seconds"]
        out.append((">=0.9x in-order", ratio >= 0.9, f"{ratio:.2f}x; CPU {row['cpu_x_inorder']:.2f}x"))
    tf_shuffle = by_name.get("tfrecord-tf-shuffle")
    if fmt == "tfrecord" and tf_shuffle and tf_shuffle.get("ok") and row["mix"] == 1:
        ratio = tf_shuffle["median_seconds"] / row["median_seconds"]
        out.append((">=1x tf shuffle(62,500)", ratio >= 1.0, f"{ratio:.2f}x"))
    bound = (row["mix"] + 1) * pile_bytes(data) + RSS_ALLOWANCE
    measured = row["peak_rss_process"]
    out.append((f"RSS<=(K+1)xpile+200MB={bound / MB:,.0f}MB", measured <= bound, f"{measured / MB:,.0f} MB"))
    return out


def table(rows):
    header = ["row", "records/s", "MB/s", "median s", "x in-order", "x tf-shuffle", "cpu s", "cpu x in-order",
              "peak RSS MB", "largest proc MB", "RSS before MB", "above imports MB", "targets"]
    body = []
    for r in rows:
        if not r.get("ok"):
            body.append([r["name"], *["-"] * (len(header) - 2), f"FAILED: {r.get('error', '')}"])
            continue
        body.append([
            r["name"], f"{r['records_per_s']:,.0f}", f"{r['mb_per_s']:,.0f}", f"{r['median_seconds']:.2f}",
            "-" if r.get("x_inorder") is None else f"{r['x_inorder']:.2f}",
            "-" if r.get("x_tf_shuffle") is None else f"{r['x_tf_shuffle']:.2f}",
            f"{r['median_cpu_seconds']:.2f}", "-" if r.get("cpu_x_inorder") is None else f"{r['cpu_x_inorder']:.2f}",
            f"{r['peak_rss'] / MB:,.0f}", f"{r['peak_rss_process'] / MB:,.0f}", f"{r['rss_before'] / MB:,.0f}",
            f"{(r['peak_rss_process'] - r['rss_before']) / MB:,.0f}",
            "; ".join(f"{t}: {'PASS' if ok else 'FAIL'} ({v})" for t, ok, v in r.get("targets", [])),
        ])
    widths = [max(len(str(x)) for x in col) for col in zip(header, *body)]
    line = lambda cells: "  ".join(str(c).ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    return "\n".join([line(header), line(["-" * w for w in widths]), *map(line, body)])


LEGEND = """\
records/s, MB/s: the row's fastest round (MB/s = shard file bytes / time; 1 MB = 10^6 B); median s: its median
round. x in-order: the median speed of the row / that of the loader's in-order read of the same shards (same
format); x tf-shuffle: / that of tf.data's shuffle(62,500).batch(256) (TFRecord). cpu s: median CPU seconds of
the row's process (all threads) and its DataLoader workers over the same span; cpu x in-order: in-order's / the
row's (steadier than wall times when other jobs share the cores; wall ratios are the targets). peak RSS: the largest sum of
RSS over the row's process tree (DataLoader workers included); largest proc: the largest single process's RSS
(what the (K+1) x pile + 200 MB target is judged on: each DataLoader worker holds its own piles); RSS before:
the row's process just before its first batch (interpreter + imports: torch's ~0.2 GB, TensorFlow's ~0.5 GB);
above imports: largest proc - RSS before (the data the row holds). DataLoader workers are forked from the main
process but count its shared library pages only once they touch them, so for the -dl2 rows this understates."""


# ----------------------------------------------------------------------------- main

def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", type=int, default=1, help="GB of each format (default 1)")
    parser.add_argument("--quick", action="store_true", help=f"1/{QUICK_DIVISOR} of the sizes (smoke run)")
    parser.add_argument("--repeat", type=int, default=3, help="rounds: every row once per round (default 3)")
    parser.add_argument("--only", default="", help="comma-separated row names or globs (see --list)")
    parser.add_argument("--list", action="store_true")
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--row", help=argparse.SUPPRESS)
    parser.add_argument("--mix", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.row:
        run_row_here(args.row, json.loads(args.data), args.mix)
        return 0
    import fnmatch

    only = [p.strip() for p in args.only.split(",") if p.strip()]
    plan = [p for p in row_plan() if not only or any(fnmatch.fnmatch(p[0], o) or p[0] == o for o in only)]
    if args.list:
        print("\n".join(p[0] for p in row_plan()))
        return 0
    data = {fmt: shuffled_output(fmt, args.scale, args.quick) for fmt in sorted({p[3] for p in plan})}
    title = (f"pileshuffle loader bench: scale {args.scale}{' (quick)' if args.quick else ''}, batches of {BATCH}, "
             + "; ".join(f"{d['format']} {d['records']:,} records, {d['bytes'] / MB:,.0f} MB in {d['piles']} piles "
                         f"of {pile_bytes(d) / MB:,.0f} MB" for d in data.values()))
    print(title, flush=True)
    attempts = {name: [] for name, *_ in plan}
    for round_index in range(args.repeat):
        log(f"round {round_index + 1} of {args.repeat}")
        for name, kind, mix, fmt in plan:
            attempts[name].append(measure_row(name, kind, mix, data[fmt], args.timeout))
    rows = []
    for name, *_ in plan:
        good = [a for a in attempts[name] if a.get("ok")]
        if not good:
            rows.append(attempts[name][-1])
            continue
        best = dict(min(good, key=lambda a: a["seconds"]))
        best["median_seconds"] = statistics.median(a["seconds"] for a in good)
        best["median_cpu_seconds"] = statistics.median(a["cpu_seconds"] for a in good)
        best["rounds_seconds"] = [round(a["seconds"], 3) for a in good]
        best["peak_rss"] = max(a["peak_rss"] for a in good)
        best["peak_rss_process"] = max(a["peak_rss_process"] for a in good)
        rows.append(best)
    by_name = {r["name"]: r for r in rows}
    for r in rows:
        if not r.get("ok"):
            continue
        base, tfs = by_name.get(f"{r['format']}-inorder"), by_name.get("tfrecord-tf-shuffle")
        r["x_inorder"] = base["median_seconds"] / r["median_seconds"] if base and base.get("ok") else None
        r["cpu_x_inorder"] = base["median_cpu_seconds"] / r["median_cpu_seconds"] if base and base.get("ok") else None
        r["x_tf_shuffle"] = (tfs["median_seconds"] / r["median_seconds"]
                             if r["format"] == "tfrecord" and tfs and tfs.get("ok") else None)
        r["targets"] = targets(r, by_name, data[r["format"]])
    print()
    print(table(rows))
    print()
    print(LEGEND)
    given = list(sys.argv[1:] if argv is None else argv)
    print(f"\ncommand: python bench/loader.py {' '.join(given)}".rstrip())
    out = os.path.join(HERE, ".out")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "loader-results.json"), "w") as handle:
        json.dump({"title": title, "command": given, "data": data, "rows": rows}, handle, indent=1)
    return 0 if all(r.get("ok") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
