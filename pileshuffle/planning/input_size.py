"""What a plan reads of the input to size a run: the mean record as Arrow holds it (from the first
MiB of one file), the input's held bytes (Parquet's row counts, a compressed file's expansion),
``--balance``'s growth from a sample of labels, the piles ``--num_piles auto`` makes of them, and
the input scaled to a size it does not have yet (``plan --input_bytes``: a sample's records in as
many files as that size takes). It reads at most a MiB of a file and Parquet footers."""

import dataclasses
import math

from pileshuffle.formats.labels import sampled_label_counts
from pileshuffle.io import storage
from pileshuffle.records import keys as keymath

__all__ = [
    "RECORD_OVERHEAD",
    "SCALED_FILE_BYTES",
    "mean_record_bytes",
    "estimated_bytes",
    "balance_growth",
    "choose_num_piles",
    "piles_reached",
    "scaled_sources",
]

_SAMPLE_BYTES = 1 << 20  # what a plan reads of an input file to size its records (its first MiB)
# --balance: files whose first labels estimate the output's size (a request each on gs://)
_LABEL_SAMPLE_FILES = 8
_GZIP_EXPANSION_GUESS = 4.0  # a compressed input's expansion when no sample can tell (not gzip)
# bytes per record in a pile beside the record itself: its 8-byte key and 8-byte hash
RECORD_OVERHEAD = 16
SCALED_FILE_BYTES = 10**9  # plan --input_bytes: files of 1 GB (or the sample's, if larger)


def mean_record_bytes(fmt, sources) -> float:
    """Mean bytes per record as Arrow holds it, from the first MiB of the first source that has
    a record there (Parquet: its first rows decoded)."""
    for source in sources:
        mean = fmt.mean_record_bytes(source.path, _SAMPLE_BYTES) if source.size else None
        if mean:
            return max(1.0, mean)
    return 1.0


def estimated_bytes(fmt, sources, mean: float) -> int:
    """The input's records as Arrow holds them: Parquet's rows (its footers) of ``mean`` bytes
    each (``mean_record_bytes``: a decoded sample), a plain file's size, a compressed file's size
    times the expansion of a sample of the first one (``_expansion``)."""
    if fmt.name == "parquet":
        return int(sum(fmt.row_count(s.path) for s in sources if s.size) * mean)
    compressed = [s for s in sources if storage.compression_of(s.path) != storage.UNCOMPRESSED]
    ratio = _expansion(compressed[0].path) if compressed else 1.0
    return int(sum(s.size * (ratio if s in compressed else 1) for s in sources))


def _expansion(path: str) -> float:
    """Bytes out per byte in of a compressed file's first MiB (gzip; else
    ``_GZIP_EXPANSION_GUESS``)."""
    import zlib

    if storage.compression_of(path) != storage.GZIP:
        return _GZIP_EXPANSION_GUESS
    with storage.open_read(path, storage.UNCOMPRESSED) as handle:
        head = handle.read(_SAMPLE_BYTES)
    inflate = zlib.decompressobj(wbits=47)  # a gzip (or zlib) header
    try:
        out = len(inflate.decompress(head, 64 * _SAMPLE_BYTES))
    except zlib.error:  # pass 1 names what is wrong with the file
        return _GZIP_EXPANSION_GUESS
    used = len(head) - len(inflate.unconsumed_tail)
    return max(1.0, out / used) if used else _GZIP_EXPANSION_GUESS


def choose_num_piles(requested, mean, total, max_pile_bytes, growth=1.0) -> tuple:
    """``(piles, why)`` for ``--num_piles`` given the mean record size, the input bytes and the
    records ``--balance`` writes per record read (``growth``)."""
    if str(requested) != "auto":
        return int(requested), "as requested"
    # as a pile holds it: records of `mean` bytes, each with its key and hash
    per_record = mean + RECORD_OVERHEAD
    piles = keymath.auto_num_piles(total * growth / mean * per_record, per_record, max_pile_bytes)
    written = (
        ""
        if growth == 1.0
        else f" written {growth:.2f} times over by --balance (a sample of the labels),"
    )
    reason = (
        f"auto: about {total / 1e6:,.0f} MB of {mean:,.0f}-byte records,{written} piles of at most "
        f"{max_pile_bytes / 2**20:,.0f} MiB with s + 6*sqrt(s) headroom"
    )
    return piles, reason


def piles_reached(num_piles: int, records: float) -> float:
    """Expected non-empty piles of ``records`` records: M(1 - (1 - 1/M)^n)."""
    if records <= 0 or num_piles == 1:
        return float(records > 0)
    return -num_piles * math.expm1(records * math.log1p(-1 / num_piles))


def balance_growth(fmt, sources, label: str, policy) -> float:
    """Records ``--balance`` writes per record read, estimated from the first MiB of labels of
    up to ``_LABEL_SAMPLE_FILES`` files spread over the input, so that auto piles and the space
    check fit the output (a 2x output in piles sized for the input splits every pile in pass 2)."""
    if policy is None:
        return 1.0
    picked = sources[:: max(1, len(sources) // _LABEL_SAMPLE_FILES)][:_LABEL_SAMPLE_FILES]
    return policy.growth(
        sampled_label_counts(fmt, [s.path for s in picked if s.size], label, _SAMPLE_BYTES)
    )


def scaled_sources(sources, input_bytes: int) -> list:
    """The input as if it totalled ``input_bytes``: files of the sample's mean size, at least
    ``SCALED_FILE_BYTES``, the last one holding the rest, each named as a sample file (in turn) so
    that its format and compression are the sample's. They are never read: a plan of data that is
    not there yet (``plan --input_bytes``) counts their units, runs, parts and requests."""
    given = [s for s in sources if s.size]
    file_bytes = max(SCALED_FILE_BYTES, sum(s.size for s in given) // max(1, len(given)))
    count = max(1, math.ceil(input_bytes / file_bytes))
    sizes = [file_bytes] * (count - 1) + [input_bytes - file_bytes * (count - 1)]
    return [
        dataclasses.replace(given[i % len(given)], id=i, size=size, span=None)
        for i, size in enumerate(sizes)
    ]
