"""One shard file against what its manifest entry lists: its bytes (size and CRC32C) and its
schema's fields.

A shard whose bytes fail is reported once, as damaged, with the one reason that explains it
best; a schema compares as Arrow compares types, not by the names Parquet gives nested fields.
"""

import re

from pileshuffle.io.checksums import crc32c_mismatch

__all__ = ["same_fields", "damage"]

_NESTED_FIELD_NAME = re.compile(r"(list<)[^<>:,]+: ")  # list<item: int64>: the item's name
_MAP_ENTRIES_NAME = re.compile(r" \('[^']*'\)")  # map<string, int64 ('m')>: the entries' name


def _type_without_nested_names(type_name: str) -> str:
    """An Arrow type's text without the names of list items and map entries, which are not
    part of the type (Arrow's equality ignores them) and which Parquet renames on a round trip
    (``list<item: int64>`` reads back as ``list<element: int64>``, ``map<string, int64>`` as
    ``map<string, int64 ('m')>``)."""
    return _MAP_ENTRIES_NAME.sub("", _NESTED_FIELD_NAME.sub(r"\1", type_name))


def same_fields(actual, recorded) -> bool:
    """Whether a shard's fields (``schema_json``) are the manifest's: names, nullability, types."""

    def comparable(fields):
        return [
            (f["name"], _type_without_nested_names(f["type"]), f["nullable"]) for f in fields or []
        ]

    return recorded is not None and comparable(actual) == comparable(recorded)


def damage(data, size: int, entry) -> str:
    """How a shard's bytes ``data`` (read whole, ``size`` bytes stored) differ from the CRC32C its
    manifest ``entry`` lists (and its size, then), else None."""
    if entry is None or entry.get("crc32c") is None:
        return None
    mismatch = crc32c_mismatch(data, entry["crc32c"])
    if mismatch is not None and entry.get("bytes") not in (None, size):
        return f"it is {size:,} bytes where its manifest lists {entry['bytes']:,}"
    return mismatch
