"""The checks of the loader's arguments: every refusal names the argument and what it got,
and nothing is wrapped, truncated or silently clamped."""

import numbers

__all__ = [
    "whole_number",
    "checked_batch_size",
    "checked_columns",
    "check_world_size",
    "describe_identity",
]


def whole_number(name: str, value, low: int, high: int = None, high_name: str = None) -> int:
    """``value`` as an int in ``low .. high-1``; anything else (a bool, a float such as 1.5, a
    string, a number out of range) is refused naming ``name``, never wrapped or truncated."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be a whole number, got {value!r}")
    if high is None and value < low:
        raise ValueError(f"{name} must be at least {low}, got {value}")
    if high is not None and not low <= value < high:
        bound = f"{high - 1}" if high_name is None else f"{high_name}-1 = {high - 1}"
        raise ValueError(f"{name} must be in {low}..{bound}, got {value}")
    return int(value)


def checked_batch_size(value):
    """``batch_size``: None or a whole number of at least 1."""
    return None if value is None else whole_number("batch_size", value, 1)


def checked_columns(columns):
    """``columns``: None (every column) or a non-empty list of column names."""
    if columns is None:
        return None
    if isinstance(columns, str) or not all(isinstance(c, str) for c in columns):
        raise ValueError(f"columns must be a list of column names, got {columns!r}")
    if not columns:
        raise ValueError(
            "columns=[] selects no column, so every record would be empty: name at least one "
            "column, or pass columns=None for all of them"
        )
    return columns


def check_world_size(records: int, location: str, world_size: int, remainder: str):
    """Refuse a split in which every rank would read nothing although there are ``records``."""
    if remainder == "drop" and 0 < records < world_size:
        raise ValueError(
            f"world_size {world_size} is larger than the {records} records of {location}: with "
            f"remainder='drop' every rank would get {records // world_size} records; use "
            "remainder='pad' (each rank gets 1, some repeated) or fewer ranks"
        )


def describe_identity(identity) -> str:
    """An output identity (``Output.identity``) in words."""
    if not isinstance(identity, dict):
        return f"{identity!r:.80}"
    seed = "no seed" if identity.get("seed") is None else f"seed {identity.get('seed')}"
    return (
        f"{identity.get('kind')} of {identity.get('records', '?'):,} records in "
        f"{identity.get('piles')} piles, {seed}, digest {identity.get('digest')}"
    )
