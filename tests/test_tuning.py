"""Process tuning: what the command line sets up before Beam is imported."""

import os
import subprocess
import sys


def run_python(code: str, env=None, argv=()) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=120, env=env
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_freed_memory_is_kept_and_arrow_allocates_from_its_jemalloc():
    out = run_python(
        "import os; from pileshuffle.engine.tuning import keep_freed_memory; keep_freed_memory(); keep_freed_memory();"
        "import pyarrow as pa;"
        "print(pa.default_memory_pool().backend_name, os.environ['MALLOC_ARENA_MAX'], os.environ['ARROW_DEFAULT_MEMORY_POOL'],"
        " os.environ['JE_ARROW_MALLOC_CONF'], os.environ['MALLOC_MMAP_THRESHOLD_'], os.environ['OPENBLAS_NUM_THREADS'],"
        " [open(f'/proc/self/task/{t}/comm').read().strip() for t in os.listdir('/proc/self/task')].count('python'))"
    )
    # one Python thread: no idle OpenBLAS workers
    assert (
        out == f"jemalloc 1 jemalloc narenas:1,dirty_decay_ms:-1,muzzy_decay_ms:-1 {32 << 20} 1 1"
    )


# Page faults of 10 cycles of allocating, touching and freeing a 64 MiB Arrow buffer.
_CYCLES = (
    "import resource\n"
    "from pileshuffle.engine.tuning import keep_freed_memory\n"
    "keep_freed_memory()\n"
    "import numpy as np, pyarrow as pa\n"
    "before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt\n"
    "for _ in range(10):\n"
    "    buffer = pa.allocate_buffer(64 << 20)\n"
    "    np.frombuffer(buffer, dtype=np.uint8)[::4096] = 1\n"
    "    del buffer\n"
    "print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)\n"
)
_PAGES_A_CYCLE = (64 << 20) // 4096


def test_arrow_reuses_the_pages_it_freed():
    """The next buffer takes the pages the last one freed: one cycle's faults, not ten (with
    jemalloc's own settings or the system pool, every cycle faults its pages in afresh)."""
    assert int(run_python(_CYCLES)) < 2 * _PAGES_A_CYCLE
    returned = int(run_python(_CYCLES, env={**os.environ, "JE_ARROW_MALLOC_CONF": "narenas:1"}))
    assert returned > 9 * _PAGES_A_CYCLE


def test_a_users_own_settings_win():
    out = run_python(
        "import os; os.environ['ARROW_DEFAULT_MEMORY_POOL'] = 'mimalloc'; os.environ['MALLOC_ARENA_MAX'] = '4';"
        "from pileshuffle.engine.tuning import keep_freed_memory; keep_freed_memory();"
        "import pyarrow as pa; print(os.environ['MALLOC_ARENA_MAX'], pa.default_memory_pool().backend_name)"
    )
    assert out == "4 mimalloc"


def test_imports_without_gc_leave_the_collector_on_and_the_imports_frozen():
    out = run_python(
        "import gc; from pileshuffle.engine.tuning import importing_without_gc\n"
        "with importing_without_gc():\n"
        "    assert not gc.isenabled()\n"
        "    import json, decimal\n"
        "print(gc.isenabled(), gc.get_freeze_count() > 1000)"
    )
    assert out == "True True"


# A 64 MiB numpy array's mapping in /proc/self/smaps: "hg" in its VmFlags when numpy advised the
# kernel to back it with huge pages (MADV_HUGEPAGE).
_ADVISED = (
    "import numpy as np\n"
    "array = np.ones(8 << 20)\n"
    "start = array.ctypes.data + (1 << 20)\n"
    "flags = None\n"
    "for line in open('/proc/self/smaps'):\n"
    "    if '-' in line.split()[0] and ':' not in line.split()[0]:\n"
    "        low, high = (int(x, 16) for x in line.split()[0].split('-'))\n"
    "        inside = low <= start < high\n"
    "    elif line.startswith('VmFlags:') and inside:\n"
    "        flags = line.split()[1:]\n"
    "print('hg' in flags)\n"
)


def test_numpy_asks_for_no_huge_pages_in_the_command_line_and_in_workers():
    """The command line's start (numpy not yet imported) and a worker's setup (numpy imported
    before it) both leave large arrays unadvised; without the tuning numpy advises them."""
    # this suite's process may have run the tuning already: its setting must not reach these
    env = {k: v for k, v in os.environ.items() if k != "NUMPY_MADVISE_HUGEPAGE"}
    assert run_python(_ADVISED, env) == "True"  # numpy's own default here: the control
    command_line = "from pileshuffle.engine.tuning import keep_freed_memory; keep_freed_memory()\n"
    assert run_python(command_line + _ADVISED, env) == "False"
    worker = (
        "import numpy\nfrom pileshuffle.engine.tuning import prepare_worker; prepare_worker()\n"
    )
    assert run_python(worker + _ADVISED, env) == "False"


def test_a_user_who_wants_numpys_huge_pages_keeps_them():
    out = run_python(
        "import os; os.environ['NUMPY_MADVISE_HUGEPAGE'] = '1'\n"
        "from pileshuffle.engine.tuning import keep_freed_memory; keep_freed_memory()\n" + _ADVISED
    )
    assert out == "True"


# What Beam imports in a process whose command line is ``ARGV`` (``without_remote_connectors``).
_CONNECTORS = (
    "import sys\n"
    "from pileshuffle.engine.tuning import without_remote_connectors\n"
    "without_remote_connectors(sys.argv[1:])\n"
    "import apache_beam as beam\n"
    "from apache_beam.io.filesystems import FileSystems\n"
    "from apache_beam.runners.dataflow import dataflow_runner\n"
    "try:\n"
    "    gs = FileSystems.get_filesystem('gs://bucket/x').scheme()\n"
    "except ValueError:  # no file system for the scheme\n"
    "    gs = None\n"
    "print(hasattr(beam.io, 'WriteToBigQuery'), hasattr(beam.io, 'ReadFromPubSub'),\n"
    "      dataflow_runner.dataflow_api is not None, gs)\n"
)


def test_a_local_command_imports_beam_without_the_remote_connectors():
    """A local command (no ``--runner``, or the local one) imports Beam as it is without
    BigQuery, Pub/Sub and Dataflow's client; and ``run`` or ``plan`` without Cloud Storage's
    client when no path on its command line is on gs:// (every other command keeps it: its
    paths may come from a manifest). A command that names another runner gets every
    connector."""
    for argv, expected in [
        (["verify", "--output=x"], "False False False gs"),
        (["run", "--runner=DirectRunner", "--input=x", "--output=y"], "False False False None"),
        (["plan", "--runner", "direct", "--input=x"], "False False False None"),
        (["run", "--input=gs://b/x", "--output=y"], "False False False gs"),
        (["run", "--input=x", "--output=y", "--temp_location=gs://b/t"], "False False False gs"),
        (["run", "--runner=DataflowRunner", "--project=p"], "True True True gs"),
        (["run", "--runner", "DaskRunner", "--input=x"], "True True True gs"),
    ]:
        assert run_python(_CONNECTORS, argv=argv).splitlines()[-1] == expected, argv
