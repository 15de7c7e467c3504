"""The common Beam shuffle: one element per record, keyed by a hash of its content,
GroupByKey, flatten, written with Beam's own sink.

    python bench/beam_common.py --input 'dir/*.tfrecord' --output out/train

    ReadFromTFRecord -> Map(record -> (blake2b-64(record), record)) -> GroupByKey
      -> FlatMap(values) -> WriteToTFRecord(output, file_name_suffix=".tfrecord")

Runs on Beam's FnApiRunner in in_memory mode, which is what ``--runner=DirectRunner``
falls back to after its Prism download attempt (built directly here, so no download is
tried). Beam's reader checks both CRCs of every record; its writer computes them.
Prints one JSON line: seconds (pipeline only, after imports).
"""

import argparse
import hashlib
import json
import time


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--input", required=True)
    parser.add_argument("--output", required=True)
    args = parser.parse_args(argv)

    import apache_beam as beam
    from apache_beam.io.tfrecordio import ReadFromTFRecord, WriteToTFRecord
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.runners.portability.fn_api_runner import FnApiRunner

    def keyed(record):
        return hashlib.blake2b(record, digest_size=8).digest(), record

    started = time.perf_counter()
    with beam.Pipeline(runner=FnApiRunner(), options=PipelineOptions([])) as pipeline:
        (
            pipeline
            | "Read" >> ReadFromTFRecord(args.input)
            | "KeyByHash" >> beam.Map(keyed)
            | "Group" >> beam.GroupByKey()
            | "Flatten" >> beam.FlatMap(lambda kv: kv[1])
            | "Write" >> WriteToTFRecord(args.output, file_name_suffix=".tfrecord")
        )
    print(json.dumps({"seconds": round(time.perf_counter() - started, 3)}))


if __name__ == "__main__":
    main()
