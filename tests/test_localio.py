"""Direct I/O for local fragments and shards: same bytes as ordinary I/O, any write pattern."""

import errno
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pileshuffle import localio

SIZES = [0, 1, 4095, 4096, 4097, 3 * 4096 + 17, (1 << 20) + 5]


@pytest.mark.parametrize("size", SIZES)
def test_direct_write_then_read_round_trips(tmp_path, size):
    data = os.urandom(size)
    path = str(tmp_path / "sub" / "f.bin")  # the directory is created, as FileSystems.create does
    with localio.create(path, buffer_bytes=8192) as handle:
        assert isinstance(handle, localio.DirectWriter)  # ext4/tmpfs here: O_DIRECT is taken
        assert handle.write(data) == size
        assert handle.tell() == size
    with open(path, "rb") as plain:
        assert plain.read() == data
    assert bytes(localio.read_all(path)) == data


@settings(max_examples=60, deadline=None)
@given(
    pieces=st.lists(st.binary(min_size=0, max_size=20_000), max_size=12),
    buffer_bytes=st.sampled_from([1, 4096, 8192, 3 * 4096, 65536]),
)
def test_any_write_pattern_gives_the_concatenation(tmp_path_factory, pieces, buffer_bytes):
    path = str(tmp_path_factory.mktemp("w") / "f.bin")
    with localio.create(path, buffer_bytes=buffer_bytes) as handle:
        for piece in pieces:
            handle.write(memoryview(piece))
    expected = b"".join(pieces)
    assert open(path, "rb").read() == expected
    assert bytes(localio.read_all(path)) == expected


def test_rewriting_a_file_replaces_it(tmp_path):
    path = str(tmp_path / "f.bin")
    for data in (os.urandom(10_000), b"short"):
        with localio.create(path) as handle:
            handle.write(data)
    assert open(path, "rb").read() == b"short"


def test_file_systems_without_o_direct_fall_back_to_ordinary_io(tmp_path, monkeypatch):
    real_open = os.open

    def refusing_open(path, flags, *args):
        if flags & localio._O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", refusing_open)
    data = os.urandom(10_001)
    path = str(tmp_path / "f.bin")
    with localio.create(path) as handle:
        assert not isinstance(handle, localio.DirectWriter)
        handle.write(data)
    assert bytes(localio.read_all(path)) == data


def test_other_open_errors_are_not_hidden(tmp_path):
    (tmp_path / "a_file").write_bytes(b"")
    with pytest.raises(OSError):
        localio.create(str(tmp_path / "a_file" / "below_a_file.bin"))
    with pytest.raises(OSError):
        localio.read_all(str(tmp_path / "missing.bin"))


def test_aligned_array_is_aligned():
    for size in (1, 4096, 100_000):
        array = localio.aligned_array(size)
        assert len(array) == size and array.ctypes.data % localio.ALIGN == 0


def test_a_full_disk_is_reported_and_the_file_closed(small_tmpfs):
    """Writes run in the background; their error comes back from ``write`` or ``close``."""
    path = os.path.join(small_tmpfs, "f.bin")
    handle = localio.create(path, buffer_bytes=1 << 20)
    with pytest.raises(OSError) as caught:
        try:
            for _ in range(12):
                handle.write(os.urandom(1 << 20))  # 12 MiB into 8 MiB
        finally:
            handle.close()
    assert caught.value.errno == errno.ENOSPC
    assert handle.closed


def test_background_reads_keep_their_order_and_deletions_can_be_awaited(tmp_path):
    paths = []
    for i in range(20):
        path = tmp_path / f"f{i}"
        path.write_bytes(bytes([i]) * (i * 1000 + 1))
        paths.append(str(path))
    contents = localio.map_in_background(lambda p: bytes(localio.read_all(p)), paths)
    assert contents == [bytes([i]) * (i * 1000 + 1) for i in range(20)]
    localio.delete_soon(paths[:10])
    localio.delete_soon([str(tmp_path / "never-existed")])  # best effort: no error
    localio.wait_for_deletions()
    assert sorted(os.listdir(tmp_path)) == sorted(f"f{i}" for i in range(10, 20))
