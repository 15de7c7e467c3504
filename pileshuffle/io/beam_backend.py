"""``storage``'s file operations through Apache Beam's ``FileSystems``: in a process that has
imported Beam (a pipeline's workers and its launcher), so that the pipeline's options configure
every object store, as Beam's own reads and writes see it.

``in_use`` is the one choice between Beam and pyarrow (``arrow_backend``);
``PILESHUFFLE_STORAGE=beam|arrow`` overrides it (tests of both). Beam is imported here only when
a function is called, never by importing this module.
"""

import os
import sys

from pileshuffle.io import cloud, cloud_requests

__all__ = [
    "in_use",
    "file_systems",
    "compression_of",
    "match",
    "pattern_regex",
    "open_read",
    "read_whole",
]

UNCOMPRESSED = "uncompressed"  # Beam's name, as ``storage`` passes it on


def in_use() -> bool:
    """Whether this process's files go through Beam: it has imported Beam, unless
    ``PILESHUFFLE_STORAGE`` says otherwise."""
    chosen = os.environ.get("PILESHUFFLE_STORAGE")
    return chosen == "beam" if chosen in ("beam", "arrow") else "apache_beam" in sys.modules


def file_systems(*paths):
    """Beam's ``FileSystems``, once the endpoint rule holds in Beam (``cloud.configure_beam``)
    and the remote paths' bucket answered (``cloud_requests.first_contact``)."""
    from apache_beam.io.filesystems import FileSystems

    cloud.configure_beam()
    for path in paths:
        cloud_requests.first_contact(path)
    return FileSystems


def compression_of(path: str) -> str:
    """The compression Beam detects from ``path``'s name."""
    from apache_beam.io.filesystem import CompressionTypes

    return CompressionTypes.detect_compression_type(path)


def match(pattern: str) -> list:
    """``(path, size)`` of the files the glob ``pattern`` matches; [] when none do (an object
    store that refuses the request: the error)."""
    # outside the try: an unreachable endpoint is an error, not "no match"
    FileSystems = file_systems(pattern)
    try:
        found = FileSystems.match([pattern])[0].metadata_list
    except Exception as error:  # BeamIOError when nothing matches
        if cloud.refused(error):
            raise
        return []
    return [(m.path, m.size_in_bytes) for m in found]


def pattern_regex(pattern: str):
    """The compiled regular expression of the paths Beam's glob ``pattern`` matches."""
    import re

    from apache_beam.io.filesystem import FileSystem

    return re.compile(FileSystem.translate_pattern(pattern))


def open_read(path: str, wanted: str):
    """``path``'s contents, decompressed as ``wanted`` says, 64 KiB at a time
    (tests/test_bounded_inflate)."""
    from apache_beam.io.filesystem import CompressedFile

    raw = file_systems(path).open(path, compression_type=UNCOMPRESSED)
    return raw if wanted == UNCOMPRESSED else CompressedFile(raw, wanted, read_size=64 << 10)


def read_whole(handle, compression: str) -> bytes:
    """Every byte of an ``open_read`` handle: Beam's decompressing read() without a size gives
    16 MiB, so a compressed file is read in 16 MiB reads to its end."""
    if compression == UNCOMPRESSED:
        return handle.read()  # io's read(): every byte, in one request
    return b"".join(iter(lambda: handle.read(16 << 20), b""))
