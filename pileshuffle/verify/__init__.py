"""Verification: re-read input and output and prove nothing was lost, duplicated or changed.

May import: the package root's bottom modules, io, records, formats and engine.
"""

__all__ = []
