"""How uniform a finished run's order is: records located in the input by hash (``locate``),
their labels (``label``), the orders of the shuffles compared (``orders``), the metrics
(``metrics``), a small training task (``training``), the report, as text and its figures
(``report``, ``text``, ``render``). The command is ``pileshuffle.commands.quality``.

May import: the package root's bottom modules, io, records, formats, engine, store, verify and
the loader.
"""

# records located: on fewer, no test can tell a shuffle from a bad order, so a verdict means nothing
MIN_SAMPLE = 100

__all__ = ["MIN_SAMPLE"]
