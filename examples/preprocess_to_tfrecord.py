"""Preprocess JSONL rows into tf.train.Example records, globally shuffled on the way out.

Pass 1 of the pile shuffle rides along with the preprocessing: each worker turns its rows
into serialized ``tf.train.Example`` protos and hands them straight to ``ShuffleToPiles``,
which keys them and appends them to their piles (to fragment files under
``--temp_location``, or through the runner's shuffle without it). Pass 2 orders every
pile and ``WritePiles`` writes it as one TFRecord shard, plus a manifest. There is no
separate "preprocess, write, read back, shuffle" round trip.

    python examples/preprocess_to_tfrecord.py \\
        --input 'data/*.jsonl' --output out/train --num_piles 16 --seed 1 \\
        --id_field id --temp_location /tmp/pileshuffle

Every JSON field becomes a feature: integers and booleans -> int64_list, floats ->
float_list, strings -> bytes_list (UTF-8), and lists of one of those kinds -> the same
list kind; null values and empty lists are left out. With ``--id_field`` the shuffle is
keyed by that field: the output order is then a pure function of (seed, ids) and the
same bytes come out on any runner (the Examples are serialized deterministically: a proto
map's order otherwise differs between processes). Without it, the order is uniform but
differs per run.
Any other argument (``--runner``, ``--temp_location`` ...) is a Beam pipeline option.
Needs ``tensorflow`` (or ``tensorflow-cpu``) where the pipeline runs.
"""

import argparse
import json
import sys

import apache_beam as beam
from apache_beam.options.pipeline_options import GoogleCloudOptions, PipelineOptions

from pileshuffle import ShuffleToPiles, WritePiles


class JsonToExample(beam.DoFn):
    """A JSONL line -> a serialized ``tf.train.Example`` (or ``(id, example)`` when keyed)."""

    def __init__(self, id_field=None):
        self._id_field = id_field

    def setup(self):
        import tensorflow as tf  # on the worker: keeps the DoFn picklable and the import out of the launcher

        self._tf = tf

    def process(self, line):
        if not line.strip():
            return
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"not a JSON line ({error}): {line[:200]!r}") from error
        if not isinstance(row, dict):
            raise ValueError(f"a JSONL row must be an object, got: {line[:200]!r}")
        example = self._tf.train.Example(
            features=self._tf.train.Features(
                feature={
                    name: feature
                    for name, feature in (
                        (name, self._feature(name, value)) for name, value in row.items()
                    )
                    if feature is not None
                }
            )
            # map order is otherwise per process: same row, other bytes
        ).SerializeToString(deterministic=True)
        if self._id_field is None:
            yield example
        else:
            if self._id_field not in row:
                raise ValueError(f"row has no id field {self._id_field!r}: {line[:200]!r}")
            yield row[self._id_field], example

    def _feature(self, name, value):
        tf = self._tf
        values = value if isinstance(value, list) else [value]
        values = [v for v in values if v is not None]
        if not values:
            return None
        if all(isinstance(v, (bool, int)) for v in values):
            return tf.train.Feature(int64_list=tf.train.Int64List(value=[int(v) for v in values]))
        if all(isinstance(v, (bool, int, float)) for v in values):
            return tf.train.Feature(float_list=tf.train.FloatList(value=[float(v) for v in values]))
        if all(isinstance(v, str) for v in values):
            return tf.train.Feature(
                bytes_list=tf.train.BytesList(value=[v.encode("utf-8") for v in values])
            )
        raise ValueError(
            f"field {name!r}: cannot turn {value!r} into a feature (mixed or nested values)"
        )


def build(
    pipeline,
    input_pattern,
    output,
    num_piles,
    seed,
    id_field=None,
    temp_location=None,
    compression="none",
    overwrite=False,
):
    """read JSONL -> tf.train.Example -> ShuffleToPiles -> WritePiles; returns the manifest PCollection."""
    return (
        pipeline
        | "ReadJsonl" >> beam.io.ReadFromText(input_pattern)
        | "ToExample" >> beam.ParDo(JsonToExample(id_field))
        | "Shuffle"
        >> ShuffleToPiles(
            num_piles=num_piles, seed=seed, keyed=id_field is not None, temp_location=temp_location
        )
        | "WriteTFRecords"
        >> WritePiles(
            output,
            format="tfrecord",
            compression=compression,
            num_piles=num_piles,
            overwrite=overwrite,
        )
    )


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--input", required=True, help="JSONL file pattern (gs:// or local; .gz is read as gzip)"
    )
    parser.add_argument(
        "--output", required=True, help="output prefix: {output}-00000-of-000NN.tfrecord + manifest"
    )
    parser.add_argument("--num_piles", type=int, default=16, help="number of piles = output shards")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--id_field",
        default=None,
        help="JSON field with a unique id per row: makes the order reproducible (keyed shuffle)",
    )
    parser.add_argument("--compression", choices=("none", "gzip"), default="none")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing output")
    return parser.parse_known_args(argv)


def main(argv=None):
    args, beam_args = parse_args(sys.argv[1:] if argv is None else argv)
    options = PipelineOptions(beam_args)
    # --temp_location (a Beam option) selects the files intermediate mode: fragments go there
    temp_location = options.view_as(GoogleCloudOptions).temp_location
    # local runs: Beam's FnApiRunner, no Prism download
    from pileshuffle.engine.runner import (
        make_runner,
    )

    with beam.Pipeline(runner=make_runner(options), options=options) as pipeline:
        build(
            pipeline,
            args.input,
            args.output,
            args.num_piles,
            args.seed,
            args.id_field,
            temp_location,
            args.compression,
            args.overwrite,
        )
    print(
        f"wrote {args.output}-*-of-{args.num_piles:05d}.tfrecord{'.gz' if args.compression == 'gzip' else ''} "
        f"and {args.output}-manifest.json"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
