"""Process settings for the workers: open-file limit and keeping freed memory for reuse.

Pass 1 and pass 2 allocate and free buffers of tens of MiB per chunk and per pile. By
default glibc gives such blocks back to the OS at once (they are mmapped), every thread
grows and shrinks an arena of its own, and Arrow's allocators return large blocks too: the
next chunk touches fresh pages, and on a VM every first touch is also a fault the
hypervisor handles. So freed blocks up to 32 MiB stay on glibc's heap and all threads share
its one arena: that cut a 1 GB TFRecord run from about 330,000 to 100,000 page faults and
from 7.0 to 5.3 s (bench/README.md).

Arrow's own buffers (a decoded column, a pile's join, a take) are larger than glibc keeps,
and the system pool copies a buffer on every growth (``realloc`` does not keep Arrow's
alignment). So Arrow allocates from its jemalloc, with one arena for all threads that keeps
the pages it frees for the next buffer (``JE_ARROW_MALLOC_CONF``: ``narenas:1``, no decay).
Against Arrow on glibc, interleaved rounds (docs/performance.md, "Arrow allocates from its
jemalloc"): 10 GB of Parquet with defaults 49.4/43.9 s against 58.1/60.9 s, 2.8 M page faults
against 4.6 M; 2 GB of JSONL at ``--memory 1GB`` 8.0 against 9.7 s. The price is a second heap
beside glibc's: peak RSS at a 1 GiB budget 0.83 against 0.70 GB (Parquet), 0.87 against 0.73
(JSONL), 0.73 against 0.54 (TFRecord), inside the budget's model
(``planning/job_model.LOCAL_BASE_BYTES``; tests/test_memory_bound.py holds each format's peak
under ``--memory``). Eight arenas (jemalloc's default, four per core) kept 2.0 GB at
``--memory 2GB`` where one keeps 1.7-1.85.

numpy asks the kernel for transparent huge pages for every array of 4 MiB or more
(``MADV_HUGEPAGE``); where the kernel then compacts memory to find them (``defrag`` set to
``madvise``, the default of many distributions, and this VM's) each such array's first touch
stalls: a 508 MB TFRecord run spent 3.9 s of system CPU and 5.9 s in all with it, 1.1 and 2.6 s
without (3 interleaved rounds). Arrays here are streamed once and freed: huge pages buy them
nothing. So numpy is told not to ask (``NUMPY_MADVISE_HUGEPAGE=0``; the environment's own value,
where set, wins).

A command's start-up is mostly Beam's import (``import apache_beam``: 1.1-1.4 s of CPU here),
which imports every connector the SDK has. A command that runs on the local runner imports it
as Beam without the GCP extras' BigQuery, Pub/Sub and Dataflow API client, and a ``run`` or
``plan`` of local paths without Cloud Storage's client too (``without_remote_connectors``):
Beam guards those imports for installs that lack them, and such a command never calls them
(docs/performance.md, "Beam's import").
"""

import contextlib
import ctypes
import ctypes.util
import gc
import os
import resource
import sys

__all__ = [
    "keep_freed_memory",
    "prepare_worker",
    "importing_without_gc",
    "without_remote_connectors",
]

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8
_HEAP_BLOCK_LIMIT = 32 << 20  # glibc's largest mmap threshold
_TRIM_THRESHOLD = 256 << 20
# one arena for all threads; freed pages kept for the next buffer, never handed back
_JEMALLOC_KEEPING_PAGES = "narenas:1,dirty_decay_ms:-1,muzzy_decay_ms:-1"
_done = False


def keep_freed_memory():
    """Tune glibc malloc and Arrow's pool in this process and in the processes it starts (local
    runner workers inherit the environment). Idempotent; glibc's part is skipped where glibc is
    absent. The command line calls it first thing, before any other thread exists: threads
    started later then all share glibc's one arena, and numpy's OpenBLAS (imported with
    pyarrow) starts no idle threads: nothing here uses BLAS."""
    global _done
    if _done:
        return
    _done = True
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    _numpy_without_huge_pages()
    _glibc_keeping_blocks()  # before pyarrow's import could start a thread
    _arrow_pool_keeping_its_pages()


def _glibc_keeping_blocks():
    """glibc keeps freed blocks up to 32 MiB, in one arena for all threads."""
    settings = {  # the environment's own values, where set, win
        _M_MMAP_THRESHOLD: _setdefault("MALLOC_MMAP_THRESHOLD_", _HEAP_BLOCK_LIMIT),
        _M_TRIM_THRESHOLD: _setdefault("MALLOC_TRIM_THRESHOLD_", _TRIM_THRESHOLD),
        _M_ARENA_MAX: _setdefault("MALLOC_ARENA_MAX", 1),
    }
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        for option, value in settings.items():
            libc.mallopt(option, value)
    except (OSError, AttributeError, TypeError, ValueError):
        pass  # not glibc


