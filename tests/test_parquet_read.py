"""Pass 1's Parquet reader holds its chunk of rows, not a row group of any size.

Arrow reads a row group's column chunks whole unless told a read size; pyarrow writes row groups
of a million rows (1 GB of 1 KB rows) by default and Spark 128 MB-1 GB ones. Local row groups
larger than ``_WHOLE_ROW_GROUP_BYTES`` are read in 1 MiB reads: the same rows in the same order
(and the same shards), with the reader's memory bounded by its chunk. On an object store, where a
small read is a request, row groups are still read whole in Arrow's coalesced requests.
"""

import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import run_shuffle, shard_bytes

from pileshuffle.formats import get_format
from pileshuffle.formats import parquet as parquet_format


def rows(count: int, payload_bytes: int = 1000, seed: int = 0) -> pa.Table:
    """``count`` rows of an id, a short name and a payload of random (incompressible) bytes."""
    rng = np.random.default_rng(seed)
    payload = rng.integers(0, 256, size=count * payload_bytes, dtype=np.uint8)
    offsets = np.arange(count + 1, dtype=np.int32) * payload_bytes
    return pa.table(
        {
            "id": pa.array(np.arange(count)),
            "name": pa.array([f"row-{i % 97}" for i in range(count)]),
            "payload": pa.Array.from_buffers(
                pa.binary(), count, [None, pa.py_buffer(offsets), pa.py_buffer(payload)]
            ),
        }
    )


def read_all(path: str, **span) -> tuple:
    """``(table, positions)`` of everything ``read_placed`` yields for ``path``."""
    parts = list(get_format("parquet").read_placed(path, chunk_bytes=64 << 10, **span))
    table = pa.concat_tables([t for t, _ in parts]) if parts else None
    return table, np.concatenate([p for _, p in parts]) if parts else np.zeros(0)


@pytest.mark.parametrize("row_group_rows", [3_000, 700])
def test_row_groups_read_in_small_reads_give_the_rows_read_whole(
    tmp_path, monkeypatch, row_group_rows
):
    """Every row group streamed (the bound set to 0) against every one read whole: equal tables
    and positions, for the whole file and for a span of its row groups."""
    path = str(tmp_path / "in.parquet")
    pq.write_table(rows(6_000), path, row_group_size=row_group_rows)
    whole, whole_positions = read_all(path)
    second = parquet_format._row_group_start(pq.ParquetFile(path).metadata.row_group(1))
    middle = {"span": (second, 10**12)}
    whole_middle = read_all(path, **middle)
    monkeypatch.setattr(parquet_format, "_WHOLE_ROW_GROUP_BYTES", 0)
    metadata = pq.ParquetFile(path).metadata
    assert parquet_format._reads_for(path, metadata, [0]) != {}
    # an object store's small read is a request: its row groups stay read in coalesced requests
    assert parquet_format._reads_for("gs://bucket/in.parquet", metadata, [0]) == {}
    streamed, streamed_positions = read_all(path)
    assert streamed.equals(whole) and whole.num_rows == 6_000
    assert np.array_equal(streamed_positions, whole_positions)
    streamed_middle = read_all(path, **middle)
    assert streamed_middle[0].equals(whole_middle[0])
    assert np.array_equal(streamed_middle[1], whole_middle[1])
    assert whole_middle[0].num_rows == 6_000 - row_group_rows


def test_a_run_over_streamed_row_groups_writes_the_same_shards(tmp_path, monkeypatch):
    """A real run: the same shard bytes whichever way the row groups are read."""
    path = tmp_path / "in" / "data.parquet"
    path.parent.mkdir()
    pq.write_table(rows(4_000, payload_bytes=200), str(path), row_group_size=1_500)
    args = ("--num_piles=3", "--seed=7", "--format=parquet")
    run_shuffle(str(path), str(tmp_path / "whole" / "out"), *args)
    monkeypatch.setattr(parquet_format, "_WHOLE_ROW_GROUP_BYTES", 0)
    run_shuffle(str(path), str(tmp_path / "streamed" / "out"), *args)
    assert shard_bytes(str(tmp_path / "streamed" / "out")) == shard_bytes(
        str(tmp_path / "whole" / "out")
    )


_PEAK_GROWTH = """
import resource, sys
from pileshuffle.formats import get_format
fmt = get_format("parquet")
for _ in fmt.read_placed(sys.argv[2], chunk_bytes=1 << 20):  # the imports a read makes
    pass
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
for _ in fmt.read_placed(sys.argv[1], chunk_bytes=1 << 20):
    pass
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)
"""


def test_a_large_row_group_is_not_held_whole(tmp_path):
    """One row group of 150 MB (incompressible) read in 1 MB chunks: the reader's peak grows by
    far less than the row group (it grew by the row group, 590 MB for a 492 MB one, before)."""
    path = str(tmp_path / "one_group.parquet")
    pq.write_table(rows(150_000), path, row_group_size=150_000, compression="none")
    tiny = str(tmp_path / "tiny.parquet")
    pq.write_table(rows(10), tiny)
    group_bytes = parquet_format._compressed_bytes(pq.ParquetFile(path).metadata.row_group(0))
    assert group_bytes > 2 * parquet_format._WHOLE_ROW_GROUP_BYTES
    done = subprocess.run(
        [sys.executable, "-c", _PEAK_GROWTH, path, tiny],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    growth = int(done.stdout.strip()) * 1024
    assert growth < group_bytes / 3, (growth, group_bytes)


def test_a_local_file_is_read_by_arrow_itself_and_a_missing_one_is_named(tmp_path):
    """Pass 1's Parquet reader gets Arrow's own file where the file is local: Arrow reads into its
    buffers, where a Python file cost a call into Python and a bytes object per read (4.5% of a
    10 GB run's user CPU). A file that is not there is an InputError naming it."""
    from pileshuffle.errors import InputError
    from pileshuffle.formats.base import open_for_arrow

    path = str(tmp_path / "a.parquet")
    pq.write_table(rows(10), path)
    with open_for_arrow(path) as handle:
        assert isinstance(handle, pa.NativeFile) and not isinstance(handle, pa.PythonFile)
        assert pq.ParquetFile(handle).read().equals(rows(10))
    assert read_all(path)[0].equals(rows(10))
    missing = str(tmp_path / "gone.parquet")
    with pytest.raises(InputError, match=r"gone\.parquet.*cannot be opened"):
        with open_for_arrow(missing):
            pass
