"""Planning a job: the plan, sizes and bounds, memory limits, the template's parameters, runners.

May import: the package root's bottom modules, io, records, formats, engine, store, verify and
quality.
"""

__all__ = []
