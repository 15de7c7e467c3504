"""How a ``verify`` line writes what it compares: counts with thousands separators, a fingerprint
in one form, and how two fingerprints differ in records.

Every check writes its numbers through these, so two lines about one shard read alike; a value
from a damaged manifest is written as it is, never raises.
"""

from pileshuffle.records.fingerprint import Fingerprint

__all__ = ["describe", "describe_count", "describe_recorded", "describe_difference"]


def describe(fp: Fingerprint) -> str:
    """A fingerprint in words: records, bytes and its two hash sums."""
    return (
        f"{fp.records:,} records, {fp.bytes:,} bytes, hash sum {fp.hash_sum:016x} "
        f"xor {fp.hash_xor:016x}"
    )


def describe_count(value) -> str:
    """A count with thousands separators, as every line writes it; anything else (a damaged
    manifest's) as it is."""
    return f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else repr(value)


def describe_recorded(value) -> str:
    """A fingerprint as a manifest recorded it (JSON), or what is there when it is unreadable."""
    try:
        return describe(Fingerprint.from_json(value))
    except Exception:
        return f"unreadable: {value!r}"


def describe_difference(found: Fingerprint, than: Fingerprint, what: str) -> str:
    """How ``found`` differs from ``than`` (``what``: the records ``than`` counts), in records."""
    more = found.records - than.records
    return (
        f"{more:,} record(s) more than {what}"
        if more > 0
        else f"{-more:,} record(s) fewer than {what}"
        if more < 0
        else "the same count but different records"
    )
