"""The commands: one module per command (``run``, ``plan``, ``verify``, the store's, ``quality``,
``generate``, ``metadata``), each a function of its options that ``cli.py``, the flex
template's ``main`` and Python callers share. Commands sit on top: they import every layer
below and nothing imports them (``pileshuffle.pipeline`` is the template's entry alias).

May import: every layer below (planning, quality, store, verify, engine, formats, records, io, the
root's bottom modules) and the loader; nothing but the entry points imports them.
"""

__all__ = []  # the commands are its modules; the package itself exports nothing
