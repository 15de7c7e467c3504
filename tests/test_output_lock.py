"""An output stays locked for its job's life, not its launcher's (issue 36).

A Dataflow launch returns as soon as the job is submitted; the job then runs for hours. The
launch hands the output's lock to the job (``locations.taken_output(job=...)``): the lock names
the job and stays, a second launch or a scheduler's retry is refused in one line (and told how to
take over a dead job's output) instead of removing the running job's work folder, and the job's
last step releases it after publishing. Checked with the real pieces: the lock as a launch leaves
it, the real CLI refused on a local folder and on gs:// (the emulator), and the real pipeline
(DirectRunner) releasing the lock it was handed.
"""

import json
import os
import subprocess
import sys
import time

import pytest
from helpers import manifest, shards

from pileshuffle.commands import sample
from pileshuffle.commands.run import pipeline_options
from pileshuffle.engine.runner import new_pipeline
from pileshuffle.engine.transforms.graph import build
from pileshuffle.io import storage
from pileshuffle.planning.locations import taken_output
from pileshuffle.planning.plan import make_plan
from pileshuffle.planning.runners import local_defaults

JOB = "pileshuffle-20261127-120000-abc123"


def launched(output: str, work_dir: str):
    """What a Dataflow launch leaves: the output's lock handed to its job, and the job's work
    folder with something in it (the job is running). Returns the lock's token."""
    with taken_output(
        output, False, work_dir, "pileshuffle run --runner DataflowRunner", job=JOB
    ) as token:
        storage.write_whole(
            storage.join(work_dir, "fragments", "s000000-r00000.run"), b"a running job's run"
        )
    return token


def cli(*args, env=None):
    return subprocess.run(
        [sys.executable, "-m", "pileshuffle", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
    )


@pytest.mark.parametrize("where", ["local", "gs"])
def test_a_launch_on_an_output_whose_job_runs_is_refused_and_its_work_is_kept(
    tmp_path, where, request
):
    root = request.getfixturevalue("gcs") if where == "gs" else str(tmp_path)
    sample.write_jsonl(f"{root}/in", records=200, files=2)
    output = f"{root}/out/data"
    work_dir = make_plan(
        pipeline_options([f"--input={root}/in/*.jsonl", f"--output={output}"])
    ).work_dir
    launched(output, work_dir)
    lock = f"{output}.pileshuffle-lock"
    holder = storage.read_json(lock)
    assert holder["job"] == JOB and holder["command"] == "pileshuffle run --runner DataflowRunner"
    done = cli(
        "run", f"--input={root}/in/*.jsonl", f"--output={output}", "--num_piles=2", "--quiet"
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert f"output {output} is locked by Dataflow job {JOB}" in line
    assert "which may still be running" in line and f"delete {lock} to take the output over" in line
    # the job's work is untouched
    assert storage.exists(storage.join(work_dir, "fragments", "s000000-r00000.run"))
    assert (
        storage.exists(lock) and shards(output) == [] if where == "local" else storage.exists(lock)
    )
    storage.delete([lock])  # the job has ended: the output is taken over as the message says
    again = cli(
        "run", f"--input={root}/in/*.jsonl", f"--output={output}", "--num_piles=2", "--quiet"
    )
    assert again.returncode == 0, again.stderr
    assert not storage.exists(lock) and storage.match(f"{work_dir}/**") == []


def test_the_job_releases_the_lock_it_was_handed_once_it_has_published(tmp_path):
    """The real graph on the local runner, given the token a launch handed over: Finalize
    publishes, removes its work, then releases the lock; a lock of another holder is left alone."""
    sample.write_jsonl(str(tmp_path / "in"), records=300, files=2)
    output = str(tmp_path / "out" / "data")
    options = local_defaults(
        pipeline_options([f"--input={tmp_path}/in/*.jsonl", f"--output={output}", "--num_piles=3"])
    )
    plan = make_plan(options)
    lock = f"{output}.pileshuffle-lock"
    for token, released in (("another holder's token", False), (None, True)):
        token = token or launched(output, plan.work_dir)
        if not released:
            launched(output, plan.work_dir)
            os.remove(os.path.join(plan.work_dir, "fragments", "s000000-r00000.run"))
        pipeline = new_pipeline(options, len(plan.source_groups))
        build(pipeline, plan, time.time(), token)
        pipeline.run().wait_until_finish()
        assert manifest(output)["totals"]["records"] == 300
        assert os.path.exists(lock) != released, token
        if not released:
            assert json.load(open(lock))["job"] == JOB
            os.remove(lock)
            for path in shards(output) + [f"{output}-manifest.json"]:
                os.remove(path)


def test_a_failed_launch_leaves_no_lock(tmp_path):
    """A launch that fails before its job is submitted (here: the submission raises) releases
    the lock it would have handed over: the next launch is not refused."""
    output = str(tmp_path / "out" / "data")
    with pytest.raises(RuntimeError):
        with taken_output(output, False, str(tmp_path / "work"), "pileshuffle run", job=JOB):
            raise RuntimeError("the Dataflow API refused the job")
    assert not os.path.exists(f"{output}.pileshuffle-lock")
    launched(output, str(tmp_path / "work"))
    assert os.path.exists(f"{output}.pileshuffle-lock")


def test_a_template_build_and_a_waited_run_hand_nothing_over():
    """Only a job left running holds the lock: not a template build (no job runs), not a
    local or Dask run, and not a Dataflow run this process waits for."""
    from pileshuffle.engine.runner import outliving_job

    base = [
        "--input=gs://b/in/*",
        "--output=gs://b/out/o",
        "--runner=DataflowRunner",
        "--project=p-123",
        "--region=us-central1",
        "--temp_location=gs://b/tmp",
        "--job_name=my-job",
    ]
    assert outliving_job(pipeline_options(base)) == "my-job"
    assert outliving_job(pipeline_options(base + ["--template_location=gs://b/t.json"])) is None
    assert outliving_job(pipeline_options(base), wait=True) is None
    assert outliving_job(pipeline_options(["--input=a", "--output=b"])) is None
