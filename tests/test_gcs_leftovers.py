"""The same run on gs:// against a local Cloud Storage emulator (``gcp-storage-emulator``): a
finished run leaves nothing but its shards and manifest. A folder on an object store is the
objects under its prefix, which Beam's ``exists``/``delete`` of the bare name do not see: the
staging folder and its publication journals stayed behind after every run, and a stale journal
makes a later run take files it lists for its own."""

from helpers import run_shuffle

from pileshuffle.commands import sample


def objects(prefix: str) -> list:
    from apache_beam.io.filesystems import FileSystems

    return sorted(m.path for m in FileSystems.match([f"{prefix}/**"])[0].metadata_list)


def test_a_finished_run_on_gcs_leaves_only_its_shards_and_manifest(gcs, tmp_path):
    sample.write_tfrecord(str(tmp_path / "in"), records=600, files=2, record_bytes=30)
    pattern, output = str(tmp_path / "in" / "*.tfrecord"), f"{gcs}/runs/t"
    run_shuffle(pattern, output, "--num_piles=3", "--seed=1")
    run_shuffle(pattern, output, "--num_piles=3", "--seed=2", "--overwrite")
    expected = [f"{output}-0000{i}-of-00003.tfrecord" for i in range(3)] + [
        f"{output}-manifest.json"
    ]
    assert objects(f"{gcs}/runs") == expected
