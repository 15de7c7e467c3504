"""TensorFlow adapter: ``ShuffledDataset.tf()`` is a ``tf.data.Dataset`` of the same records.

Invariants:
- TFRecord and JSONL records are ``tf.string`` scalars (a TFRecord payload is the serialized
  ``tf.train.Example`` as written: ``.batch(n).map(lambda x: tf.io.parse_example(x, spec))``);
  Parquet rows are dicts with one scalar tensor per column of ``ds.schema``; a tar sample is a
  dict of ``tf.string`` scalars: ``__key__`` and one per member extension of the first sample
  (a sample without one of them has ``b""`` there, members of other extensions are left out). With
  ``batch_size`` the elements are those batches instead (vectors, a dict of vectors).
- The elements are the dataset's own records in its own order: the generator hands TensorFlow
  chunks of ``ds.batches(chunk_records(ds))`` (one Python-to-TensorFlow conversion per chunk,
  never per record; ~0.3 ms per generator step, so small steps cost more than the records), and
  tf.data cuts them into records (``unbatch``) or batches (``rebatch``) in C++.
- Each pass over the ``tf.data.Dataset`` (a new ``for`` loop, ``.repeat()``, or a fresh
  ``ds.tf()``) is a pass of the dataset and follows its one rule (``loader.passes``): the
  next epoch, unless ``ds.set_epoch(e)`` or ``ds.load_state_dict`` came since the last pass.
  So ``.repeat()`` reshuffles every epoch.
- tf.data iterators run ahead of the training step (prefetch, parallel maps, and with
  ``.repeat()`` the next epoch's pass), so the state is not read from them: after the training
  loop has consumed n records of epoch e, ``state_in_epoch(ds, e, n)`` (``ds.state_after(n)``
  when ``ds.epoch`` is e) is the state to save; ``ds.load_state_dict(state)`` before
  ``ds.tf()`` resumes there.

Only this module imports TensorFlow.
"""

import copy

import pyarrow as pa
import tensorflow as tf

__all__ = [
    "CHUNK_RECORDS",
    "CHUNK_BYTES",
    "to_tf",
    "chunk_records",
    "state_in_epoch",
    "tf_dtype",
    "sample_members",
]

CHUNK_RECORDS = 8192  # records per generator step at most; tf.data cuts them into elements in C++
CHUNK_BYTES = 8 << 20  # and about this many payload bytes (wide records: images, documents)


def to_tf(dataset, *, batch_size=None, drop_last=False):
    """``dataset``'s records (or batches of ``batch_size``) as a ``tf.data.Dataset``."""
    size = chunk_records(dataset)
    members = sample_members(dataset) if dataset.format == "tar" else None

    def chunks():
        if members is not None:
            for batch in dataset.batches(size):
                yield {name: [sample.get(name, b"") for sample in batch] for name in members}
            return
        if dataset.format != "parquet":
            yield from dataset.batches(size)
            return
        for batch in dataset.batches(size):
            yield _numpy_columns(batch, " and ".join(output.location for output in dataset.outputs))

    records = tf.data.Dataset.from_generator(chunks, output_signature=_batch_spec(dataset, members))
    if batch_size is None:
        return records.unbatch()
    return records.rebatch(batch_size, drop_remainder=drop_last)


def chunk_records(dataset):
    """Records per generator step: ``CHUNK_RECORDS``, fewer for records of over 1 KB on average."""
    written = [output.fingerprint for output in dataset.outputs]
    mean_bytes = sum(w.bytes for w in written) / max(1, sum(w.records for w in written))
    return max(1, min(CHUNK_RECORDS, int(CHUNK_BYTES // max(1.0, mean_bytes))))


def state_in_epoch(dataset, epoch, n):
    """The state after ``n`` records of epoch ``epoch``, computed on a copy: a running pipeline
    (``.repeat()``) may have moved ``dataset`` on to the next epoch already. The epoch under way
    keeps its split: after an elastic resume that is the redealt tails (``n`` counted since the
    resume), not the standard split, which ``set_epoch`` would restore."""
    probe = copy.copy(dataset)
    if probe.epoch != epoch:
        probe.set_epoch(epoch)
    return probe.state_after(n)


def _numpy_columns(batch, location):
    """A RecordBatch's columns as numpy arrays; a null is refused with the column's name
    (numpy would make an integer column's nulls NaN, cast to garbage integers by TensorFlow)."""
    for name, column in zip(batch.schema.names, batch.columns):
        if column.null_count:
            raise ValueError(
                f"ds.tf(): column {name!r} of {location} has null values, which a tensor cannot "
                "hold: fill them in the data, or leave the column out with columns=[...]"
            )
    return {
        name: column.to_numpy(zero_copy_only=False)
        for name, column in zip(batch.schema.names, batch.columns)
    }


def sample_members(dataset) -> list:
    """The names a tar dataset's ``tf.data`` elements hold: ``__key__`` and the member
    extensions of its first sample (of its first non-empty pile, read once)."""
    from pileshuffle.formats import get_format
    from pileshuffle.loader.batching import payloads

    for pile in (pile for output in dataset.outputs for pile in output.piles):
        if pile.records:
            first = get_format("tar").records_of(payloads(pile.load().slice(0, 1)))[0]
            return [name for name in first]
    return ["__key__"]


def _batch_spec(dataset, members=None):
    """The ``output_signature`` of one batch: a ``tf.string`` vector for TFRecord and JSONL,
    a dict of vectors (one per column, dtype from ``dataset.schema``) for Parquet, a dict of
    ``tf.string`` vectors (``members``) for tar samples."""
    if members is not None:
        return {name: tf.TensorSpec(shape=(None,), dtype=tf.string) for name in members}
    if dataset.format != "parquet":
        return tf.TensorSpec(shape=(None,), dtype=tf.string)
    return {
        field.name: tf.TensorSpec(shape=(None,), dtype=tf_dtype(field)) for field in dataset.schema
    }


def tf_dtype(field):
    """TensorFlow's dtype for a Parquet column of ``field``'s type (numbers, bools, strings,
    binary); other types are refused with the column's name."""
    kind = field.type
    if (
        pa.types.is_string(kind)
        or pa.types.is_large_string(kind)
        or pa.types.is_binary(kind)
        or pa.types.is_large_binary(kind)
        or pa.types.is_fixed_size_binary(kind)
        or pa.types.is_string_view(kind)
        or pa.types.is_binary_view(kind)
    ):
        return tf.string
    if pa.types.is_boolean(kind) or pa.types.is_integer(kind) or pa.types.is_floating(kind):
        return tf.as_dtype(pa.array([], kind).to_numpy(zero_copy_only=False).dtype)
    raise TypeError(
        f"column {field.name!r} has type {kind}, which ds.tf() does not turn into a tensor "
        "(numbers, bools, strings and binary only): leave it out with columns=[...]"
    )
