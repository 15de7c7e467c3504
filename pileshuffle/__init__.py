"""pileshuffle: a seeded, deterministic global shuffle of datasets larger than RAM, on Apache Beam.

Composed use::

    from pileshuffle import ShuffleToPiles, WritePiles

    (records                                   # PCollection of bytes (or Arrow batches)
     | ShuffleToPiles(num_piles=64, seed=1)    # pass 1 + GroupByKey + pass-2 order
     | WritePiles("out/train", format="tfrecord"))
"""

from pileshuffle.version import __version__


def __getattr__(name):  # lazy: importing the package must not import Beam's transforms
    if name in ("ShuffleToPiles", "GroupIntoPiles", "Pile"):
        from pileshuffle.engine.transforms import shuffle

        return getattr(shuffle, name)
    if name == "WritePiles":
        from pileshuffle.engine.transforms.write import WritePiles

        return WritePiles
    if name == "WritePileStore":
        from pileshuffle.store.composed import WritePileStore

        return WritePileStore
    raise AttributeError(name)


__all__ = [
    "ShuffleToPiles",
    "WritePiles",
    "WritePileStore",
    "Pile",
    "GroupIntoPiles",
    "__version__",
]
