"""The template pipeline under Beam's PortableRunner, against Beam's own Python job service and
an external SDK worker pool: the Job API and the worker protocol that Flink, Spark and Dataflow
Runner v2 use, each job's SDK harness a process of its own that the pool starts. ``pileshuffle
run`` (the command line, as a subprocess) writes the local runner's bytes for the same seed, in
both intermediate modes. (Flink's and Spark's job-server jars cannot be fetched here.)"""

import os
import signal
import socket
import subprocess
import sys
import time
import types

import pytest
from helpers import free_port, manifest, run_shuffle, shard_bytes, shards

from pileshuffle.commands import sample

READY_SECONDS = 120  # Beam's import alone takes seconds on a busy 2-core machine
STARTED_WORKER = "Starting worker with command"  # the pool's log line for each SDK harness


def service_env():
    """The venv first on PATH (the pool starts each SDK harness as ``python``, which must import
    pileshuffle), and gRPC's fork support off as in conftest.py."""
    path = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
    return {**os.environ, "PATH": path, "GRPC_ENABLE_FORK_SUPPORT": "false"}


def start_service(args, log_path):
    """``python -m *args`` in a process group of its own, its output in ``log_path``."""
    with open(log_path, "wb") as log:
        return subprocess.Popen(
            [sys.executable, "-m", *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=service_env(),
            cwd=os.path.dirname(log_path),
            start_new_session=True,
        )


def wait_for_port(process, port, log_path):
    """Return once ``port`` accepts connections; fail with the service's log if it exits or
    does not answer within ``READY_SECONDS``."""
    deadline = time.monotonic() + READY_SECONDS
    while time.monotonic() < deadline and process.poll() is None:
        try:
            socket.create_connection(("localhost", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.2)
    with open(log_path, errors="replace") as log:
        told = log.read()[-3000:]
    pytest.fail(f"{' '.join(process.args)} did not answer on port {port}:\n{told}")


def group_members(pgid) -> list:
    """The live (not zombie) processes of process group ``pgid``."""
    members = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(pid))
    return members


def stop_group(process):
    """SIGTERM the service's process group (it and any SDK harness it started), SIGKILL what is
    left after a grace period, reap the service; no process of the group may outlive it."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, sig)
            process.wait(timeout=15)
            break
        except ProcessLookupError:
            break
        except subprocess.TimeoutExpired:
            continue
    process.wait(timeout=30)
    deadline = time.monotonic() + 10
    while group_members(process.pid) and time.monotonic() < deadline:
        os.killpg(process.pid, signal.SIGKILL)
        time.sleep(0.1)
    assert not group_members(process.pid), f"processes of {process.args} outlived it"


@pytest.fixture(scope="module")
def portable(tmp_path_factory):
    """Beam's job service and an external SDK worker pool on free ports, stopped (both process
    groups killed and reaped) after the module's tests."""
    root = tmp_path_factory.mktemp("portable-services")
    job_port, pool_port = free_port(), free_port()
    while pool_port == job_port:
        pool_port = free_port()
    job_log, pool_log = str(root / "job-service.log"), str(root / "worker-pool.log")
    (root / "staging").mkdir()
    job_service = [
        "apache_beam.runners.portability.local_job_service_main",
        f"--port={job_port}",
        f"--staging_dir={root / 'staging'}",
    ]
    worker_pool = ["apache_beam.runners.worker.worker_pool_main", f"--service_port={pool_port}"]
    services = [(start_service(job_service, job_log), job_port, job_log)]
    try:
        services.append((start_service(worker_pool, pool_log), pool_port, pool_log))
        for process, port, log in services:
            wait_for_port(process, port, log)
        yield types.SimpleNamespace(
            pool_log=pool_log,
            args=[
                "--runner=PortableRunner",
                f"--job_endpoint=localhost:{job_port}",
                "--environment_type=EXTERNAL",
                f"--environment_config=localhost:{pool_port}",
            ],
        )
    finally:
        for process, _, _ in services:
            stop_group(process)


