"""The template pipeline on Beam's DaskRunner, against a real distributed.LocalCluster of
2 worker processes: same bytes as the local runner for the same seed, in both
intermediate modes; and ShuffleToPiles refuses Dask (it would lose records there)."""

import collections
import os
import subprocess
import sys

import apache_beam as beam
import distributed
import pytest
from helpers import manifest, read_tfrecord_payloads, run_shuffle, shard_bytes, shards

from pileshuffle import ShuffleToPiles
from pileshuffle.commands import sample


@pytest.fixture(scope="module")
def dask_scratch(tmp_path_factory):
    """Keep Dask's scratch (worker dirs, spill, locks) out of the cwd, for the cluster and
    for any subprocess started by the tests."""
    scratch = str(tmp_path_factory.mktemp("dask-scratch"))
    previous = os.environ.get("DASK_TEMPORARY_DIRECTORY")
    os.environ["DASK_TEMPORARY_DIRECTORY"] = scratch
    yield scratch
    if previous is None:
        os.environ.pop("DASK_TEMPORARY_DIRECTORY", None)
    else:
        os.environ["DASK_TEMPORARY_DIRECTORY"] = previous


@pytest.fixture(scope="module")
def cluster(dask_scratch):
    import dask

    with dask.config.set({"temporary-directory": dask_scratch}):
        local = distributed.LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            dashboard_address=":0",
            local_directory=dask_scratch,
            silence_logs=40,
        )
    try:
        yield local
    finally:
        local.close()


@pytest.fixture(scope="module")
def dask_input(tmp_path_factory):
    directory = tmp_path_factory.mktemp("dask") / "in"
    sample.write_tfrecord(str(directory), records=3000, files=4, record_bytes=100, vary=True)
    return str(directory / "*.tfrecord")


def dask_args(cluster):
    return ["--runner=DaskRunner", f"--dask_client_address={cluster.scheduler_address}"]


@pytest.mark.parametrize("mode, max_pile_bytes", [("files", "16KiB"), ("shuffle", "128MiB")])
def test_dask_shards_are_byte_identical_to_the_local_runner(
    tmp_path, cluster, dask_input, mode, max_pile_bytes
):
    """files mode with piles above --max_pile_bytes also takes the split-again path on Dask."""
    local_out, dask_out = str(tmp_path / "local" / "train"), str(tmp_path / "dask" / "train")
    args = [
        "--num_piles=6",
        "--seed=11",
        f"--intermediate={mode}",
        f"--max_pile_bytes={max_pile_bytes}",
        f"--temp_location={tmp_path / 'tmp'}",
    ]
    run_shuffle(dask_input, local_out, *args)
    client = distributed.Client(cluster.scheduler_address)
    try:
        with distributed.get_task_stream(client) as tasks:
            found = run_shuffle(dask_input, dask_out, *args, runner_args=dask_args(cluster))
    finally:
        client.close()
    assert found["totals"]["records"] == 3000
    assert len(shards(dask_out)) == 6
    assert shard_bytes(dask_out) == shard_bytes(local_out)
    local_manifest, dask_manifest = manifest(local_out), manifest(dask_out)
    assert (
        dask_manifest["output_fingerprint"]
        == local_manifest["output_fingerprint"]
        == local_manifest["input_fingerprint"]
    )
    assert [s["records"] for s in dask_manifest["shards"]] == [
        s["records"] for s in local_manifest["shards"]
    ]
    assert [i["records"] for i in dask_manifest["inputs"]] == [
        750
    ] * 4  # every source's stats arrived
    assert (
        dask_manifest["piles_split"]
        == local_manifest["piles_split"]
        == (6 if max_pile_bytes == "16KiB" else 0)
    )
    # the work was spread over both worker processes (one partition per input file by default)
    assert len({t["worker"] for t in tasks.data}) == 2
    payloads = read_tfrecord_payloads(shards(dask_out))
    assert sorted(sample.index_of(p) for p in payloads) == list(range(3000))
    leftovers = [p for p in os.listdir(tmp_path / "dask") if not p.startswith("train-")]
    assert not leftovers
    if mode == "files":
        assert not [n for n in os.listdir(tmp_path / "tmp") if n.startswith(".pileshuffle-work")]


