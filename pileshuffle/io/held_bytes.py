"""Files already read whole, served from memory to this thread's later reads of the same path.

A reader that needs a file's bytes twice (``verify``: the shard's CRC32C against its manifest,
then its records) reads it once, with ``storage.read_buffer``, and holds it here (``held``):
inside that block ``storage.open_read`` and ``storage.open_random_access`` of that path, in
this thread, read the held bytes instead of downloading the file again. The bytes are held as
``read_buffer`` gives them, decompressed when the name ends in .gz; a read that asks for them in
another form (a ``.gz`` file's raw bytes) reads the file.
"""

import contextlib
import threading

__all__ = ["held", "reader"]

_local = threading.local()


@contextlib.contextmanager
def held(path: str, data):
    """Serve this thread's reads of ``path`` from ``data`` (a ``pyarrow.Buffer``) in the block."""
    before = getattr(_local, "files", {})
    _local.files = {**before, path: data}
    try:
        yield
    finally:
        _local.files = before


def reader(path: str, decompressed: bool):
    """A ``pyarrow.BufferReader`` over ``path``'s held bytes when they are in the form asked
    (``decompressed``: a .gz file's contents), else None: the caller reads the file."""
    data = getattr(_local, "files", {}).get(path)
    if data is None or decompressed != path.endswith(".gz"):
        return None
    import pyarrow as pa

    return pa.BufferReader(data)
