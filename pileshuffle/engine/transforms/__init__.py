"""The two passes as Beam transforms: ``assign`` (pass 1's keys and pile parts) and
``pass_one`` (its Beam steps), ``shuffle`` (GroupByKey and pass-2 order; ``pile_groups`` for
many small piles), ``shards`` (pass 2 writes a shard a pile), ``finalize`` (the check and the
publication, manifest last), ``write`` (WritePiles: shards and finalize composed), ``graph``
(the template's graph).

May import: what the engine may (the root's bottom modules, io, records, formats) and the
engine's other modules.
"""

from pileshuffle.engine.transforms.shuffle import Pile, ShuffleToPiles
from pileshuffle.engine.transforms.write import WritePiles

__all__ = ["Pile", "ShuffleToPiles", "WritePiles"]
