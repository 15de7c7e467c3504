"""The two passes as Beam transforms: ``assign`` (pass 1), ``shuffle`` (GroupByKey and
pass-2 order), ``write`` (shards and manifest)."""

from pileshuffle.transforms.shuffle import Pile, ShuffleToPiles
from pileshuffle.transforms.write import WritePiles

__all__ = ["Pile", "ShuffleToPiles", "WritePiles"]
