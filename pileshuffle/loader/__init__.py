"""Read finished pileshuffle outputs back for training: ``ShuffledDataset`` (one output) and
``Mixture`` (several, interleaved by weight).

Imports neither Apache Beam, TensorFlow nor torch (the adapters ``ds.torch()`` and
``ds.tf()`` import theirs when called). All file access goes through
``pileshuffle.io.storage`` (``pyarrow.fs`` underneath).

May import: the package root's bottom modules, io, records and formats; only quality and
commands import the loader.
"""

from pileshuffle.loader.dataset import ShuffledDataset
from pileshuffle.loader.mixture import Mixture
from pileshuffle.loader.order import EpochOrder, epoch_order
from pileshuffle.loader.outputs import open_output
from pileshuffle.loader.piles import NoOutputError, PileRef

__all__ = [
    "ShuffledDataset",
    "Mixture",
    "EpochOrder",
    "epoch_order",
    "PileRef",
    "NoOutputError",
    "open_output",
]
