"""A Parquet shard as WriteShard writes it (issue 56): Arrow's pages reach the file through a small
buffer (a large page in one write of its own, not copied into 4 MiB first), the file holds the
bytes Arrow makes, the manifest's CRC32C is the file's, and a disk that fills during the write
is reported with the output's location, locally and on gs://."""

import collections
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from helpers import FAST, assert_nothing_published, manifest, run_shuffle, shard_bytes, shards
from pileshuffle import names, sample, storage
from pileshuffle.checksums import Crc32cWriter, crc32c_hex
from pileshuffle.errors import OutputError
from pileshuffle.formats import get_format
from pileshuffle.formats.parquet import _SINK_BUFFER_BYTES

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
    """The file is the one Arrow writes to memory with the shard's options (one row group under
    64 MiB), listed by the CRC32C of its bytes."""
    table = wide_rows(9_000)
    path = str(tmp_path / "shard.parquet")
    with Crc32cWriter(storage.open_write(path)) as handle:
        get_format("parquet").write_shard(handle, iter([table]), "snappy")
    memory = pa.BufferOutputStream()
    with pq.ParquetWriter(memory, table.schema, compression="snappy") as writer:
        writer.write_table(table, row_group_size=table.num_rows)
    data = open(path, "rb").read()
    assert data == memory.getvalue().to_pybytes()
    assert handle.hex() == crc32c_hex(data) and handle.written == len(data) == os.path.getsize(path)


def test_a_disk_that_fills_during_a_parquet_shard_names_the_output(small_tmpfs, tmp_path, monkeypatch):
    """12 MB of Parquet shards onto an 8 MB disk that the plan believes has room: the disk fills
    inside Arrow's writes; the run fails naming where it wrote, and publishes nothing."""
    import pileshuffle.space as space_module

    sample.write_parquet(str(tmp_path / "in"), records=12_000, files=3, record_bytes=1000)
    usage = space_module.shutil.disk_usage(small_tmpfs)
    monkeypatch.setattr(space_module.shutil, "disk_usage", lambda path: usage._replace(free=1 << 40))
    output = os.path.join(small_tmpfs, "train")
    with pytest.raises(OutputError) as caught:
        run_shuffle(str(tmp_path / "in" / "*.parquet"), output, "--num_piles=2", f"--temp_location={tmp_path / 'temp'}")
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
    assert [s["crc32c"] for s in manifest(str(tmp_path / "out" / "t"))["shards"]] == [crc32c_hex(d) for d in objects]
    assert len(shards(str(tmp_path / "out" / "t"))) == 2 and names.manifest_path(f"{gcs}/t").startswith("gs://")
