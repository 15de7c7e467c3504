"""The Dataflow job a launch would submit, written for real: Beam's DataflowRunner with
``--template_location`` translates the graph, stages the pipeline on the Cloud Storage emulator and
writes the job's JSON instead of submitting it (no Google API is called). Checked: the workers'
image, the steps, the parameters the job carries, and that nothing is written at the output;
and what a launch that could not work is told, in one line, before anything is staged."""

import os
import subprocess
import sys

import pytest
from apache_beam.portability.api import beam_runner_api_pb2

from pileshuffle.commands import sample
from pileshuffle.io import storage

IMAGE = "us-central1-docker.pkg.dev/my-project/pileshuffle/pileshuffle:2026-11-27"
PROJECT = ["--project=my-project-123", "--region=us-central1"]


def launch(gcs, *args, image=IMAGE):
    """``pileshuffle run --runner DataflowRunner`` writing its job to ``{gcs}/job.json``."""
    locations = [
        f"--temp_location={gcs}/tmp",
        f"--staging_location={gcs}/staging",
        f"--template_location={gcs}/job.json",
    ]
    env = {k: v for k, v in os.environ.items() if k != "PILESHUFFLE_SDK_CONTAINER_IMAGE"}
    # unless ``args`` give theirs
    defaults = [
        f"--input={gcs}/in/*.jsonl",
        f"--output={gcs}/out/data",
        "--num_piles=8",
    ]
    defaults = [
        d for d in defaults if not any(a.startswith(d.split("=", 1)[0] + "=") for a in args)
    ]
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pileshuffle",
            "run",
            *defaults,
            "--format=jsonl",
            "--runner=DataflowRunner",
            *locations,
            *([f"--sdk_container_image={image}"] if image else []),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


def staged_pipeline(gcs) -> beam_runner_api_pb2.Pipeline:
    [path] = [f.path for f in storage.match(f"{gcs}/staging/*/pipeline.pb")]
    return beam_runner_api_pb2.Pipeline.FromString(storage.read_buffer(path).to_pybytes())


@pytest.mark.parametrize("intermediate", ["files", "shuffle"])
def test_the_job_runs_the_image_steps_and_parameters_it_was_launched_with(gcs, intermediate):
    sample.write_jsonl(f"{gcs}/in", records=300, files=3)
    done = launch(gcs, *PROJECT, f"--intermediate={intermediate}", "--run_bytes=32MiB", "--seed=9")
    assert done.returncode == 0 and "job submitted" in done.stderr, done.stderr  # not waited for
    job = storage.read_json(f"{gcs}/job.json")
    pool = job["environment"]["workerPools"][0]
    assert pool["workerHarnessContainerImage"] == IMAGE
    assert {c["containerImage"] for c in pool["sdkHarnessContainerImages"]} == {IMAGE}
    options = job["environment"]["sdkPipelineOptions"]["options"]
    assert {
        k: options[k]
        for k in ("input", "output", "format", "num_piles", "intermediate", "run_bytes", "seed")
    } == {
        "input": f"{gcs}/in/*.jsonl",
        "output": f"{gcs}/out/data",
        "format": "jsonl",
        "num_piles": "8",
        "intermediate": intermediate,
        "run_bytes": "32MiB",
        "seed": "9",
    }
    pipeline = staged_pipeline(gcs)
    names = [t.unique_name for t in pipeline.components.transforms.values()]
    for step in (
        "ListSourceGroups",
        "ReadSourceToPiles",
        "GroupIntoPiles/GroupByPile",
        "WritePiles/WriteShard",
        "WritePiles/Finalize",
    ):
        assert names.count(step) == 1, step
    # spread once
    assert [n for n in names if n.startswith("Spread") and "/" not in n] == ["SpreadSourceGroups"]
    assert {
        e.payload.decode(errors="replace").count(IMAGE)
        for e in pipeline.components.environments.values()
    } == {1}
    assert storage.match(f"{gcs}/out/*") == []  # a launch writes nothing at the output


def test_a_launch_without_an_image_for_the_workers_is_refused_before_anything_is_staged(gcs):
    sample.write_jsonl(f"{gcs}/in", records=50, files=1)
    done = launch(gcs, *PROJECT, image=None)
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert "--sdk_container_image" in done.stderr and "--setup_file" in done.stderr
    assert storage.match(f"{gcs}/staging/**") == [] and storage.match(f"{gcs}/job.json") == []
    # a package to install is enough
    staged = launch(gcs, *PROJECT, "--setup_file=./setup.py", image=None)
    assert staged.returncode == 0, staged.stderr


def test_options_the_runner_refuses_are_one_line(gcs):
    sample.write_jsonl(f"{gcs}/in", records=50, files=1)
    done = launch(gcs, "--project=p", "--region=us-central1")
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
    assert "the runner refused its options: Invalid Project ID (p)" in done.stderr


@pytest.mark.parametrize("where", ["input", "output"])
def test_a_local_input_or_output_on_dataflow_is_refused_naming_it(gcs, tmp_path, where):
    """Workers run elsewhere: a path on the launching machine is refused before anything is read."""
    sample.write_jsonl(f"{gcs}/in", records=50, files=1)
    sample.write_jsonl(str(tmp_path / "in"), records=50, files=1)
    local = {
        "input": f"--input={gcs}/in/*.jsonl,{tmp_path}/in/*.jsonl",
        "output": f"--output={tmp_path}/out/data",
    }
    done = launch(gcs, *PROJECT, local[where])
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
    assert f"--{where}: {tmp_path}" in done.stderr and "gs://" in done.stderr.splitlines()[-1]
    assert storage.match(f"{gcs}/staging/**") == [] and not (tmp_path / "out").exists()


def test_a_dedup_launch_carries_its_parameter_into_the_job(gcs):
    """--dedup_key as a template parameter: the job's options carry it, the graph is the run's own (no extra pass)."""
    sample.write_jsonl(f"{gcs}/in", records=300, files=3)
    done = launch(gcs, *PROJECT, "--dedup_key=index")
    assert done.returncode == 0 and "job submitted" in done.stderr, done.stderr
    options = storage.read_json(f"{gcs}/job.json")["environment"]["sdkPipelineOptions"]["options"]
    assert options["dedup_key"] == "index"
    names = [t.unique_name for t in staged_pipeline(gcs).components.transforms.values()]
    assert names.count("ReadSourceToPiles") == 1 and names.count("GroupIntoPiles/GroupByPile") == 1


def test_a_dedup_store_launch_marks_copies_in_the_job(gcs):
    """run --layout store --dedup on Dataflow: the job writes the generation, marks each pile's copies
    (MarkEarlierCopies reads the base manifest on the workers: the graph carries no file list)."""
    sample.write_jsonl(f"{gcs}/in", records=300, files=3)
    done = launch(gcs, *PROJECT, "--layout=store", "--dedup=exact", f"--output={gcs}/st/data")
    assert done.returncode == 0, done.stderr
    names = [t.unique_name for t in staged_pipeline(gcs).components.transforms.values()]
    assert names.count("WriteStoreGroup") == 1 and names.count("MarkEarlierCopies") == 1, names
    assert names.count("PublishGeneration") == 1
