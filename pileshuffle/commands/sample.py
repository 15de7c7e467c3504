"""Generated sample data whose records carry their input index: for the demo, the
tests and the benchmarks. Record i starts with its index as 12 ASCII digits."""

import json
import os
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pileshuffle.commands.help_style import CommandParser
from pileshuffle.formats.tfrecord import frame
from pileshuffle.io import storage

__all__ = [
    "INDEX_DIGITS",
    "WRITERS",
    "payloads",
    "index_of",
    "split_counts",
    "write_tfrecord",
    "write_jsonl",
    "write_tar",
    "parquet_table",
    "write_parquet",
    "main",
]

# a record starts with its index in this many ASCII digits, then "|": room for 10^12 records
INDEX_DIGITS = 12


def payloads(start: int, count: int, record_bytes: int, seed: int = 0, vary: bool = False):
    """Records ``start .. start+count-1``: index digits then seeded filler bytes."""
    rng = np.random.default_rng([seed, start])
    out = []
    for i in range(start, start + count):
        size = record_bytes if not vary else int(rng.integers(INDEX_DIGITS + 1, 2 * record_bytes))
        filler = rng.integers(
            97, 123, size=max(0, size - INDEX_DIGITS - 1), dtype=np.uint8
        ).tobytes()
        out.append(b"%012d|" % i + filler)
    return out


def index_of(record) -> int:
    """The input index a generated record carries (bytes payload, JSONL line or TFRecord
    payload)."""
    if isinstance(record, dict):
        return int(record["index"])
    text = bytes(record)
    if text.startswith(b'{"index":'):
        return int(json.loads(text)["index"])
    return int(text[:INDEX_DIGITS])


def split_counts(records: int, files: int):
    """Records per file when ``records`` are spread over ``files``: the first ``records % files``
    get one more."""
    base, extra = divmod(records, files)
    return [base + (1 if i < extra else 0) for i in range(files)]


def _write_file(path: str, write):
    """``write(handle)`` into a new file at ``path`` that appears only when whole: locally written
    hidden (input patterns skip hidden files) and renamed; on an object store one upload."""
    if storage.is_remote(path):
        with storage.open_write(path) as handle:
            write(handle)
        return
    directory, name = os.path.split(path)
    os.makedirs(directory or ".", exist_ok=True)
    partial = os.path.join(directory, f".{name}.partial")
    with open(partial, "wb") as handle:
        write(handle)
    os.replace(partial, path)


def _write_files(directory, records, files, name, extension, render, block_records=10_000):
    """Records 0..records-1 spread over ``files`` files; ``render(start, count)`` gives the
    bytes of a block of consecutive records."""
    paths, start = [], 0
    for f, count in enumerate(split_counts(records, files)):

        def write(handle, start=start, count=count):
            for block in range(start, start + count, block_records):
                handle.write(render(block, min(block_records, start + count - block)))

        paths.append(storage.join(directory, f"{name}-{f:03d}{extension}"))
        _write_file(paths[-1], write)
        start += count
    return paths


def write_tfrecord(
    directory, records=1000, files=4, record_bytes=100, seed=0, vary=False, name="part"
):
    """Records 0..records-1 (``payloads``) as TFRecord files ``{name}-NNN.tfrecord`` in
    ``directory``; their paths."""

    def render(start, count):
        return b"".join(frame(p) for p in payloads(start, count, record_bytes, seed, vary))

    return _write_files(directory, records, files, name, ".tfrecord", render)


def write_jsonl(directory, records=1000, files=4, record_bytes=100, seed=0, name="part"):
    """Records 0..records-1 as JSONL lines ``{"index": i, "text": ...}`` in ``{name}-NNN.jsonl``
    files; their paths."""

    def render(start, count):
        return b"".join(
            b'{"index": %d, "text": "%s"}\n'
            % (i, p[INDEX_DIGITS + 1 :][: max(0, record_bytes - 30)])
            for i, p in zip(range(start, start + count), payloads(start, count, record_bytes, seed))
        )

    return _write_files(directory, records, files, name, ".jsonl", render)


