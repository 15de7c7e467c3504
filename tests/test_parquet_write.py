"""A Parquet shard as WriteShard writes it (issue 56): Arrow's pages reach the file through a small
buffer (a large page in one write of its own, not copied into 4 MiB first), the file holds the
bytes Arrow makes, the manifest's CRC32C is the file's, only columns whose values repeat get a
dictionary, the same rows give the same file however pass 2 cut them, and a disk that fills
during the write is reported with the output's location, locally and on gs://."""

import collections
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import assert_nothing_published, manifest, run_shuffle, shard_bytes, shards

from pileshuffle import names
from pileshuffle.commands import sample
from pileshuffle.errors import OutputError
from pileshuffle.formats import get_format
from pileshuffle.formats.parquet import _SINK_BUFFER_BYTES
from pileshuffle.formats.parquet_layout import (
    WRITE_BATCH_ROWS,
    dictionary_columns,
    expected_distinct,
)
from pileshuffle.io import storage
from pileshuffle.io.checksums import Crc32cWriter, crc32c_hex

PAGE_BOUND = (1 << 20) + 1024 * 1100  # Arrow's 1 MiB data page plus one write batch of 1,024 rows


def wide_rows(count: int) -> pa.Table:
    """``count`` sample rows of about 1 KB: their payload pages are about 2 MB each."""
    return sample.parquet_table(0, count, record_bytes=1000, seed=3)


class Recording:
    """A file that keeps what is written to it, and the size of each write."""

    def __init__(self):
        self.data, self.sizes = bytearray(), []

    def write(self, data):
        self.data += data
        self.sizes.append(len(data))

    def flush(self):
        pass


def test_a_page_reaches_the_file_in_one_write_of_its_own():
    """Large pages pass Arrow's buffer by (one copy, into the bytes Python's file gets): no write
    gathers pages (a 4 MiB buffer did: 3.9 MB writes), and they carry most of the shard."""
    handle = Recording()
    get_format("parquet").write_shard(handle, iter([wide_rows(12_000)]), "snappy")
    large = [size for size in handle.sizes if size >= _SINK_BUFFER_BYTES]
    assert max(handle.sizes) < PAGE_BOUND, collections.Counter(handle.sizes).most_common(3)
    assert sum(large) > 0.95 * len(handle.data) and len(large) >= 5


def test_a_small_shard_is_one_write():
    handle = Recording()
    get_format("parquet").write_shard(handle, iter([wide_rows(40)]), "snappy")
    assert len(handle.sizes) == 1 and handle.data[:4] == b"PAR1" and handle.data[-4:] == b"PAR1"


def test_the_shard_is_arrows_bytes_and_its_crc32c_is_the_files(tmp_path):
    """Cut into tables anywhere, the rows give one file: the one Arrow writes to memory from the
    table whole with the shard's options (one row group under 64 MiB; a dictionary for ``label``
    alone), listed by the CRC32C of its bytes."""
    table = wide_rows(9_000)
    path = str(tmp_path / "shard.parquet")
    with Crc32cWriter(storage.open_write(path)) as handle:
        get_format("parquet").write_shard(
            handle, iter([table.slice(0, 7), table.slice(7, 5000), table.slice(5007)]), "snappy"
        )
    memory = pa.BufferOutputStream()
    with pq.ParquetWriter(
        memory,
        table.schema,
        compression="snappy",
        use_dictionary=["label"],
        write_batch_size=WRITE_BATCH_ROWS,
    ) as writer:
        writer.write_table(table, row_group_size=table.num_rows)
    data = open(path, "rb").read()
    assert data == memory.getvalue().to_pybytes()
    assert handle.hex() == crc32c_hex(data) and handle.written == len(data) == os.path.getsize(path)


def mixed_columns(rows: int) -> pa.Table:
    """Columns of every kind ``dictionary_columns`` tells apart, in a shuffled order."""
    rng = np.random.default_rng(7)
    words = [bytes([65 + i % 26]) * 2000 + str(i).encode() for i in range(50)]
    return pa.table(
        {
            "label": pa.array(rng.integers(0, 10, rows), pa.int32()),
            "category": pa.array(rng.integers(0, 3000, rows)),  # 3,000 values among 20,000 rows
            "id": pa.array(rng.permutation(rows)),
            "weight": pa.array(rng.random(rows)),
            # 50 values of 2 KB
            "word": pa.array([words[i] for i in rng.integers(0, 50, rows)], pa.binary()),
            "payload": pa.array([rng.bytes(300) for _ in range(rows)], pa.binary()),
            "tags": pa.array(
                [[int(i % 3)] * int(i % 4) for i in rng.integers(0, 100, rows)],
                pa.list_(pa.int64()),
            ),
        }
    )


def test_only_columns_whose_values_repeat_get_a_dictionary():
    handle = Recording()
    table = mixed_columns(20_000)
    get_format("parquet").write_shard(handle, iter([table]), "snappy")
    group = pq.ParquetFile(pa.BufferReader(bytes(handle.data))).metadata.row_group(0)
    with_dictionary = {
        group.column(i).path_in_schema
        for i in range(group.num_columns)
        if group.column(i).has_dictionary_page
    }
    assert with_dictionary == {"label", "category", "word"}
    assert pq.read_table(pa.BufferReader(bytes(handle.data))).equals(table)


