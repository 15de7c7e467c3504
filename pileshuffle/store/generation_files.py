"""A generation's data files as its writers make them.

One Arrow IPC stream per (pile, writer), at ``g{generation}/p{pile}-w{writer}.arrows`` under
the store directory, written under a temporary name and renamed (``FragmentFiles``); each
committed file becomes a ``StoreFile``, the entry the generation's manifest lists for it.
"""

import dataclasses

from pileshuffle import names
from pileshuffle.engine.fragments import FragmentFiles
from pileshuffle.io import storage
from pileshuffle.names import store_writer_name
from pileshuffle.records.fingerprint import Fingerprint
from pileshuffle.store import layout

__all__ = ["StoreFile", "StoreFiles"]


@dataclasses.dataclass(frozen=True)
class StoreFile:
    """One written data file (its path relative to the store directory)."""

    generation: int
    pile: int
    writer: int
    path: str
    records: int
    bytes: int
    fingerprint: Fingerprint
    crc32c: str
    # composed use: the fragments' run directory, removed after publishing
    work_dir: str = None
    # a dedup store: its rows that repeat an earlier live row (store.copies)
    copies: dict = None

    def to_json(self) -> dict:
        entry = {
            "path": self.path,
            "pile": self.pile,
            "writer": self.writer,
            "records": self.records,
            "bytes": self.bytes,
            "crc32c": self.crc32c,
            "fingerprint": self.fingerprint.to_json(),
        }
        return entry if self.copies is None else {**entry, "copies": self.copies}


class StoreFiles(FragmentFiles):
    """One writer's data files of a generation: one IPC stream per pile, temp then rename."""

    def __init__(self, store: str, generation: int, writer: int):
        super().__init__(
            storage.join(store, names.generation_dir_name(generation)), store_writer_name(writer)
        )
        self._store, self._generation, self._writer = store, generation, writer

    def relative(self, pile: int) -> str:
        return names.data_file_name(self._generation, pile, self._writer)

    def final_path(self, pile: int) -> str:
        return layout.join(self._store, self.relative(pile))

    def commit_files(self, work_dir=None):
        return [
            StoreFile(
                self._generation,
                f.pile,
                self._writer,
                self.relative(f.pile),
                f.records,
                storage.size(f.path),
                f.fingerprint,
                f.crc32c,
                work_dir,
            )
            for f in self.commit()
        ]
