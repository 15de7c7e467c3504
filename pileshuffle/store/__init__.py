"""Pile stores: pass 1's output kept, so the second pass can be lazy and the data can move.

A store is a set of generations (the unit of append and expire), each holding at most
W x M Arrow IPC files of records with their keys, and versioned manifests naming the
live generations (see ``layout`` and docs/stores.md). ``run --layout store`` writes
generation 0 with ``run``'s keys, so ``materialize`` gives ``run``'s exact shards.

May import: the package root's bottom modules, io, records, formats, engine and verify.
"""


def __getattr__(name):  # lazy: importing the package must not import Beam's transforms
    if name == "WritePileStore":
        from pileshuffle.store.composed import WritePileStore

        return WritePileStore
    raise AttributeError(name)


__all__ = ["WritePileStore"]
