"""The same run on gs:// against a local Cloud Storage emulator (``gcp-storage-emulator``): a
finished run leaves nothing but its shards and manifest. A folder on an object store is the
objects under its prefix, which Beam's ``exists``/``delete`` of the bare name do not see: the
staging folder and its publication journals stayed behind after every run, and a stale journal
makes a later run take files it lists for its own."""

import socket

import pytest

from helpers import run_shuffle
from pileshuffle import sample

emulator = pytest.importorskip("gcp_storage_emulator.server")
BUCKET = "pileshuffle-test"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def bucket():
    """A bucket on an in-process emulator; every Cloud Storage client of this process goes there."""
    port = free_port()
    server = emulator.create_server("127.0.0.1", port, in_memory=True, default_bucket=BUCKET)
    server.start()
    patch = pytest.MonkeyPatch()
    patch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{port}")
    yield f"gs://{BUCKET}"
    patch.undo()
    server.stop()


def objects(prefix: str) -> list:
    from apache_beam.io.filesystems import FileSystems

    return sorted(m.path for m in FileSystems.match([f"{prefix}/**"])[0].metadata_list)


def test_a_finished_run_on_gcs_leaves_only_its_shards_and_manifest(bucket, tmp_path):
    sample.write_tfrecord(str(tmp_path / "in"), records=600, files=2, record_bytes=30)
    pattern, output = str(tmp_path / "in" / "*.tfrecord"), f"{bucket}/runs/t"
    run_shuffle(pattern, output, "--num_piles=3", "--seed=1")
    run_shuffle(pattern, output, "--num_piles=3", "--seed=2", "--overwrite")
    expected = [f"{output}-0000{i}-of-00003.tfrecord" for i in range(3)] + [f"{output}-manifest.json"]
    assert objects(f"{bucket}/runs") == expected
