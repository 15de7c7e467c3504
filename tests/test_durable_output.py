"""A local run's output is on disk before its manifest names it (``io/durable.py``).

At publication each staged shard is synced (``durable.settle``: ``fdatasync``), the shards are
renamed into place, their folder is synced, and the manifest (synced when staged) is renamed in and
the folder synced again: the commit. A store's generation files are synced, with their folder,
before the manifest version that lists them. Checked on real runs: the order of the syncs, renames
and links a run makes (the system calls recorded as they pass, then made), and a write error the
disk reports only at the sync.
"""

import errno
import os

import pytest
from helpers import assert_nothing_published, assert_verified, final_outputs, run_shuffle, shards


def _recorded(monkeypatch) -> list:
    """The syncs, renames and links this process makes from now on, as ``(kind, real path)`` in
    order (``data``: a file's ``fdatasync``, ``folder``: an ``fsync``, ``rename``/``link``: the
    destination), each call then made as it was asked."""
    events = []

    def recording(name, kind, path_of):
        real = getattr(os, name)

        def call(*args):
            events.append((kind, os.path.realpath(path_of(*args))))
            return real(*args)

        monkeypatch.setattr(os, name, call)

    def descriptor_path(descriptor):
        return f"/proc/self/fd/{descriptor}"

    recording("fdatasync", "data", descriptor_path)
    recording("fsync", "folder", descriptor_path)
    recording("replace", "rename", lambda source, destination: destination)
    recording("link", "link", lambda source, destination: destination)
    return events


def test_the_shards_are_synced_before_the_manifest_names_them(
    tmp_path, tfrecord_input, monkeypatch
):
    """The commit order: every shard's data synced, the shards renamed into place, their folder
    synced, then the manifest renamed in and the folder synced again."""
    output = str(tmp_path / "out" / "data")
    folder = os.path.realpath(os.path.dirname(output))
    events = _recorded(monkeypatch)
    manifest = run_shuffle(tfrecord_input, output, "--num_piles=3", "--seed=5")
    finals = [os.path.realpath(path) for path in shards(output)]
    manifest_file = os.path.realpath(f"{output}-manifest.json")
    assert manifest["shards"] and len(finals) == 3

    def at(event):
        return events.index(event)

    shard_renames = [at(("rename", path)) for path in finals]
    manifest_rename = at(("rename", manifest_file))
    folder_syncs = [i for i, event in enumerate(events) if event == ("folder", folder)]
    data_syncs = [i for i, (kind, _) in enumerate(events) if kind == "data"]
    # every shard and the staged manifest synced before any shard took its final name
    staged = [events[i][1] for i in data_syncs if i < min(shard_renames)]
    assert len([path for path in staged if "pileshuffle-staging/shard-" in path]) == len(finals)
    assert len([path for path in staged if "pileshuffle-staging/manifest-" in path]) == 1
    # the folder synced between the last shard's rename and the manifest's, and after it
    assert any(max(shard_renames) < i < manifest_rename for i in folder_syncs)
    assert any(i > manifest_rename for i in folder_syncs)


def test_a_write_error_the_disk_reports_at_the_sync_publishes_nothing(
    tmp_path, tfrecord_input, monkeypatch
):
    """A disk that accepted the writes but fails the sync (delayed allocation out of space, a
    network file system): the run says so, naming where it wrote, and publishes nothing."""
    output = str(tmp_path / "out" / "data")

    real_fdatasync = os.fdatasync

    def full_at_sync(descriptor):
        if "pileshuffle-staging/shard-" in os.path.realpath(f"/proc/self/fd/{descriptor}"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_fdatasync(descriptor)

    monkeypatch.setattr(os, "fdatasync", full_at_sync)
    with pytest.raises(Exception) as caught:
        run_shuffle(tfrecord_input, output, "--num_piles=3", "--seed=5")
    message = str(caught.value)
    assert message.startswith("cannot write to ") and "No space left on device" in message
    assert ".pileshuffle-staging" in message
    assert final_outputs(output) == []
    assert_nothing_published(output)


def test_a_store_generation_is_synced_before_its_manifest_version(
    tmp_path, tfrecord_input, monkeypatch
):
    """``run --layout store``: every data file of the generation synced, and its folder, before
    the version's manifest is linked in; the store's folder synced after."""
    output = str(tmp_path / "out" / "data")
    events = _recorded(monkeypatch)
    run_shuffle(tfrecord_input, output, "--layout=store", "--num_piles=3", "--seed=5")
    store = os.path.realpath(f"{output}-store")
    data_files = sorted(
        os.path.realpath(os.path.join(root, name))
        for root, _, names in os.walk(store)
        for name in names
        if name.endswith(".arrows")
    )
    assert len(data_files) >= 3
    versions = [i for i, (kind, path) in enumerate(events) if kind == "link" and "manifest" in path]
    published = versions[-1]  # the generation's version (the store's empty version 0 comes first)
    synced = {path for kind, path in events[:published] if kind == "data"}
    assert set(data_files) <= synced
    generation_folders = {os.path.dirname(path) for path in data_files}
    assert generation_folders <= {path for kind, path in events[:published] if kind == "folder"}
    assert ("folder", store) in events[published:]


def test_a_file_system_that_cannot_sync_a_folder_still_publishes(
    tmp_path, tfrecord_input, monkeypatch
):
    """Some FUSE and network file systems answer a folder's fsync with EINVAL: their names'
    durability is theirs; the run publishes as on any other disk."""

    def cannot(descriptor):
        raise OSError(errno.EINVAL, "Invalid argument")

    monkeypatch.setattr(os, "fsync", cannot)
    output = str(tmp_path / "out" / "data")
    manifest = run_shuffle(tfrecord_input, output, "--num_piles=3", "--seed=5")
    assert len(shards(output)) == 3 and len(manifest["shards"]) == 3
    assert os.path.exists(f"{output}-manifest.json")
    assert_verified(tfrecord_input, output)


def test_a_store_write_error_at_the_sync_publishes_no_version_and_the_rerun_does(
    tmp_path, tfrecord_input, monkeypatch
):
    """``run --layout store`` on a disk that fails the sync of a generation file: the run says
    "cannot write to" the store, no manifest version lists the generation, and the same command
    run again (the disk mended) publishes it and verifies."""
    from pileshuffle.store import layout
    from pileshuffle.store.read import check_store

    output = str(tmp_path / "out" / "data")
    real_fdatasync = os.fdatasync

    def full_at_sync(descriptor):
        if os.path.realpath(f"/proc/self/fd/{descriptor}").endswith(".arrows"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_fdatasync(descriptor)

    monkeypatch.setattr(os, "fdatasync", full_at_sync)
    args = ("--layout=store", "--num_piles=3", "--seed=5")
    with pytest.raises(Exception) as caught:
        run_shuffle(tfrecord_input, output, *args)
    message = str(caught.value)
    assert message.startswith(f"cannot write to {output}-store") and "No space left" in message
    assert layout.manifest_versions(output) in ([], [0])
    monkeypatch.setattr(os, "fdatasync", real_fdatasync)
    run_shuffle(tfrecord_input, output, *args)
    problems, manifest = check_store(output, input_glob=tfrecord_input)
    assert problems == [] and len(manifest["generations"]) == 1
