"""Planning a job: the plan, sizes and bounds, memory budgets, the template's parameters, runner
defaults, a run's plan made in one descent (``launch``) and its output's lock (``locations``).

May import: the package root's bottom modules, io, records, formats, engine, store, verify and
quality.
"""

__all__ = []
