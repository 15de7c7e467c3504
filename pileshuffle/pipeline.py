"""The flex template's entry point: ``python -m pileshuffle.pipeline --input ... --output ...``
is ``pileshuffle run`` (``pileshuffle.commands.run``); ``run`` is its Python form."""

import sys

from pileshuffle.commands.run import main, run

__all__ = ["main", "run"]

if __name__ == "__main__":
    sys.exit(main())
