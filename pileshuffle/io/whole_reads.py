"""A remote file read in one download while a reader parses it (``read_once``).

A Parquet reader reads a file by its footer and then column chunk by column chunk: on gs://,
through pyarrow, each read is a request that streams from its offset to the end of the object
(11 requests for one 2-shard output's shard). Where the file may be held, it is downloaded once
(``storage.read_buffer``) and its reads served from memory (``held_bytes``). A file is held
only when it is remote and at most ``HELD_MAX_BYTES`` and a quarter of the memory this process
may still take (``memory_limit``: a container's limit included); a larger one, and every local
file, is read where it is, in bounded memory.
"""

import contextlib

from pileshuffle.io import held_bytes, storage
from pileshuffle.io.memory_limit import available_memory

__all__ = ["HELD_MAX_BYTES", "read_once"]

# --max_pile_bytes auto's largest pile: a shard of an auto run is always held
HELD_MAX_BYTES = 1 << 30
# what of the memory this process may still take one held file may use
_HELD_SHARE = 4


@contextlib.contextmanager
def read_once(path: str, size: int):
    """Reads of ``path`` in this block and this thread from one download of it, when it is
    remote and small enough to hold; else from where it is. ``size``: its bytes as the caller
    listed them; None (not listed) reads it where it is: asking the store would be a listing of
    its folder per file through pyarrow."""
    if size is None or not storage.is_remote(path) or not _may_hold(size):
        yield
        return
    with held_bytes.held(path, storage.read_buffer(path)):
        yield


def _may_hold(size: int) -> bool:
    if size > HELD_MAX_BYTES:
        return False
    available = available_memory().available
    return available is None or size * _HELD_SHARE <= available
