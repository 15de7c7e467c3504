"""Pass 1's units of work: input files, spans of large ones, groups of them, and what each read.

A ``Source`` is one input file, or a span of one (``split_sources``): the records that start in a
byte range, so several workers read one large file and a format's reader gives each record to
exactly one span. ``source_groups`` packs consecutive sources into units of about the same
bytes; pass 1 reports a ``SourceStats`` per source, added up per file (``stats_by_file``) for the
manifest and its checks. Pure: the same file list and budget give the same units on any runner.
"""

import dataclasses

from pileshuffle.fingerprint import Fingerprint

__all__ = ["Source", "SourceStats", "split_sources", "source_groups", "stats_by_file"]


@dataclasses.dataclass(frozen=True)
class Source:
    """One input file, or with ``span`` = ``(start, stop)`` the records that start in those bytes
    of it (``split_sources``); ``id`` is the file's rank in the sorted file list."""

    id: int
    path: str
    size: int
    span: tuple = None

    @property
    def span_bytes(self) -> int:
        """The bytes of the file this source reads."""
        return self.size if self.span is None else self.span[1] - self.span[0]


@dataclasses.dataclass(frozen=True)
class SourceStats:
    """What pass 1 read from one source (``fingerprint``) and put into the piles (``emitted``:
    the records with their copies under ``--balance``; None: the records as read)."""

    source: int
    path: str
    fingerprint: Fingerprint
    skipped_records: int = 0
    skipped_bytes: int = 0
    problems: tuple = ()
    emitted: Fingerprint = None
    classes: tuple = ()  # under --balance: ((class, records read, records emitted), ...)

    @staticmethod
    def of(source: Source, fingerprint: Fingerprint, report, emitted=None, classes=None) -> "SourceStats":
        return SourceStats(source.id, source.path, fingerprint, report.skipped_records, report.skipped_bytes,
                           tuple(report.problems), emitted, tuple((c, r, e) for c, (r, e) in sorted((classes or {}).items())))

    @property
    def put_in(self) -> Fingerprint:
        return self.fingerprint if self.emitted is None else self.emitted


def stats_by_file(stats) -> list:
    """``SourceStats`` of the spans of one file added up into the file's, in file id order
    (one per file: what a manifest lists and ``verify`` compares)."""
    by_file = {}
    for one in sorted(stats, key=lambda s: s.source):
        held = by_file.get(one.source)
        by_file[one.source] = one if held is None else dataclasses.replace(
            held, fingerprint=held.fingerprint + one.fingerprint, skipped_records=held.skipped_records + one.skipped_records,
            skipped_bytes=held.skipped_bytes + one.skipped_bytes, problems=held.problems + one.problems,
            emitted=None if held.emitted is None else held.emitted + one.emitted)
    return list(by_file.values())


_MIN_GROUPS = 16  # a small input is still cut into this many units of work, so every worker has some


def _unit_bytes(sources, budget: int) -> float:
    """The bytes of one unit of pass 1's work: ``budget``, or a sixteenth of the input if less."""
    return min(budget, sum(s.span_bytes for s in sources) / _MIN_GROUPS)


def split_sources(sources, budget: int, fmt) -> list:
    """``sources`` with each file of two units (``_unit_bytes``) or more that ``fmt`` can read in
    spans (``RecordFormat.can_split``) cut into spans of one to two units, so several workers
    read one large file. Spans are byte ranges; ``fmt`` gives each record to the span it starts in."""
    unit = _unit_bytes(sources, budget)
    split = []
    for source in sources:
        pieces = int(source.size // unit) if unit > 0 else 1  # spans of one to two units: each a group alone
        if pieces <= 1 or not fmt.can_split(source.path):
            split.append(source)
            continue
        bounds = [source.size * i // pieces for i in range(pieces + 1)]
        split.extend(dataclasses.replace(source, span=(a, b)) for a, b in zip(bounds, bounds[1:]))
    return split


def source_groups(sources, budget: int) -> list:
    """``sources`` (in id order, spans in file order) cut into pass 1's units of work: runs of
    consecutive sources of at least a unit (``_unit_bytes``) each; the last may be less, a larger
    source is alone. A writer's buffer then fills before it flushes however small the files are.
    A pure function of the file list and the budget: a re-run forms the same groups and writes
    the same runs."""
    target = _unit_bytes(sources, budget)
    groups, group, held = [], [], 0
    for source in sources:
        group.append(source)
        held += source.span_bytes
        if held >= target:
            groups.append(tuple(group))
            group, held = [], 0
    if group:
        groups.append(tuple(group))
    return groups
