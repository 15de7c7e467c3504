"""A file read whole once and held (``io.held_bytes``): storage's reads of that path in the
holding thread, in the form held, come from memory; any other read reads the file."""

import gzip
import threading

import pyarrow as pa

from pileshuffle.io import held_bytes, storage


def read_all(handle) -> bytes:
    with handle:
        return handle.read()


def test_reads_in_the_block_and_thread_come_from_the_held_bytes(tmp_path):
    path = str(tmp_path / "shard.tfrecord")
    with open(path, "wb") as out:
        out.write(b"on disk")
    held = pa.py_buffer(b"in memory")  # not the file's bytes: shows where a read came from
    seen_elsewhere = []
    with held_bytes.held(path, held):
        assert read_all(storage.open_read(path)) == b"in memory"
        assert read_all(storage.open_random_access(path)) == b"in memory"
        other = threading.Thread(
            target=lambda: seen_elsewhere.append(read_all(storage.open_read(path)))
        )
        other.start()
        other.join()
    assert seen_elsewhere == [b"on disk"]  # another thread reads the file
    assert read_all(storage.open_read(path)) == b"on disk"  # so does a read after the block


def test_a_gz_file_is_held_decompressed_and_its_raw_bytes_are_read_from_the_file(tmp_path):
    path = str(tmp_path / "shard.jsonl.gz")
    raw = gzip.compress(b'{"a": 1}\n')
    with open(path, "wb") as out:
        out.write(raw)
    contents = storage.read_buffer(path)  # as verify reads it: decompressed
    assert contents.to_pybytes() == b'{"a": 1}\n'
    with held_bytes.held(path, pa.py_buffer(b'{"a": 2}\n')):
        assert read_all(storage.open_read(path)) == b'{"a": 2}\n'  # AUTO: decompressed, held
        assert read_all(storage.open_read(path, storage.UNCOMPRESSED)) == raw
        assert read_all(storage.open_random_access(path)) == raw


def test_a_remote_file_is_held_only_within_a_quarter_of_the_memory_left(monkeypatch):
    """``whole_reads`` holds a remote file whole only up to ``HELD_MAX_BYTES`` and a quarter of
    what this process may still take (a container's limit included); a local file never."""
    from pileshuffle.io import memory_limit, whole_reads

    left = memory_limit.Memory(4_000, "cgroup v1 limit")
    monkeypatch.setattr(whole_reads, "available_memory", lambda: left)
    assert whole_reads._may_hold(1_000) and not whole_reads._may_hold(1_001)
    monkeypatch.setattr(whole_reads, "HELD_MAX_BYTES", 500)
    assert not whole_reads._may_hold(501) and whole_reads._may_hold(500)
    downloads = []
    monkeypatch.setattr(storage, "read_buffer", lambda path: downloads.append(path))
    with whole_reads.read_once("/local/file.parquet", 10):
        with whole_reads.read_once("gs://b/too-big.parquet", 501):
            pass
    assert downloads == []
