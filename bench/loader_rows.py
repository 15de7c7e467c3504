"""The loader bench's rows: which there are and, run inside a row's own process (``loader.py
--row``), the batches each row reads and how their consumption is timed.

Heavy libraries (psutil, TensorFlow, torch, pyarrow, webdataset, pileshuffle.loader) are imported inside the
row that needs them, so a row's "RSS before" counts only its own imports.
"""

import json
import time

SEED = 1  # the loader's seed and tf.data's shuffle seed
BATCH = 256  # records per batch every row delivers
# fresh memory each row's process touches and frees before its timed span (touch_memory):
TOUCH_MB = 1024
# more than any row grows into (a mixture: ~450 MB; 4 DataLoader workers: ~1 GB together)
# ~64 MB piles of 1,000-byte records; also tf.data's shuffle buffer (one pile)
RECORDS_PER_PILE = 62_500

ROWS = [  # (name suffix, kind, mix, formats)
    ("tf-inorder", "tf-inorder", None, ("tfrecord",)),
    ("tf-shuffle", "tf-shuffle", None, ("tfrecord",)),
    ("pyarrow-inorder", "pyarrow-inorder", None, ("parquet",)),
    ("webdataset-inorder", "webdataset-inorder", None, ("tar",)),
    ("inorder", "inorder", 1, ("tfrecord", "parquet", "tar")),
    ("k1", "loader", 1, ("tfrecord", "parquet", "tar")),
    ("k4", "loader", 4, ("tfrecord", "parquet")),
    ("k1-numpy", "loader-numpy", 1, ("parquet",)),
    ("k1-dl1", "dl1", 1, ("tfrecord", "parquet")),
    ("k1-dl2", "dl2", 1, ("tfrecord", "parquet")),
    ("k1-dl4", "dl4", 1, ("tfrecord", "parquet")),
    ("k4-dl2", "dl2", 4, ("tfrecord", "parquet")),
    ("k1-dl2-arrow", "dl2-arrow", 1, ("parquet",)),
    ("dl2-ready", "dl2-ready", 1, ("tfrecord",)),  # mix 1: compared with k1
    ("k1-tf", "tf-adapter", 1, ("tfrecord",)),
    # Mixture of this output and a second shuffle of the data
    (
        "k1-mix2",
        "mixture",
        1,
        ("tfrecord", "parquet"),
    ),
    # the same, N records: half of each output's epoch
    (
        "k1-mix2-half",
        "mixture-half",
        1,
        ("tfrecord", "parquet"),
    ),
    # iter(ds): one record at a time, as Grain takes them
    (
        "k1-iter",
        "loader-iter",
        1,
        ("tfrecord",),
    ),
    ("k1-grain", "grain", 1, ("tfrecord",)),
    ("k1-grain-mp2", "grain-mp2", 1, ("tfrecord",)),
    ("arrayrecord-grain-shuffle", "arrayrecord-shuffle", None, ("tfrecord",)),
]


FORMATS = ("tfrecord", "parquet", "tar")  # the data each row of ROWS may read, in run order
# kind -> DataLoader num_workers (dicts of tensors for Parquet)
DATALOADER_KINDS = {
    "dl1": 1,
    "dl2": 2,
    "dl4": 4,
}


def row_plan():
    """(name, kind, mix, format) of every row, in run order."""
    return [
        (f"{fmt}-{suffix}", kind, mix, fmt)
        for fmt in FORMATS
        for suffix, kind, mix, formats in ROWS
        if fmt in formats
    ]


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


def webdataset_rows(files):
    """WebDataset's own reader of the shards, in order: batches are lists of sample dicts
    (``__key__``, ``__url__`` and one bytes entry per member), as the loader's tar batches are."""
    import webdataset as wds

    return wds.WebDataset(files, shardshuffle=False).batched(BATCH, collation_fn=None), len


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


def loader_rows(prefix, mix, reshuffle=True, as_numpy=False):
    return loader_dataset(prefix, mix, reshuffle).batches(BATCH, as_numpy=as_numpy), count_any


def dataloader_rows(prefix, mix, workers, as_numpy=True):
    from torch.utils.data import DataLoader

    torch_dataset = loader_dataset(prefix, mix).torch(batch_size=BATCH, as_numpy=as_numpy)
    loader = DataLoader(torch_dataset, batch_size=None, num_workers=workers)
    return loader, count_any


def ready_rows(records, workers):
    """A DataLoader whose workers hand out one ready batch of ``BATCH`` x 1,000 bytes again and
    again (``records`` in all) through the loader's shared-memory handoff: what the DataLoader
    and the handoff cost without any loading, the most a loader can deliver through them."""
    import pyarrow as pa
    from torch.utils.data import DataLoader, IterableDataset, get_worker_info

    from pileshuffle.loader.handoff import BytesOnArrival

    class Ready(IterableDataset):
        def __iter__(self):
            info = get_worker_info()
            array = pa.array([bytes(1000)] * BATCH, pa.large_binary())
            for start in range(info.id * BATCH, records, info.num_workers * BATCH):
                yield BytesOnArrival(array.slice(0, min(BATCH, records - start)), ring=True)

    return DataLoader(Ready(), batch_size=None, num_workers=workers), count_any


