"""Read-side benchmark: the loader against tf.data and an in-order read, one run, one table.

    python bench/loader.py                  # 1 GB TFRecord, Parquet and WebDataset tar, 3 rounds
    python bench/loader.py --scale 4        # 4 GB of each (piles stay ~64 MB: 16 x scale piles)
    python bench/loader.py --quick          # 1/50 of the sizes: a smoke run
    python bench/loader.py --only 'tfrecord-*' --repeat 1
    python bench/loader.py --list

Data: ``bench/datagen.py``'s 1,000,000 x 1,000-byte records (TFRecord, and the same rows as
Parquet) in 8 files, shuffled once by ``python -m pileshuffle run --num_piles 16 --seed 1`` into
16 piles of 62,500 records (~64 MB), cached under ``bench/.data/``; the tar rows read datagen's
~1 GB of WebDataset samples (172,000 of ~5.8 KB: jpg, cls, json) shuffled the same way into 16
piles. Every row reads those 16 shards and delivers batches of 256 records:

- ``tf-inorder``      ``tf.data.TFRecordDataset(files).batch(256)``
- ``tf-shuffle``      ``tf.data.TFRecordDataset(files).shuffle(62_500).batch(256)`` (one pile of memory)
- ``pyarrow-inorder`` ``pq.ParquetFile(f).iter_batches(256)`` over the files (Parquet's plain reader)
- ``webdataset-inorder`` ``webdataset.WebDataset(files, shardshuffle=False).batched(256, collation_fn=None)``
                      (tar): WebDataset's reader, lists of sample dicts like the loader's tar batches
- ``inorder``         ``ShuffledDataset(reshuffle=False).batches(256)``: the loader's own reader, no shuffle
- ``kK``              ``ShuffledDataset(epoch=1, mix=K).batches(256)``: the reshuffling loader, in-process
- ``k1-numpy``        the same with ``as_numpy=True`` (Parquet): the dicts of numpy arrays the -dlN rows convert
- ``kK-dlN``          ``DataLoader(ds.torch(batch_size=256), batch_size=None, num_workers=N)``, N = 1, 2, 4
                      (Parquet: dicts of numpy arrays, which the DataLoader turns into tensors)
- ``k1-dl2-arrow``    the same with ``ds.torch(batch_size=256, as_numpy=False)``: Parquet batches
                      cross as ``pyarrow.RecordBatch``es
- ``kK-tf``           ``ds.tf(batch_size=256)``: the same batches as a tf.data.Dataset
- ``k1-mix2``         ``Mixture([output, output2], [1, 1]).batches(256)``: an epoch of the mixture is an
                      epoch of each of two outputs (output2: the same data shuffled with another run seed),
                      2N records, each source its own reader holding its own piles; compared per record
- ``k1-mix2-half``    the same with ``stop="restart", records_per_epoch=N``: one output's N records, half
                      of each output's epoch (the piles across that half are loaded in both epochs)
- ``k1-iter``         ``iter(ds)``: the reshuffling loader one record at a time (what Grain reads)
- ``k1-grain``        ``ds.grain().batch(256, batch_fn=list)``: the loader as a Grain IterDataset, in-process
- ``k1-grain-mp2``    the same batched in 2 ``mp_prefetch`` worker processes
- ``arrayrecord-grain-shuffle`` Grain's own global shuffle over the same records written as ArrayRecord
                      (``MapDataset.source(ArrayRecordDataSource(files)).shuffle(1).batch(256)``: a random read per record)
- ``dl2-ready``       2 DataLoader workers handing out one ready batch of 256 x 1,000 bytes through the
                      loader's shared-memory handoff: the DataLoader's and the handoff's own cost, no loading

Each row runs in its own process (``--row``); the parent samples the RSS of the row's process
tree every 20 ms from the start of its timed span (the peak of the tree's sum, and each process's own peak: the row's main
process and its largest DataLoader worker). The time is the child's: from just before the first batch is asked for to the
last (imports, interpreter start and building the pipeline excluded); MB/s is the shards' file
bytes over that time. Before its timed span each row's process touches and frees 1 GB of fresh
memory (``--touch-mb``): on this VM a process's first touch of memory costs ~15x a second touch
(``bench/first_touch.py``), a once-per-process cost like the imports, and the shards' files are
read into the page cache first for the same reason.
"""

import argparse
import fnmatch
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from loader_data import QUICK_DIVISOR, plan_data  # noqa: E402
from loader_measure import add_touch_option, measure_row  # noqa: E402
from loader_report import LEGEND, add_ratios_and_targets, fastest_rounds, pile_bytes, table  # noqa: E402
from loader_rows import BATCH, row_plan, run_row_here  # noqa: E402
from workspace import MB, OUT, log  # noqa: E402


def argument_parser():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--scale", type=int, default=1, help="GB of each format (default 1)")
    parser.add_argument(
        "--quick", action="store_true", help=f"1/{QUICK_DIVISOR} of the sizes (smoke run)"
    )
    parser.add_argument(
        "--repeat", type=int, default=3, help="rounds: every row once per round (default 3)"
    )
    parser.add_argument(
        "--only", default="", help="comma-separated row names or globs (see --list)"
    )
    parser.add_argument("--list", action="store_true")
    parser.add_argument("--timeout", type=float, default=900)
    # the child's side of one row (loader_measure.measure_row)
    parser.add_argument("--row", help=argparse.SUPPRESS)
    parser.add_argument("--mix", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    parser.add_argument("--mark", help=argparse.SUPPRESS)
    add_touch_option(parser)
    return parser


def main(argv=None):
    args = argument_parser().parse_args(argv)
    if args.row:
        run_row_here(args.row, json.loads(args.data), args.mix, args.touch_mb, args.mark)
        return 0
    only = [p.strip() for p in args.only.split(",") if p.strip()]
    plan = [
        p
        for p in row_plan()
        if not only or any(fnmatch.fnmatch(p[0], o) or p[0] == o for o in only)
    ]
    if args.list:
        print("\n".join(p[0] for p in row_plan()))
        return 0
    data, reads = plan_data(plan, args.scale, args.quick)
    title = (
        f"pileshuffle loader bench: scale {args.scale}{' (quick)' if args.quick else ''}, batches of {BATCH}, "
        + "; ".join(
            f"{d['format']} {d['records']:,} records, {d['bytes'] / MB:,.0f} MB in {d['piles']} piles "
            f"of {pile_bytes(d) / MB:,.0f} MB"
            for d in data.values()
        )
    )
    print(title, flush=True)
    attempts = {name: [] for name, *_ in plan}
    for round_index in range(args.repeat):
        log(f"round {round_index + 1} of {args.repeat}")
        for name, kind, mix, fmt in plan:
            attempts[name].append(
                measure_row(name, kind, mix, reads[name], args.timeout, args.touch_mb)
            )
    rows = fastest_rounds(plan, attempts)
    add_ratios_and_targets(rows, data)
    print()
    print(table(rows))
    print()
    print(LEGEND)
    given = list(sys.argv[1:] if argv is None else argv)
    print(f"\ncommand: python bench/loader.py {' '.join(given)}".rstrip())
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "loader-results.json"), "w") as handle:
        json.dump(
            {
                "title": title,
                "command": given,
                "touch_mb": args.touch_mb,
                "data": data,
                "rows": rows,
            },
            handle,
            indent=1,
        )
    return 0 if all(r.get("ok") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