def parquet_table(start: int, count: int, record_bytes: int, seed: int = 0) -> pa.Table:
    """Rows ``start .. start+count-1``: ``index``, seeded ``label`` and ``weight``, ``name``
    (``item-{index}``) and ``payload`` (``payloads``)."""
    index = np.arange(start, start + count, dtype=np.int64)
    rng = np.random.default_rng([seed, start])
    return pa.table(
        {
            "index": index,
            "label": pa.array(rng.integers(0, 10, count, dtype=np.int32)),
            "weight": pa.array(rng.random(count)),
            "name": pa.array([f"item-{i}" for i in index.tolist()]),
            "payload": pa.array(
                payloads(start, count, max(INDEX_DIGITS + 1, record_bytes - 40), seed), pa.binary()
            ),
        }
    ).replace_schema_metadata({"source": "pileshuffle.sample", "seed": str(seed)})


def write_parquet(
    directory, records=1000, files=4, record_bytes=100, seed=0, name="part", row_group_rows=None
):
    """Rows 0..records-1 (``parquet_table``) as ``{name}-NNN.parquet`` files in ``directory``;
    their paths."""
    paths, start = [], 0
    for f, count in enumerate(split_counts(records, files)):
        table = parquet_table(start, count, record_bytes, seed)
        paths.append(storage.join(directory, f"{name}-{f:03d}.parquet"))
        _write_file(
            paths[-1],
            lambda handle, table=table: pq.write_table(
                table, handle, row_group_size=row_group_rows
            ),
        )
        start += count
    return paths


def write_tar(
    directory, records=1000, files=4, record_bytes=100, seed=0, name="part", classes=10, first=0
):
    """Samples first..first+records-1 as WebDataset shards ``{name}-NNN.tar``: sample i is key
    ``{i:09d}`` with members ``.cls`` (its class, ASCII: classes in order, ``classes`` of them, as
    a capture written one class at a time) and ``.bin`` (``payloads``); reproducible headers
    (mtime 0, root owner, mode 0644). Their paths."""
    import io
    import tarfile

    def member(archive, member_name, data):
        info = tarfile.TarInfo(member_name)
        info.size, info.mtime, info.mode = len(data), 0, 0o644
        archive.addfile(info, io.BytesIO(data))

    paths, start = [], first
    for f, count in enumerate(split_counts(records, files)):

        def write(handle, start=start, count=count):
            with tarfile.open(fileobj=handle, mode="w", format=tarfile.USTAR_FORMAT) as archive:
                for i, payload in zip(
                    range(start, start + count), payloads(start, count, record_bytes, seed)
                ):
                    member(
                        archive, f"{i:09d}.cls", b"%d" % ((i - first) * classes // max(1, records))
                    )
                    member(archive, f"{i:09d}.bin", payload)

        paths.append(storage.join(directory, f"{name}-{f:03d}.tar"))
        _write_file(paths[-1], write)
        start += count
    return paths


WRITERS = {
    "tfrecord": write_tfrecord,
    "jsonl": write_jsonl,
    "parquet": write_parquet,
    "tar": write_tar,
}  # format -> its writer


def _count_problem(args):
    """What is wrong with ``generate``'s numbers (a file count, record count or size below
    1 writes nothing useful, or fails half-way), or None."""
    for option in ("records", "files", "record_bytes"):
        value = getattr(args, option)
        if value < 1:
            return f"--{option}: must be at least 1, not {value}"
    if args.files > args.records:
        return (
            f"--files {args.files} is more than --records {args.records}: some files would be empty"
        )
    return None


def main(argv=None):
    """``pileshuffle generate``: write sample data and print the files' paths."""
    from pileshuffle.commands.options import parse_command

    parser = CommandParser(
        prog="pileshuffle generate",
        allow_abbrev=False,
        description="Write sample data whose records carry their index.",
    )
    parser.add_argument("--format", choices=sorted(WRITERS), default="tfrecord")
    parser.add_argument("--output_dir", required=True, metavar="DIR")
    parser.add_argument("--records", type=int, default=100_000, metavar="N")
    parser.add_argument("--files", type=int, default=4, metavar="N")
    parser.add_argument("--record_bytes", type=int, default=1000, metavar="N")
    parser.add_argument("--seed", type=int, default=0, metavar="N")
    args = parse_command(parser, argv)
    problem = _count_problem(args)
    if problem:
        print(f"pileshuffle generate: error: {problem}", file=sys.stderr)
        return 2
    from pileshuffle.errors import PileshuffleError

    try:
        paths = WRITERS[args.format](
            args.output_dir, args.records, args.files, args.record_bytes, args.seed
        )
    except (PileshuffleError, OSError) as error:
        print(f"pileshuffle generate: error: {error}", file=sys.stderr)
        return 2
    print("\n".join(paths))
    return 0
