"""The engine: sources read into pass-1 runs, piles assembled and shuffled, the Beam transforms,
dedup and balance, and the runner a built pipeline runs on (``runner``).

May import: the package root's bottom modules, io, records and formats.
"""

__all__ = []
