"""Which rows of a dedup store's data file copy an earlier row: the copies file, and counting.

In a store created with ``--dedup`` (``pileshuffle.store.copies`` says how copies are found), every
row has ``earlier``: the newest generation that holds an earlier copy of it, or -1. A row is hidden
while generation ``earlier`` is live.

On disk, beside a data file ``g{g}/p{pile}-w{writer}.arrows`` that has rows with an earlier copy:
``g{g}/p{pile}-w{writer}.copies.arrows``, an Arrow IPC stream of ``row`` (int64, the row's place
in the data file) and ``earlier`` (int32, 0 or more), one row per copy, ascending by ``row``;
written whole (temp then rename, or one upload), never rewritten. The data file's manifest entry
lists it as ``copies``: ``path`` (store-relative), ``bytes``, ``crc32c`` and ``earlier`` (generation
as a string -> rows), so the visible rows of any live set are counted from the manifest alone
(``hidden_rows``). A data file without copies has neither.
"""

import collections

import numpy as np
import pyarrow as pa

from pileshuffle.errors import InputError
from pileshuffle.io.checksums import crc32c_hex
from pileshuffle.names import FRAGMENT_EXTENSION

__all__ = [
    "COPIES_SUFFIX",
    "COPIES_SCHEMA",
    "NONE",
    "copies_name",
    "encode_copies",
    "read_copies",
    "hidden_rows",
    "visible_places",
]

COPIES_SUFFIX = ".copies.arrows"
COPIES_SCHEMA = pa.schema([("row", pa.int64()), ("earlier", pa.int32())])
NONE = -1  # ``earlier`` of a row no earlier row repeats


def copies_name(data_path: str) -> str:
    """The copies file beside a data file (store-relative or full path alike)."""
    return data_path[: -len(FRAGMENT_EXTENSION)] + COPIES_SUFFIX


def encode_copies(relative: str, earlier: np.ndarray) -> tuple:
    """``(bytes, manifest entry)`` of the copies file at ``relative`` for a data file whose rows
    have ``earlier`` (one int per row, ``NONE`` where no earlier row repeats it)."""
    rows = np.flatnonzero(earlier != NONE)
    table = pa.table(
        {"row": pa.array(rows, pa.int64()), "earlier": pa.array(earlier[rows], pa.int32())},
        schema=COPIES_SCHEMA,
    )
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, COPIES_SCHEMA) as writer:
        writer.write_table(table)
    data = sink.getvalue().to_pybytes()
    counts = collections.Counter(earlier[rows].tolist())
    return data, {
        "path": relative,
        "bytes": len(data),
        "crc32c": crc32c_hex(data),
        "earlier": {str(g): counts[g] for g in sorted(counts)},
    }


def read_copies(data, name: str) -> tuple:
    """``(row, earlier)`` arrays of a copies file's bytes (``name``: the file, for errors)."""
    try:
        table = pa.ipc.open_stream(data).read_all()
        return table.column("row").to_numpy(), table.column("earlier").to_numpy()
    except (OSError, pa.ArrowException, KeyError) as error:
        raise InputError(name, f"cannot be read as a pile store copies file: {error}") from error


def hidden_rows(entry: dict, live) -> int:
    """The rows of a data file (its manifest ``entry``) hidden while the generations ``live``
    are."""
    earlier = (entry.get("copies") or {}).get("earlier") or {}
    return sum(rows for generation, rows in earlier.items() if int(generation) in live)


def visible_places(rows: int, row: np.ndarray, earlier: np.ndarray, live) -> np.ndarray:
    """The places of a data file's ``rows`` rows that are visible while ``live`` generations are,
    given its copies file's ``row`` and ``earlier``."""
    hidden = np.zeros(rows, dtype=bool)
    hidden[row[np.isin(earlier, np.fromiter(live, np.int64))]] = True
    return np.flatnonzero(~hidden)