def mixture_rows(data, mix, half=False):
    """``Mixture([output, second output], [1, 1])``: an epoch of the mixture is an epoch of each
    output (2N records, each source its own reader). ``half``: ``stop="restart",
    records_per_epoch=N``, the same N records as one output's row, half of each output's epoch."""
    from pileshuffle.loader import Mixture, ShuffledDataset

    sources = [
        ShuffledDataset(prefix, seed=SEED + i, mix=mix) for i, prefix in enumerate(data["prefixes"])
    ]
    if half:
        mixture = Mixture(
            sources, [1, 1], seed=SEED, stop="restart", records_per_epoch=data["records"], epoch=1
        )
    else:
        mixture = Mixture(sources, [1, 1], seed=SEED, epoch=1)
    return mixture.batches(BATCH), count_any


def grain_rows(prefix, mix, workers=0):
    """``ds.grain().batch(256, batch_fn=list)`` (lists of bytes, as the loader's batches), with
    ``workers``: batched in ``mp_prefetch`` worker processes."""
    import grain

    dataset = loader_dataset(prefix, mix).grain().batch(BATCH, batch_fn=list)
    if workers:
        dataset = dataset.mp_prefetch(grain.MultiprocessingOptions(num_workers=workers))
    return dataset, count_any


def arrayrecord_shuffle_rows(paths):
    """Grain's own global shuffle: ``MapDataset.source(ArrayRecordDataSource(files)).shuffle(seed)
    .batch(256)`` over the same records written as ArrayRecord (random reads, one per record)."""
    import grain

    source = grain.sources.ArrayRecordDataSource(paths)
    return grain.MapDataset.source(source).shuffle(seed=SEED).batch(BATCH, batch_fn=list), count_any


def tf_adapter_rows(prefix, mix):
    dataset = loader_dataset(prefix, mix).tf(batch_size=BATCH)
    return dataset, count_any


def touch_memory(megabytes):
    """Touch ``megabytes`` of fresh memory and free it, before the timed span. On a VM whose host
    takes back the guest's free pages, a process's first touch of memory costs ~15x a touch of
    memory freed a moment ago (``bench/first_touch.py``: 2.1 against 0.14 ms/MB here): a cost
    once per process, like its imports, that would otherwise land on whichever row grows most.
    This makes the pages every row grows into recent, as ``cat`` makes its files cached. (Touched
    as ``bytes``, in 4 KB pages, it did not: the Parquet mixture's paired median stayed 0.85.)"""
    if megabytes:  # numpy's large arrays are in huge pages, as Arrow's pool's are (pyarrow imports numpy anyway)
        import numpy as np

        np.ones(megabytes << 20, np.uint8)


def row_batches(kind, data, mix):
    """(the row's iterable of batches, a function counting a batch's records)."""
    if kind == "tf-inorder":
        return tf_rows(data["files"], shuffle=False)
    if kind == "tf-shuffle":
        return tf_rows(data["files"], shuffle=True)
    if kind == "pyarrow-inorder":
        return pyarrow_rows(data["files"])
    if kind == "webdataset-inorder":
        return webdataset_rows(data["files"])
    if kind == "inorder":
        return loader_rows(data["prefix"], 1, reshuffle=False)
    if kind == "loader":
        return loader_rows(data["prefix"], mix)
    if kind == "loader-iter":
        return iter(loader_dataset(data["prefix"], mix)), lambda record: 1
    if kind == "loader-numpy":
        return loader_rows(data["prefix"], mix, as_numpy=True)
    if kind in DATALOADER_KINDS:
        return dataloader_rows(data["prefix"], mix, workers=DATALOADER_KINDS[kind])
    if kind == "dl2-arrow":
        return dataloader_rows(data["prefix"], mix, workers=2, as_numpy=False)
    if kind == "dl2-ready":
        return ready_rows(data["records"], workers=2)
    if kind == "tf-adapter":
        return tf_adapter_rows(data["prefix"], mix)
    if kind in ("mixture", "mixture-half"):
        return mixture_rows(data, mix, half=kind == "mixture-half")
    if kind == "grain":
        return grain_rows(data["prefix"], mix)
    if kind == "grain-mp2":
        return grain_rows(data["prefix"], mix, workers=2)
    if kind == "arrayrecord-shuffle":
        return arrayrecord_shuffle_rows(data["arrayrecord"])
    raise ValueError(kind)


def run_row_here(kind, data, mix, touch_mb=0, mark=None):
    """The child's side: build the row's pipeline, time its batches, print one JSON line;
    ``mark``: a file created when the timed span starts (the parent samples RSS from then)."""
    batches, count = row_batches(kind, data, mix)
    touch_memory(touch_mb)
    if mark:
        open(mark, "w").close()
    rss_before = rss_now()
    records, seconds, cpu = drain(batches, count)
    print(
        json.dumps(
            {"records": records, "seconds": seconds, "cpu_seconds": cpu, "rss_before": rss_before}
        ),
        flush=True,
    )
