"""The two passes as Beam transforms: ``assign`` (pass 1), ``shuffle`` (GroupByKey and
pass-2 order), ``write`` (shards and manifest).

May import: what the engine may (the root's bottom modules, io, records, formats) and the
engine's other modules.
"""

from pileshuffle.engine.transforms.shuffle import Pile, ShuffleToPiles
from pileshuffle.engine.transforms.write import WritePiles

__all__ = ["Pile", "ShuffleToPiles", "WritePiles"]
