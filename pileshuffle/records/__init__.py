"""A record's identity: pile keys from the seeded RNG, fingerprints and the CRC loops under them.

May import: the package root's bottom modules and io.
"""

__all__ = []
