"""On-disk names and manifest versions (pileshuffle.names): every manifest says its kind and
format version; a newer MAJOR is refused by every reader with one line naming the file; a
newer MINOR and a manifest from before the key existed are read."""

import json
import os
import subprocess
import sys

import pytest
from helpers import run_shuffle

from pileshuffle import names
from pileshuffle.loader import ShuffledDataset


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    """A shard output and a store over the same small TFRecord input."""
    from pileshuffle.commands import sample

    root = tmp_path_factory.mktemp("names")
    sample.write_tfrecord(str(root / "in"), records=600, files=2, record_bytes=60)
    pattern = str(root / "in" / "*.tfrecord")
    run_shuffle(pattern, str(root / "shards" / "t"), "--num_piles=3", "--quiet")
    run_shuffle(pattern, str(root / "store" / "t"), "--num_piles=3", "--layout=store", "--quiet")
    return pattern, str(root / "shards" / "t"), str(root / "store" / "t")


def _store_manifest(prefix):
    folder = names.store_dir(prefix)
    return os.path.join(
        folder, max(n for n in os.listdir(folder) if names.STORE_MANIFEST_NAME.match(n))
    )


def _rewrite(path, **changes):
    manifest = json.load(open(path))
    for key, value in changes.items():
        if value is None:
            manifest.pop(key, None)
        else:
            manifest[key] = value
    json.dump(manifest, open(path, "w"))


def _cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "pileshuffle", *args], capture_output=True, text=True, timeout=300
    )


def test_every_manifest_names_its_kind_and_format_version(outputs):
    _, shards, store = outputs
    shard_manifest = json.load(open(names.manifest_path(shards)))
    store_manifest = json.load(open(_store_manifest(store)))
    assert (shard_manifest["kind"], shard_manifest["format_version"]) == (
        names.SHARDS_KIND,
        names.FORMAT_VERSION,
    )
    assert (store_manifest["kind"], store_manifest["format_version"]) == (
        names.STORE_KIND,
        names.FORMAT_VERSION,
    )
    assert store_manifest["store_format"] == 1  # kept for older readers


@pytest.mark.parametrize("version", ["1.9", None])
def test_a_newer_minor_and_a_manifest_without_the_key_are_read(outputs, tmp_path, version):
    import shutil

    _, shards, store = outputs
    copy = tmp_path / "copy"
    shutil.copytree(os.path.dirname(shards), copy / "shards")
    shutil.copytree(os.path.dirname(store), copy / "store")
    _rewrite(
        str(copy / "shards" / "t-manifest.json"),
        format_version=version,
        kind=None if version is None else names.SHARDS_KIND,
    )
    _rewrite(_store_manifest(str(copy / "store" / "t")), format_version=version)
    for prefix in (copy / "shards" / "t", copy / "store" / "t"):
        assert sum(1 for _ in ShuffledDataset(str(prefix), seed=1)) == 600
        done = _cli("verify", "--output", str(prefix))
        assert done.returncode == 0, done.stderr


def test_a_newer_major_is_refused_by_every_reader_naming_the_file(outputs, tmp_path):
    import shutil

    pattern, shards, store = outputs
    copy = tmp_path / "copy"
    shutil.copytree(os.path.dirname(shards), copy / "shards")
    shutil.copytree(os.path.dirname(store), copy / "store")
    shard_manifest = str(copy / "shards" / "t-manifest.json")
    store_manifest = _store_manifest(str(copy / "store" / "t"))
    _rewrite(shard_manifest, format_version="2.0")
    _rewrite(store_manifest, format_version="2.0")
    for prefix, manifest in (
        (copy / "shards" / "t", shard_manifest),
        (copy / "store" / "t", store_manifest),
    ):
        with pytest.raises(Exception) as refused:
            ShuffledDataset(str(prefix), seed=1)
        assert manifest in str(refused.value) and "newer pileshuffle" in str(refused.value)
        done = _cli("verify", "--output", str(prefix))
        assert (
            done.returncode != 0 and manifest in done.stderr and "newer pileshuffle" in done.stderr
        ), done.stderr
        assert "Traceback" not in done.stderr
    before = sorted(os.listdir(names.store_dir(str(copy / "store" / "t"))))
    done = _cli(
        "append",
        "--store",
        str(copy / "store" / "t"),
        "--input",
        pattern,
        "--allow_duplicate_inputs",
    )
    assert (
        done.returncode != 0
        and store_manifest in done.stderr
        and "newer pileshuffle" in done.stderr
    ), done.stderr
    assert sorted(os.listdir(names.store_dir(str(copy / "store" / "t")))) == before
