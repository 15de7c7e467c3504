"""`pip install pileshuffle` is the reader alone (issue 20): the checkout, installed without
extras into a fresh venv, has no Apache Beam, reads a real run's output, splits it across
ranks and resumes exactly; the pipeline's commands there say in one line what to install.

Needs a package index for pyarrow, numpy, google-crc32c and the build's setuptools (pip's
cache serves what it holds); without one the test is skipped, saying so (an allowed skip:
tests/suite_rules.py)."""

import glob
import json
import os
import shutil
import subprocess
import sys

import pytest
from helpers import read_tfrecord_payloads, sample_run

# 900 records split evenly over 3 ranks, so that the ranks' shares are the whole epoch
# (remainder="drop" would leave N % world_size records to nobody).
RECORDS, WORLD_SIZE = 900, 3
RESUME_AFTER = 111  # records rank 1 reads before its state is saved: mid-pile, mid-share

# The files `pip install` needs from the checkout (what templates/Dockerfile copies too).
PACKAGE_FILES = ("setup.py", "README.md", "pileshuffle")
CHECKOUT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
INSTALL_SECONDS = 600  # a cold cache downloads pyarrow (~40 MB); warm, the install takes ~8 s
# the venv's fixture (a look at the index and an install, each up to INSTALL_SECONDS) is timed with
# the first test: pytest.ini's per-test limit would end a slow download, not a hang
pytestmark = pytest.mark.timeout(2 * INSTALL_SECONDS + 300)

MISSING_BEAM = 'pileshuffle run: needs Apache Beam, which this install lacks: pip install "pileshuffle[pipeline]"'

READ = """
import json, sys
import pileshuffle.loader
from pileshuffle.loader import ShuffledDataset

prefix, world_size, resume_after = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
whole = list(ShuffledDataset(prefix, seed=3, epoch=1))
shares = [list(ShuffledDataset(prefix, seed=3, epoch=1, rank=r, world_size=world_size)) for r in range(world_size)]

stopped = ShuffledDataset(prefix, seed=3, epoch=1, rank=1, world_size=world_size)
records = iter(stopped)
head = [next(records) for _ in range(resume_after)]
state = json.loads(json.dumps(stopped.state_dict()))  # as a job saves it
resumed = ShuffledDataset(prefix, seed=3, rank=1, world_size=world_size)  # the state says epoch 1
resumed.load_state_dict(state)
tail = list(resumed)

hexed = lambda rs: [r.hex() for r in rs]
print(json.dumps({
    "loader": pileshuffle.loader.__file__,
    "beam_imported": "apache_beam" in sys.modules,
    "whole": hexed(whole), "shares": [hexed(s) for s in shares], "head": hexed(head), "tail": hexed(tail),
}))
"""


def fresh_env() -> dict:
    """This process's environment without what would let the venv see the checkout's code."""
    return {
        k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")
    }


def copy_package(destination):
    """The files the install needs, without the checkout's .venv, build dirs and caches."""
    os.makedirs(destination)
    for name in PACKAGE_FILES:
        source = os.path.join(CHECKOUT, name)
        if os.path.isdir(source):
            shutil.copytree(
                source,
                os.path.join(destination, name),
                ignore=shutil.ignore_patterns("__pycache__"),
            )
        else:
            shutil.copy(source, destination)


def index_reachable(python) -> bool:
    """Can pip find a reader dependency at all (on an index, or in pip's cache of one)?"""
    looked = subprocess.run(
        [python, "-m", "pip", "index", "versions", "numpy"],
        capture_output=True,
        text=True,
        env=fresh_env(),
        timeout=INSTALL_SECONDS,
    )
    return looked.returncode == 0


@pytest.fixture(scope="module")
def reader_venv(tmp_path_factory):
    """``bin/`` of a fresh venv (no system site packages) holding ``pip install <checkout>``."""
    root = tmp_path_factory.mktemp("reader-install")
    copy_package(str(root / "src"))
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, env=fresh_env())
    python = str(venv / "bin" / "python")
    done = subprocess.run(
        [python, "-m", "pip", "install", "--quiet", str(root / "src")],
        capture_output=True,
        text=True,
        cwd=root,
        env=fresh_env(),
        timeout=INSTALL_SECONDS,
    )
    if done.returncode != 0:
        if not index_reachable(python):
            said = [line.strip() for line in done.stderr.splitlines() if "ERROR" in line][:1]
            pytest.skip(
                f"no package index reachable (and nothing cached) for the reader's dependencies: {said}"
            )
        pytest.fail(f"pip install of the checkout failed:\n{done.stdout}\n{done.stderr}")
    return venv / "bin"