def _arrow_pool_keeping_its_pages():
    """Arrow allocates from its jemalloc with one arena that keeps the pages it frees (the
    environment's ``ARROW_DEFAULT_MEMORY_POOL`` and ``JE_ARROW_MALLOC_CONF``, where set, win);
    the system pool where this pyarrow has no jemalloc. jemalloc reads its settings when it
    first allocates, so this comes before any Arrow allocation from it."""
    name = os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "jemalloc")
    if name == "jemalloc":
        os.environ.setdefault("JE_ARROW_MALLOC_CONF", _JEMALLOC_KEEPING_PAGES)
    import pyarrow as pa

    try:
        pool = getattr(pa, f"{name}_memory_pool")()
    except (AttributeError, NotImplementedError):
        pool = pa.system_memory_pool()
    pa.set_memory_pool(pool)


def _numpy_without_huge_pages():
    """``NUMPY_MADVISE_HUGEPAGE=0`` unless the environment says otherwise: read by numpy when it
    is imported (the command line comes here first), and applied at once where numpy already is
    (a worker's ``setup``) through numpy's own switch for it."""
    if os.environ.setdefault("NUMPY_MADVISE_HUGEPAGE", "0") != "0" or "numpy" not in sys.modules:
        return
    numpy = sys.modules["numpy"]
    core = getattr(numpy, "_core", None) or getattr(numpy, "core", None)
    switch = getattr(getattr(core, "multiarray", None), "_set_madvise_hugepage", None)
    if switch is not None:
        switch(False)


def _setdefault(name: str, value: int) -> int:
    return int(os.environ.setdefault(name, str(value)))


def _raise_open_file_limit():
    """Files mode keeps one fragment open per pile: allow as many open files as the OS will."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def prepare_worker():
    """Called from every DoFn's ``setup``: cheap and idempotent."""
    _raise_open_file_limit()
    keep_freed_memory()


@contextlib.contextmanager
def importing_without_gc():
    """Pause the cyclic garbage collector while Beam is imported, then freeze what was
    imported. The import creates some 200,000 long-lived objects and the collector ran
    over them dozens of times (0.1-0.2 s of the start-up); frozen, later collections skip
    them. Nothing is leaked: module objects live for the whole process anyway."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if was_enabled:
            gc.enable()


# Connectors whose import Beam guards (``except ImportError``: the SDK without its GCP extras)
# and that no local run calls: BigQuery (its guard in ``apache_beam.io`` also holds Pub/Sub and
# the cross-language IOs) and Dataflow's API client (``dataflow_runner`` only submits with it).
_CONNECTORS_NOT_RUN_LOCALLY = ("apache_beam.io.gcp.bigquery", "google.cloud.dataflow")
_LOCAL_RUNNERS = (None, "directrunner", "direct")
# Cloud Storage's client (Beam's gs:// file system, skipped when it is missing), for the
# commands whose every path is on their command line, when none is on gs://.
_CLOUD_STORAGE_CLIENT = "google.cloud.storage"
_PATHS_ON_THE_COMMAND_LINE = ("run", "plan")


def without_remote_connectors(argv):
    """In a command's own process, before Beam is imported (``argv``: the command and its
    arguments): when ``argv`` names no runner but the local one, Beam will import as it does
    without the connectors in ``_CONNECTORS_NOT_RUN_LOCALLY`` (they read as not installed), and
    without Cloud Storage's client too when the command's paths are all on its command line and
    none is on gs://. Not for a process that goes on to run other code: it stays without them.
    A module already imported is left alone."""
    if _runner_named(argv) not in _LOCAL_RUNNERS:
        return
    unused = list(_CONNECTORS_NOT_RUN_LOCALLY)
    if argv[:1] and argv[0] in _PATHS_ON_THE_COMMAND_LINE and not any("gs://" in a for a in argv):
        unused.append(_CLOUD_STORAGE_CLIENT)
    for name in unused:
        sys.modules.setdefault(name, None)


def _runner_named(argv):
    """The last ``--runner`` value in ``argv``, lower-cased, or None."""
    named = None
    for i, arg in enumerate(argv):
        if arg.startswith("--runner="):
            named = arg.partition("=")[2]
        elif arg == "--runner" and i + 1 < len(argv):
            named = argv[i + 1]
    return None if named is None else named.lower()
