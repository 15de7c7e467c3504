"""Process settings for the workers: open-file limit and keeping freed memory for reuse.

Pass 1 and pass 2 allocate and free buffers of tens of MiB per chunk and per pile. By
default glibc gives such blocks back to the OS at once (they are mmapped) and the next
chunk touches fresh pages; on a VM every first touch is a page fault the hypervisor
handles too. Keeping blocks up to 32 MiB on the heap cut a 1 GB TFRecord run from about
330,000 to about 100,000 page faults and from 7.0 to 5.3 s (see bench/README.md). Peak
RSS is unchanged: the memory is reused instead of being returned and faulted in again.
"""

import contextlib
import ctypes
import ctypes.util
import gc
import os
import resource

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
HEAP_BLOCK_LIMIT = 32 << 20  # glibc's largest mmap threshold
TRIM_THRESHOLD = 256 << 20
_done = False


def keep_freed_memory():
    """Tune glibc malloc in this process and in the processes it starts (local runner
    workers inherit the environment). Idempotent; does nothing where glibc is absent."""
    global _done
    if _done:
        return
    _done = True
    os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", str(HEAP_BLOCK_LIMIT))
    os.environ.setdefault("MALLOC_TRIM_THRESHOLD_", str(TRIM_THRESHOLD))
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        libc.mallopt(_M_MMAP_THRESHOLD, HEAP_BLOCK_LIMIT)
        libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    except (OSError, AttributeError, TypeError):
        pass


def raise_open_file_limit():
    """Files mode keeps one fragment open per pile: allow as many open files as the OS will."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def prepare_worker():
    """Called from every DoFn's ``setup``: cheap and idempotent."""
    raise_open_file_limit()
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