@pytest.fixture(scope="module")
def shuffled_tfrecords(tmp_path_factory):
    """``(input pattern, output prefix)`` of a real run made by this (the full) venv."""
    return sample_run(
        tmp_path_factory,
        "tfrecord",
        "--num_piles=4",
        "--seed=5",
        records=RECORDS,
        files=3,
        record_bytes=60,
        vary=True,
    )


def in_venv(bin_dir, *argv):
    """Run ``argv[0]`` from the venv, away from the checkout (the cwd would shadow the install)."""
    return subprocess.run(
        [str(bin_dir / argv[0]), *argv[1:]],
        capture_output=True,
        text=True,
        cwd=bin_dir.parent,
        env=fresh_env(),
        timeout=300,
    )


def test_the_reader_install_has_no_beam(reader_venv):
    done = in_venv(reader_venv, "python", "-c", "import apache_beam")
    assert done.returncode != 0 and "No module named 'apache_beam'" in done.stderr
    listed = in_venv(reader_venv, "python", "-m", "pip", "list", "--format=json")
    installed = {p["name"].lower() for p in json.loads(listed.stdout)}
    assert {"pileshuffle", "pyarrow", "numpy", "google-crc32c"} <= installed
    assert not installed & {"apache-beam", "tqdm", "torch", "tensorflow-cpu"}


def test_the_reader_install_reads_splits_and_resumes(reader_venv, shuffled_tfrecords):
    pattern, prefix = shuffled_tfrecords
    done = in_venv(reader_venv, "python", "-c", READ, prefix, str(WORLD_SIZE), str(RESUME_AFTER))
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert got["loader"].startswith(str(reader_venv.parent)) and not got["beam_imported"]

    whole = [bytes.fromhex(r) for r in got["whole"]]
    written = read_tfrecord_payloads(sorted(glob.glob(pattern)))  # the input, by Beam's own codec
    assert len(whole) == RECORDS and sorted(whole) == sorted(written)
    shares = got["shares"]
    assert [len(s) for s in shares] == [RECORDS // WORLD_SIZE] * WORLD_SIZE
    # disjoint contiguous shares that make up the epoch, in order
    assert sum(shares, []) == got["whole"]
    assert got["head"] + got["tail"] == shares[1]  # resumed exactly where the state stopped


def test_pipeline_commands_say_in_one_line_what_to_install(reader_venv, tmp_path):
    output = tmp_path / "out" / "data"
    done = in_venv(
        reader_venv, "pileshuffle", "run", f"--input={tmp_path}/*.tfrecord", f"--output={output}"
    )
    assert (done.returncode, done.stderr, done.stdout) == (2, MISSING_BEAM + "\n", "")
    assert not os.path.exists(output.parent)
    # the list of commands needs nothing more
    helped = in_venv(reader_venv, "pileshuffle", "--help")
    assert helped.returncode == 0 and "run" in helped.stdout


def test_the_reader_install_checks_an_output_with_info_and_verify(reader_venv, shuffled_tfrecords):
    """The read-side commands need no Beam: a training machine with the reader alone can say
    what an output holds and prove it against its input (and each starts in a fraction of a
    second: Beam's import was about 1 s of each)."""
    pattern, prefix = shuffled_tfrecords
    told = in_venv(reader_venv, "pileshuffle", "info", f"--output={prefix}", "--json")
    assert told.returncode == 0, told.stderr
    assert json.loads(told.stdout)["records"].startswith(f"{RECORDS:,} in 4 shard(s)")
    proved = in_venv(
        reader_venv, "pileshuffle", "verify", f"--input={pattern}", f"--output={prefix}"
    )
    assert proved.returncode == 0, proved.stderr
    assert f"OK: {RECORDS:,} records in 4 shard(s)" in proved.stdout + proved.stderr
