"""The package's version: written into every manifest (``pileshuffle_version``), shown by
``pileshuffle --version``, and read by setup.py. Imports nothing, so any layer may read it."""

__version__ = "0.1.0"

__all__ = ["__version__"]