def workers_started(portable) -> int:
    """How many SDK harness processes the pool has started."""
    with open(portable.pool_log, errors="replace") as log:
        return log.read().count(STARTED_WORKER)


def comparable(found):
    """A manifest without what differs between two runs of one shuffle into two places: the
    output's name, timings, and where the runs between the passes were kept (the local runner
    keeps files mode's runs in memory; SDK harness processes write them as files)."""
    found = dict(found)
    for key in ("output", "seconds", "wall_seconds", "between_passes"):
        found.pop(key, None)
    found["shards"] = [{**s, "path": os.path.basename(s["path"])} for s in found["shards"]]
    return found


def portable_run(portable, pattern, output, args, cwd):
    """``pileshuffle run`` on the portable runner, as a subprocess; returns its stdout."""
    command = [
        os.path.join(os.path.dirname(sys.executable), "pileshuffle"),
        "run",
        f"--input={pattern}",
        f"--output={output}",
        *args,
        *portable.args,
    ]
    done = subprocess.run(
        command, cwd=cwd, env=service_env(), capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


# name: (format, records, intermediate, piles, max_pile_bytes); 16KiB splits files mode's piles
CASES = {
    "tfrecord-files": ("tfrecord", 3000, "files", 4, "16KiB"),
    "tfrecord-shuffle": ("tfrecord", 3000, "shuffle", 4, "64MiB"),
    "parquet-files": ("parquet", 2000, "files", 3, "64MiB"),
}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """``{format: glob}`` of three generated files of each format."""
    root = tmp_path_factory.mktemp("portable-in")
    sample.write_tfrecord(
        str(root / "tfrecord"), records=3000, files=3, record_bytes=100, vary=True
    )
    sample.write_parquet(
        str(root / "parquet"), records=2000, files=3, record_bytes=80, row_group_rows=300
    )
    return {fmt: str(root / fmt / f"*.{fmt}") for fmt in ("tfrecord", "parquet")}


@pytest.mark.parametrize("case", list(CASES))
def test_portable_runner_writes_the_local_runners_bytes(tmp_path, portable, inputs, case):
    fmt, records, mode, piles, max_pile_bytes = CASES[case]
    local_out, portable_out = str(tmp_path / "local" / "out"), str(tmp_path / "portable" / "out")
    temp = tmp_path / "tmp"  # one machine: the SDK harness processes see the same path
    args = [
        f"--format={fmt}",
        f"--num_piles={piles}",
        "--seed=11",
        f"--intermediate={mode}",
        f"--max_pile_bytes={max_pile_bytes}",
        f"--temp_location={temp}",
    ]
    run_shuffle(inputs[fmt], local_out, *args)
    before = workers_started(portable)
    stdout = portable_run(portable, inputs[fmt], portable_out, args, cwd=str(tmp_path))
    assert workers_started(portable) == before + 1  # the job ran in an SDK harness of the pool's
    assert f"records   {records:,}" in stdout
    assert len(shards(portable_out)) == piles
    assert shard_bytes(portable_out) == shard_bytes(local_out)
    local, remote = manifest(local_out), manifest(portable_out)
    assert comparable(remote) == comparable(local)
    fingerprint = remote["output_fingerprint"]
    assert fingerprint == local["output_fingerprint"] == local["input_fingerprint"]
    assert fingerprint["records"] == records
    assert remote["piles_split"] == (piles if max_pile_bytes == "16KiB" else 0)
    between = remote["between_passes"]
    if mode == "files":  # pass 1's runs reached pass 2 as files under --temp_location, now removed
        assert between["written_bytes"] > 0 and between["shuffled_bytes"] == 0
        assert not [n for n in os.listdir(temp) if n.startswith(".pileshuffle-")]
    else:
        assert between == local["between_passes"] and between["shuffled_bytes"] > 0
    assert sorted(os.listdir(tmp_path / "portable")) == sorted(os.listdir(tmp_path / "local"))
