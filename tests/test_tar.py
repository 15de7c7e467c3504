"""WebDataset tar shards as a fourth format: samples (the consecutive members sharing a key)
shuffled whole through `run`, `verify`, a store, `materialize` and the loader, read back by the
`webdataset` package and by `tarfile`; bad tars refused naming the shard and the member."""

import glob
import gzip
import io
import os
import tarfile

import numpy as np
import pytest
import webdataset
from helpers import FAST, assert_verified, refused, run_shuffle, shard_bytes, shards

from pileshuffle.commands import append as append_command
from pileshuffle.commands import materialize as materialize_command
from pileshuffle.commands import sample
from pileshuffle.errors import InputError
from pileshuffle.formats import ReadReport, format_of_name, get_format
from pileshuffle.loader import ShuffledDataset

RECORDS, CLASSES = 600, 6


def _member(archive, name, data, **fields):
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = len(data), 0, 0o644
    for key, value in fields.items():
        setattr(info, key, value)
    archive.addfile(info, io.BytesIO(data))


def write_archive(path, entries, format=tarfile.USTAR_FORMAT):
    """A tar of ``entries``: (name, data) files, or TarInfo objects as they are."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with tarfile.open(path, "w", format=format) as archive:
        for entry in entries:
            if isinstance(entry, tarfile.TarInfo):
                archive.addfile(entry)
            else:
                _member(archive, *entry)
    return path


def input_samples(pattern):
    """key -> {extension: bytes} of every sample of the input shards, by WebDataset."""
    return {
        s["__key__"]: _members_of(s)
        for s in webdataset.WebDataset(sorted(glob.glob(pattern)), shardshuffle=False)
    }


def _members_of(sample_dict):
    return {k: v for k, v in sample_dict.items() if not k.startswith("__")}


@pytest.fixture(scope="module")
def class_ordered(tmp_path_factory):
    """600 samples in 3 shards, written one class at a time (classes 0..5 in order), shuffled."""
    root = tmp_path_factory.mktemp("tar")
    sample.write_tar(str(root / "in"), records=RECORDS, files=3, record_bytes=700, classes=CLASSES)
    pattern, prefix = str(root / "in" / "*.tar"), str(root / "out" / "train")
    manifest = run_shuffle(pattern, prefix, "--num_piles=4", "--seed=5")
    return pattern, prefix, manifest


def test_the_format_follows_the_tar_extension():
    assert format_of_name("gs://b/shards/train-000123.tar") == "tar"
    assert format_of_name("data/part-00001-of-00010.tar.gz") == "tar"


def test_webdataset_reads_every_sample_back_whole_and_shuffled(class_ordered):
    pattern, prefix, manifest = class_ordered
    assert manifest["format"] == "tar" and manifest["totals"]["records"] == RECORDS
    assert [os.path.basename(p) for p in shards(prefix)] == [
        f"train-{i:05d}-of-00004.tar" for i in range(4)
    ]
    out = list(webdataset.WebDataset(shards(prefix), shardshuffle=False))
    assert len(out) == RECORDS
    # every member, every byte
    assert {s["__key__"]: _members_of(s) for s in out} == input_samples(pattern)
    positions = np.array([int(s["__key__"]) for s in out])
    ascending = np.mean(np.diff(positions) > 0)
    assert 0.35 < ascending < 0.65  # a shuffle: about half the neighbours ascend (input order: all)
    first = [int(s["cls"]) for s in out[:100]]
    assert len(set(first)) == CLASSES  # the first 100 samples already hold every class


def test_members_keep_their_order_and_tarfile_reads_the_shards(class_ordered):
    _, prefix, _ = class_ordered
    names = []
    for path in shards(prefix):
        with tarfile.open(path) as archive:
            names += archive.getnames()
    assert len(names) == 2 * RECORDS
    assert all(a.endswith(".cls") and b == a[:-4] + ".bin" for a, b in zip(names[::2], names[1::2]))


def test_same_input_and_seed_give_the_same_bytes_and_verify_proves_the_permutation(
    class_ordered, tmp_path
):
    pattern, prefix, _ = class_ordered
    again = str(tmp_path / "again" / "train")
    run_shuffle(pattern, again, "--num_piles=4", "--seed=5")
    assert shard_bytes(again) == shard_bytes(prefix)
    other = str(tmp_path / "other" / "train")
    run_shuffle(pattern, other, "--num_piles=4", "--seed=6")
    assert shard_bytes(other) != shard_bytes(prefix)
    assert_verified(pattern, prefix)


def test_a_lost_member_is_a_lost_sample_for_verify(class_ordered, tmp_path):
    pattern, prefix, _ = class_ordered
    copy = str(tmp_path / "copy" / "train")
    os.makedirs(os.path.dirname(copy))
    for path in glob.glob(prefix + "*"):
        with (
            open(path, "rb") as src,
            open(os.path.join(os.path.dirname(copy), os.path.basename(path)), "wb") as dst,
        ):
            dst.write(src.read())
    victim = shards(copy)[1]
    with tarfile.open(victim) as archive:
        members = [(m, archive.extractfile(m).read()) for m in archive.getmembers()]
    # one .bin member dropped
    with tarfile.open(victim, "w", format=tarfile.USTAR_FORMAT) as archive:
        for member, data in members[:5] + members[6:]:
            archive.addfile(member, io.BytesIO(data))
    from pileshuffle.commands.verify import verify

    problems = verify(pattern, copy, None)
    assert problems and any(os.path.basename(victim) in p for p in problems), problems


def test_samples_cut_across_read_chunks_come_out_whole(tmp_path):
    paths = sample.write_tar(str(tmp_path / "in"), records=50, files=1, record_bytes=3000)
    fmt = get_format("tar")
    whole = [t.column(0).to_pylist() for t in fmt.read_chunks(paths[0], chunk_bytes=1 << 30)]
    for chunk_bytes in (1, 511, 4096, 9000):
        tables = list(fmt.read_chunks(paths[0], chunk_bytes=chunk_bytes))
        assert sum((t.column(0).to_pylist() for t in tables), []) == whole[0]
    assert len(whole[0]) == 50


def test_long_names_pax_headers_directories_and_gzip_round_trip(tmp_path):
    long_dir = "capture/" + "x" * 120  # over tar's 100-byte name field: a PAX header carries it
    directory = tarfile.TarInfo(long_dir)
    directory.type, directory.mtime = tarfile.DIRTYPE, 0
    entries = [directory]
    for i in range(40):
        entries += [
            (f"{long_dir}/{i:04d}.jpg", os.urandom(300 + i)),
            (f"{long_dir}/{i:04d}.seg.png", b"%d" % i),
        ]
    path = write_archive(str(tmp_path / "in" / "a.tar"), entries, tarfile.PAX_FORMAT)
    with open(path, "rb") as handle:
        (tmp_path / "in" / "b.tar.gz").write_bytes(gzip.compress(handle.read(), mtime=0))
    os.remove(path)
    prefix = str(tmp_path / "out" / "t")
    run_shuffle(str(tmp_path / "in" / "*.tar.gz"), prefix, "--num_piles=2")
    assert all(p.endswith(".tar.gz") for p in shards(prefix))
    out = {
        s["__key__"]: _members_of(s)
        for s in webdataset.WebDataset(shards(prefix), shardshuffle=False)
    }
    assert len(out) == 40 and out[f"{long_dir}/0007"]["seg.png"] == b"7"
    assert all(len(v["jpg"]) == 300 + int(k[-4:]) for k, v in out.items())


def test_the_loader_hands_out_webdataset_dicts_a_new_order_each_epoch(class_ordered):
    pattern, prefix, _ = class_ordered
    expected = input_samples(pattern)
    first = list(ShuffledDataset(prefix, epoch=1))
    second = list(ShuffledDataset(prefix, epoch=2))
    for epoch in (first, second):
        assert {s["__key__"]: _members_of(s) for s in epoch} == expected
    assert [s["__key__"] for s in first] != [s["__key__"] for s in second]
    batch = next(iter(ShuffledDataset(prefix, epoch=1).batches(64)))
    assert len(batch) == 64 and set(batch[0]) == {"__key__", "cls", "bin"}


def test_a_resumed_epoch_delivers_the_rest_and_the_next_epoch_follows(class_ordered):
    _, prefix, _ = class_ordered
    whole = [s["__key__"] for s in ShuffledDataset(prefix, epoch=4)]
    first = ShuffledDataset(prefix, epoch=4)
    seen = [s["__key__"] for _, s in zip(range(250), first)]
    resumed = ShuffledDataset(prefix)
    resumed.load_state_dict(first.state_dict())
    assert seen + [s["__key__"] for s in resumed] == whole
    assert [s["__key__"] for s in resumed] == [
        s["__key__"] for s in ShuffledDataset(prefix, epoch=5)
    ]


def test_the_loader_names_a_damaged_shard_and_the_offset(class_ordered, tmp_path):
    _, prefix, _ = class_ordered
    copy = tmp_path / "copy"
    copy.mkdir()
    for path in glob.glob(prefix + "*"):
        (copy / os.path.basename(path)).write_bytes(open(path, "rb").read())
    victim = copy / os.path.basename(shards(prefix)[2])
    data = bytearray(victim.read_bytes())
    data[2 * 512 + 10] ^= (
        0x55  # the second member's header (after .cls: one header, one data block)
    )
    victim.write_bytes(bytes(data))
    with pytest.raises(InputError, match="corrupt tar header") as error:
        list(ShuffledDataset(str(copy / "train"), epoch=1))
    assert victim.name in str(error.value) and error.value.offset == 2 * 512


def test_dataloader_workers_carry_the_dicts(class_ordered):
    import torch

    _, prefix, _ = class_ordered
    ds = ShuffledDataset(prefix, epoch=3)
    loader = torch.utils.data.DataLoader(ds.torch(batch_size=50), batch_size=None, num_workers=2)
    keys = [s["__key__"] for batch in loader for s in batch]
    assert sorted(keys) == sorted(f"{i:09d}" for i in range(RECORDS))
    assert keys != [s["__key__"] for s in ShuffledDataset(prefix, epoch=1)]


def test_tf_data_gets_a_dict_of_strings_per_member_in_the_loaders_order(class_ordered):
    _, prefix, _ = class_ordered
    elements = list(ShuffledDataset(prefix, epoch=2).tf())
    expected = list(ShuffledDataset(prefix, epoch=2))
    assert len(elements) == RECORDS and set(elements[0]) == {"__key__", "cls", "bin"}
    assert [{k: v.numpy() for k, v in e.items()} for e in elements] == [
        {k: (v.encode() if k == "__key__" else v) for k, v in s.items()} for s in expected
    ]
    batch = next(iter(ShuffledDataset(prefix, epoch=2).tf(batch_size=64, drop_last=True)))
    assert {k: tuple(v.shape) for k, v in batch.items()} == {
        "__key__": (64,),
        "cls": (64,),
        "bin": (64,),
    }


def test_a_store_appends_and_materializes_tar_samples(tmp_path):
    sample.write_tar(str(tmp_path / "a"), records=120, files=2, record_bytes=200, classes=3)
    sample.write_tar(
        str(tmp_path / "b"),
        records=80,
        files=1,
        record_bytes=200,
        classes=2,
        first=120,
        name="more",
    )
    store = str(tmp_path / "store" / "s")
    run_shuffle(f"{tmp_path}/a/*.tar", store, "--layout=store", "--num_piles=3")
    append_command.append([f"--store={store}", f"--input={tmp_path}/b/*.tar", *FAST])
    keys = [s["__key__"] for s in ShuffledDataset(store, epoch=1)]
    assert sorted(keys) == [f"{i:09d}" for i in range(200)]
    out = str(tmp_path / "mat" / "m")
    materialize_command.materialize([f"--store={store}", f"--output={out}", *FAST])
    read = list(webdataset.WebDataset(shards(out), shardshuffle=False))
    assert sorted(s["__key__"] for s in read) == sorted(keys)
    assert {s["__key__"]: _members_of(s) for s in read} == {
        **input_samples(f"{tmp_path}/a/*.tar"),
        **input_samples(f"{tmp_path}/b/*.tar"),
    }


def test_two_input_files_with_the_same_keys_stop_the_run_naming_the_key(tmp_path, capsys):
    sample.write_tar(
        str(tmp_path / "in" / "a"), records=30, files=1, record_bytes=100, name="first"
    )
    sample.write_tar(
        str(tmp_path / "in" / "b"), records=30, files=1, record_bytes=100, name="second"
    )
    err = refused(
        capsys,
        "run",
        f"--input={tmp_path}/in/*/*.tar",
        f"--output={tmp_path}/out/o",
        "--num_piles=1",
        *FAST,
    )
    assert "key '0000000" in err and "own key" in err, err
    assert not glob.glob(f"{tmp_path}/out/o-*"), "nothing is published"


# --- bad tars: one line naming the shard and what is wrong ----------------------------------------


def _refused_input(tmp_path, capsys, name, data, *words):
    path = tmp_path / "in" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    err = refused(capsys, "run", f"--input={path}", f"--output={tmp_path}/out/o", *FAST)
    assert name in err, err
    for word in words:
        assert word in err, err
    assert not glob.glob(f"{tmp_path}/out/o-*"), "nothing is published"
    return err


def _tar_bytes(entries, format=tarfile.USTAR_FORMAT):
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=format) as archive:
        for entry in entries:
            _member(archive, *entry) if not isinstance(entry, tarfile.TarInfo) else archive.addfile(
                entry
            )
    return buffer.getvalue()


def test_a_truncated_tar_is_refused(tmp_path, capsys):
    data = _tar_bytes([("0001.jpg", os.urandom(5000)), ("0001.cls", b"1")])
    _refused_input(tmp_path, capsys, "cut.tar", data[:3000], "truncated")


def test_a_duplicate_key_inside_a_shard_is_refused(tmp_path, capsys):
    data = _tar_bytes([("0001.jpg", b"a"), ("0002.jpg", b"b"), ("0001.cls", b"1")])
    _refused_input(tmp_path, capsys, "dup.tar", data, "0001", "twice", "0001.cls")


def test_a_member_without_a_key_is_refused(tmp_path, capsys):
    data = _tar_bytes([("0001.jpg", b"a"), ("README", b"read me")])
    _refused_input(tmp_path, capsys, "nokey.tar", data, "README", "no key")


def test_a_file_named_tar_that_is_not_one_is_refused(tmp_path, capsys):
    _refused_input(tmp_path, capsys, "fake.tar", b'{"a": 1}\n' * 200, "not a tar file")


def test_a_link_member_is_refused(tmp_path, capsys):
    link = tarfile.TarInfo("0002.jpg")
    link.type, link.linkname = tarfile.SYMTYPE, "0001.jpg"
    data = _tar_bytes([("0001.jpg", b"a"), link])
    _refused_input(tmp_path, capsys, "link.tar", data, "0002.jpg", "not a file")


def test_a_damaged_header_is_named_and_skip_corrupt_keeps_the_samples_before_it(tmp_path):
    data = bytearray(_tar_bytes([(f"{i:04d}.bin", os.urandom(700)) for i in range(10)]))
    data[5 * 1536 + 100] ^= (
        0xFF  # the 6th member's header (each member: a header and 2 data blocks here)
    )
    path = tmp_path / "bad.tar"
    path.write_bytes(bytes(data))
    fmt = get_format("tar")
    with pytest.raises(InputError, match="corrupt tar header") as error:
        list(fmt.read_chunks(str(path)))
    assert error.value.offset == 5 * 1536
    report = ReadReport()
    kept = sum(t.num_rows for t in fmt.read_chunks(str(path), skip_corrupt=True, report=report))
    assert kept == 5 and report.problems and "corrupt tar header" in report.problems[0]
