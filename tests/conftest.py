"""Fixtures and pytest hooks only; plain helpers live in helpers.py (tests import them from there)."""

import os
import subprocess

# The suite runs Beam (and with it gRPC) in this process and then starts commands with
# subprocess.Popen. With gRPC's fork support on, the forked child restarts gRPC's poller before
# exec, finds the epoll fd closed by close_fds and aborts (SIGABRT, "epoll_wait error: Bad file
# descriptor": grpc/grpc#43055): seen twice in three full runs as a command that "finished"
# with -6 before it started. Set before anything imports grpc.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

# The commands the tests start import the pileshuffle under test: this checkout's, first on their
# path. Without it a command started in another folder imports the one the venv's editable
# install names, which for a second worktree of the repository is another checkout.
_CHECKOUT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.environ["PYTHONPATH"] = os.pathsep.join(
    [_CHECKOUT, *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]]
)

import pytest  # noqa: E402
from hypothesis import settings  # noqa: E402

from pileshuffle.commands import sample  # noqa: E402

# A missing test dependency stops the run; a skip not on the allow-list fails (tests/suite_rules.py).
pytest_plugins = ["suite_rules"]

# Hypothesis: the same examples on every run (derandomized, no database), no per-example deadline
# (a wall-clock limit on a shared machine). HYPOTHESIS_PROFILE=explore draws new examples each run.
settings.register_profile("ci", derandomize=True, database=None, deadline=None)
settings.register_profile("explore", deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture
def tfrecord_input(tmp_path):
    directory = tmp_path / "in"
    sample.write_tfrecord(str(directory), records=3000, files=3, record_bytes=120, vary=True)
    return str(directory / "*.tfrecord")


@pytest.fixture
def jsonl_input(tmp_path):
    directory = tmp_path / "in"
    sample.write_jsonl(str(directory), records=3000, files=3, record_bytes=80)
    return str(directory / "*.jsonl")


@pytest.fixture
def parquet_input(tmp_path):
    directory = tmp_path / "in"
    sample.write_parquet(str(directory), records=3000, files=3, record_bytes=80, row_group_rows=500)
    return str(directory / "*.parquet")


@pytest.fixture(autouse=True)
def _quiet_beam(caplog):
    import logging

    logging.getLogger("apache_beam").setLevel(logging.ERROR)
    yield


@pytest.fixture
def small_tmpfs(tmp_path):
    directory = tmp_path / "small"
    os.makedirs(directory)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(directory)],
        capture_output=True,
        text=True,
    )
    # as root a refusal is a failure; otherwise the injected ENOSPC tests cover this
    if done.returncode != 0:
        refused = pytest.fail if os.geteuid() == 0 else pytest.skip
        refused(f"mounting a tmpfs needs root and failed: {done.stderr.strip()}")
    yield str(directory)
    subprocess.run(["umount", "-l", str(directory)], capture_output=True)


# -- Cloud Storage ---------------------------------------------------------------------------------
# The gs:// tests run against an in-process gcp-storage-emulator, or against a real bucket when
# PILESHUFFLE_TEST_BUCKET names one (gs://bucket/prefix; your Application Default Credentials).
REAL_BUCKET_VARIABLE = "PILESHUFFLE_TEST_BUCKET"
EMULATED_BUCKET = "pileshuffle-test"


@pytest.fixture(scope="session")
def gcs_root():
    """``gs://bucket[/prefix]`` every gs:// test writes under; with the emulator,
    STORAGE_EMULATOR_HOST names it for this process and the commands it starts."""
    real = os.environ.get(REAL_BUCKET_VARIABLE)
    if real:
        yield real.rstrip("/")
        return
    import gcs_emulator

    process, endpoint = gcs_emulator.start(EMULATED_BUCKET)
    patch = pytest.MonkeyPatch()
    patch.setenv("STORAGE_EMULATOR_HOST", endpoint)
    yield f"gs://{EMULATED_BUCKET}"
    patch.undo()
    process.kill()
    process.wait()


@pytest.fixture
def gcs(gcs_root, request):
    """A fresh ``gs://`` folder for one test (its objects are left for the emulator to forget)."""
    import re
    import uuid

    # no [ ]: Beam takes them as wildcards
    name = re.sub(r"[^A-Za-z0-9_-]+", "-", request.node.name)[:40]
    return f"{gcs_root}/{name}-{uuid.uuid4().hex[:8]}"
