"""Storage and object stores: local files, gs:// objects, their checksums and the marks a
run leaves on them; and the memory this process may take (``memory_limit``), which bounds what
is held.

May import: the package root's bottom modules (errors, names, interrupt, progress).
"""

__all__ = []