def test_cli_runs_on_a_dask_scheduler(tmp_path, cluster):
    """``pileshuffle run --runner=DaskRunner --dask_client_address=tcp://...``, Parquet this time."""
    sample.write_parquet(
        str(tmp_path / "in"), records=2000, files=3, record_bytes=80, row_group_rows=300
    )
    pattern = str(tmp_path / "in" / "*.parquet")
    local_out, dask_out = str(tmp_path / "local" / "p"), str(tmp_path / "dask" / "p")
    args = ["--format=parquet", "--num_piles=4", "--seed=5", "--dask_npartitions=3"]
    run_shuffle(pattern, local_out, *args)
    command = [
        os.path.join(os.path.dirname(sys.executable), "pileshuffle"),
        "run",
        f"--input={pattern}",
        f"--output={dask_out}",
        *args,
        *dask_args(cluster),
    ]
    done = subprocess.run(command, cwd=str(tmp_path), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "records   2,000" in done.stdout
    assert shard_bytes(dask_out) == shard_bytes(local_out)
    assert sorted(os.listdir(tmp_path)) == ["dask", "in", "local"]  # no Dask scratch in the cwd


def test_a_worker_error_reaches_the_caller_and_publishes_nothing(tmp_path, cluster, dask_input):
    import glob
    import shutil

    from pileshuffle.errors import PileshuffleError

    bad = tmp_path / "bad"
    bad.mkdir()
    for path in sorted(glob.glob(dask_input)):
        shutil.copy(path, bad)
    with open(bad / "part-002.tfrecord", "ab") as handle:
        handle.write(b"not a tfrecord frame at all")
    output = str(tmp_path / "out" / "train")
    with pytest.raises(PileshuffleError, match="part-002.tfrecord"):
        run_shuffle(
            str(bad / "*.tfrecord"), output, "--num_piles=3", runner_args=dask_args(cluster)
        )
    assert not os.path.exists(f"{output}-manifest.json") and not shards(output)


def test_shuffle_to_piles_refuses_the_dask_runner():
    """AssignPiles flushes its last batch from finish_bundle, whose outputs the DaskRunner
    drops: refuse when the pipeline is built, instead of losing records at run time."""
    from apache_beam.runners.dask.dask_runner import DaskRunner

    from pileshuffle.engine.transforms.shuffle import UnsupportedRunnerError

    pipeline = beam.Pipeline(runner=DaskRunner())
    records = pipeline | beam.Create([b"a", b"b", b"c"])
    with pytest.raises(UnsupportedRunnerError, match="DaskRunner"):
        records | ShuffleToPiles(num_piles=2, seed=1)


def test_dask_runner_names_resolve_without_a_cluster():
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.runners.dask.dask_runner import DaskRunner

    from pileshuffle.engine.runner import is_dask, is_local_runner, make_runner

    for name in ("DaskRunner", "apache_beam.runners.dask.dask_runner.DaskRunner"):
        options = PipelineOptions([f"--runner={name}"])
        assert is_dask(options) and not is_local_runner(options)
        assert isinstance(make_runner(options), DaskRunner)
    assert collections.Counter(
        is_dask(PipelineOptions([f"--runner={n}"])) for n in ("DirectRunner", "DataflowRunner")
    ) == {False: 2}


def test_a_balanced_run_on_dask_equals_the_local_one(tmp_path, cluster):
    import json

    lines = [json.dumps({"i": i, "animal": "cat" if i < 270 else "dog"}) + "\n" for i in range(300)]
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl").write_text("".join(lines[:150]))
    (tmp_path / "in" / "b.jsonl").write_text("".join(lines[150:]))
    args = ["--label_field=animal", "--balance=uniform", "--num_piles=3", "--seed=2"]
    local = run_shuffle(str(tmp_path / "in" / "*.jsonl"), str(tmp_path / "local" / "t"), *args)
    run_shuffle(
        str(tmp_path / "in" / "*.jsonl"),
        str(tmp_path / "dask" / "t"),
        *args,
        runner_args=dask_args(cluster),
    )
    assert shard_bytes(str(tmp_path / "dask" / "t")) == shard_bytes(str(tmp_path / "local" / "t"))
    assert local["balance"]["records_after"] == {"cat": 270, "dog": 270}


def test_a_dedup_run_on_dask_gives_the_local_bytes(tmp_path, cluster):
    """--dedup exact on Dask: the same distinct records, in the same bytes; a pile of one record
    repeated is split off and streamed on a worker as locally."""
    (tmp_path / "in").mkdir()
    for n in range(3):
        lines = [b'{"i": %d}\n' % (i % 900) for i in range(n * 700, (n + 1) * 700)] + [
            b'{"i": "hot"}\n'
        ] * 1500
        (tmp_path / "in" / f"p{n}.jsonl").write_bytes(b"".join(lines))
    pattern = str(tmp_path / "in" / "*.jsonl")
    args = [
        "--dedup=exact",
        "--num_piles=3",
        "--max_pile_bytes=16KiB",
        f"--temp_location={tmp_path / 'tmp'}",
    ]
    local = run_shuffle(pattern, str(tmp_path / "local" / "o"), *args)
    found = run_shuffle(
        pattern, str(tmp_path / "dask" / "o"), *args, runner_args=dask_args(cluster)
    )
    assert shard_bytes(str(tmp_path / "dask" / "o")) == shard_bytes(str(tmp_path / "local" / "o"))
    assert found["dedup"] == local["dedup"] and found["dedup"]["records_kept"] == 901
    assert found["dedup"]["largest_groups"][0]["copies"] == 4500


def test_a_dedup_store_on_dask_gives_the_local_files(tmp_path, cluster):
    """run --layout store --dedup and append on Dask: the same data and copies files as locally."""
    from test_store import file_digests
    from test_store_dedup import write_generation

    from pileshuffle.commands import append as append_command
    from pileshuffle.store import layout

    patterns = [write_generation(str(tmp_path / "in"), g) for g in (0, 1)]
    args = ["--dedup=exact", "--num_piles=3", "--seed=6"]
    for where, runner in (
        (str(tmp_path / "local"), []),
        (str(tmp_path / "dask"), dask_args(cluster)),
    ):
        run_shuffle(
            patterns[0],
            where,
            "--layout=store",
            *args,
            **({"runner_args": runner} if runner else {}),
        )
        append_command.append(
            [f"--store={where}", f"--input={patterns[1]}", *(runner or ["--runner=DirectRunner"])]
        )
    local, remote = file_digests(str(tmp_path / "local")), file_digests(str(tmp_path / "dask"))
    assert remote == local and any(name.endswith(".copies.arrows") for name in local)
    assert layout.read_store_manifest(str(tmp_path / "dask"))["totals"]["distinct"] == 1100