def test_a_small_shard_decides_on_all_its_rows():
    """Under ``SAMPLE_ROWS`` rows the sample is the shard: a dictionary where at most half as many
    values as rows are distinct, and no more than that."""
    assert dictionary_columns(pa.table({"a": [1, 2, 1, 2], "b": [1, 2, 3, 4]}), 4) == ["a"]
    assert dictionary_columns(pa.table({"a": [1, 2, 3, 1], "b": [1, 1, 1, 1]}), 4) == ["b"]
    assert expected_distinct(1024, 1) == 1 and 1023 < expected_distinct(1024, 10**9) < 1024
    assert abs(expected_distinct(1000, 1000) - 1000 * (1 - (1 - 1 / 1000) ** 1000)) < 1e-9


@pytest.mark.parametrize(
    "cuts", [[1, 2, 3], [1023, 1024, 1025, 5000], [4096, 4097], [9, 10_000, 19_999]]
)
def test_rows_cut_anywhere_give_the_same_file(cuts):
    """Pass 2 hands a pile over in tables cut where its runs or sub-piles end: plain, dictionary
    and nested columns give the same pages however the rows are cut."""
    table = mixed_columns(20_000)
    whole, cut = Recording(), Recording()
    get_format("parquet").write_shard(whole, iter([table]), "snappy")
    bounds = [0, *cuts, table.num_rows]
    get_format("parquet").write_shard(
        cut, iter([table.slice(a, b - a) for a, b in zip(bounds, bounds[1:])]), "snappy"
    )
    assert cut.data == whole.data


def test_a_split_pile_gives_the_file_of_the_pile_whole(tmp_path):
    """20 MB of 1 KB rows in 2 piles, whole and split in sub-piles of 4 MiB: pages of 2 MB end
    where the rows do (before 1.6 they ended where a sub-pile did, and the bytes differed)."""
    sample.write_parquet(str(tmp_path / "in"), records=20_000, files=2, record_bytes=1000)
    pattern = str(tmp_path / "in" / "*.parquet")
    run_shuffle(pattern, str(tmp_path / "whole" / "o"), "--num_piles=2")
    split = run_shuffle(
        pattern, str(tmp_path / "split" / "o"), "--num_piles=2", "--max_pile_bytes=4MiB"
    )
    assert split["piles_split"] == 2
    assert shard_bytes(str(tmp_path / "split" / "o")) == shard_bytes(str(tmp_path / "whole" / "o"))


def test_a_disk_that_fills_during_a_parquet_shard_names_the_output(
    small_tmpfs, tmp_path, monkeypatch
):
    """12 MB of Parquet shards onto an 8 MB disk that the plan believes has room: the disk fills
    inside Arrow's writes; the run fails naming where it wrote, and publishes nothing."""
    import pileshuffle.planning.space as space_module

    sample.write_parquet(str(tmp_path / "in"), records=12_000, files=3, record_bytes=1000)
    usage = space_module.shutil.disk_usage(small_tmpfs)
    monkeypatch.setattr(
        space_module.shutil, "disk_usage", lambda path: usage._replace(free=1 << 40)
    )
    output = os.path.join(small_tmpfs, "train")
    with pytest.raises(OutputError) as caught:
        run_shuffle(
            str(tmp_path / "in" / "*.parquet"),
            output,
            "--num_piles=2",
            f"--temp_location={tmp_path / 'temp'}",
        )
    message = str(caught.value)
    assert message.startswith(f"cannot write to {output}.pileshuffle-staging"), message
    assert "No space left on device" in message and "\n" not in message
    assert_nothing_published(output)


def test_large_pages_on_gcs_give_the_local_bytes_and_crc32c(gcs, tmp_path):
    """Pages of about 2 MB go to an upload one write at a time: the objects are the local run's
    bytes, and each one's manifest CRC32C is that of the object."""
    sample.write_parquet(str(tmp_path / "in"), records=6_000, files=2, record_bytes=1000)
    pattern, args = str(tmp_path / "in" / "*.parquet"), ["--num_piles=2", "--seed=4"]
    run_shuffle(pattern, str(tmp_path / "out" / "t"), *args)
    remote = run_shuffle(pattern, f"{gcs}/t", *args)
    objects = [storage.read_buffer(shard["path"]).to_pybytes() for shard in remote["shards"]]
    assert objects == shard_bytes(str(tmp_path / "out" / "t"))
    assert [s["crc32c"] for s in remote["shards"]] == [crc32c_hex(data) for data in objects]
    assert [s["crc32c"] for s in manifest(str(tmp_path / "out" / "t"))["shards"]] == [
        crc32c_hex(d) for d in objects
    ]
    assert len(shards(str(tmp_path / "out" / "t"))) == 2 and names.manifest_path(
        f"{gcs}/t"
    ).startswith("gs://")
