"""Pass 1's units of work: input files, spans of large ones, groups of them, and what each read.

A ``Source`` is one input file, or a span of one (``split_sources``): the records that start in a
byte range, so several workers read one large file and a format's reader gives each record to
exactly one span. ``source_groups`` packs consecutive sources into units of about the same
bytes; pass 1 reports a ``SourceStats`` per source, added up per file (``stats_by_file``) for the
manifest and its checks. Pure: the same file list and budget give the same units on any runner.
"""

import dataclasses
import math

from pileshuffle.errors import IntegrityError
from pileshuffle.records.fingerprint import Fingerprint

__all__ = [
    "Source",
    "SourceStats",
    "split_sources",
    "source_groups",
    "stats_by_file",
    "check_spans_chain",
]


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
    span: tuple = None  # the bytes of the file read (None: all of it)
    # ``ReadReport.reached``: where the span's first record starts, where the next span's must
    reached: tuple = None
    blank_lines: int = 0  # JSONL's blank lines, which are no records
    size: int = None  # the file's bytes (all of it, also for a span)

    @staticmethod
    def of(
        source: Source, fingerprint: Fingerprint, report, emitted=None, classes=None
    ) -> "SourceStats":
        return SourceStats(
            source.id,
            source.path,
            fingerprint,
            report.skipped_records,
            report.skipped_bytes,
            tuple(report.problems),
            emitted,
            tuple((c, r, e) for c, (r, e) in sorted((classes or {}).items())),
            source.span,
            report.reached,
            report.blank_lines,
            source.size,
        )

    @property
    def put_in(self) -> Fingerprint:
        return self.fingerprint if self.emitted is None else self.emitted


def stats_by_file(stats) -> list:
    """``SourceStats`` of the spans of one file added up into the file's, in file id order
    (one per file: what a manifest lists and ``verify`` compares), once ``check_spans_chain``."""
    by_file = {}
    for one in sorted(stats, key=lambda s: (s.source, s.span or ())):
        by_file.setdefault(one.source, []).append(one)
    merged = []
    for spans in by_file.values():
        check_spans_chain(spans)
        whole = spans[0]
        for one in spans[1:]:
            whole = dataclasses.replace(
                whole,
                fingerprint=whole.fingerprint + one.fingerprint,
                skipped_records=whole.skipped_records + one.skipped_records,
                skipped_bytes=whole.skipped_bytes + one.skipped_bytes,
                problems=whole.problems + one.problems,
                blank_lines=whole.blank_lines + one.blank_lines,
                emitted=None if whole.emitted is None else whole.emitted + one.emitted,
            )
        merged.append(dataclasses.replace(whole, span=None, reached=None))
    return merged


def check_spans_chain(spans):
    """Refuse (``IntegrityError``) the spans of one file (in file order) unless their readers agree
    where records start: a span whose first record was found by a search (a TFRecord frame by its
    CRCs) must start it where the span before stopped walking, and one that found none must lie
    wholly before that place. Otherwise a payload read as a record, and records would be lost or
    repeated: nothing is published."""
    walk = None  # where the walk of the spans so far goes on
    for one in spans:
        if one.reached is None:
            continue
        first, goes_on = one.reached
        if walk is not None and (first != walk if first is not None else walk < one.span[1]):
            raise IntegrityError(
                f"{one.path}: read in spans, its readers disagree where records start (the span "
                f"from byte {one.span[0]:,} starts at byte "
                f"{first if first is not None else 'none'}, the one before ends at "
                f"byte {walk:,}): a record's payload holds bytes that read as a whole record "
                "there; nothing was published. Such a file cannot be read in spans: give it "
                "compressed (.gz is read whole) or as smaller files"
            )
        walk = goes_on if first is not None else walk


# a small input is still cut into this many units of work, so every worker has some
_MIN_GROUPS = 16


def _unit_bytes(sources, budget: int) -> float:
    """The bytes of one unit of pass 1's work: ``budget``, or a sixteenth of the input if less."""
    return min(budget, sum(s.span_bytes for s in sources) / _MIN_GROUPS)


def split_sources(sources, budget: int, fmt, skip_corrupt: bool = False) -> list:
    """``sources`` with each file of two units (``_unit_bytes``) or more, or of more than
    ``budget``, that ``fmt`` can read in spans (``RecordFormat.can_split``) cut into equal spans of
    one to two units and at most ``budget`` (what fills one run), so several workers read one
    large file. Spans are byte ranges; ``fmt`` gives each record to the span it starts in."""
    unit = _unit_bytes(sources, budget)
    split = []
    for source in sources:
        pieces = max(int(source.size // unit), math.ceil(source.size / budget)) if unit > 0 else 1
        if pieces <= 1 or not fmt.can_split(source.path, skip_corrupt):
            split.append(source)
            continue
        bounds = [source.size * i // pieces for i in range(pieces + 1)]
        split.extend(dataclasses.replace(source, span=(a, b)) for a, b in zip(bounds, bounds[1:]))
    return split


def source_groups(sources, budget: int) -> list:
    """``sources`` (in id order, spans in file order) cut into pass 1's units of work: runs of
    consecutive sources of at least a unit (``_unit_bytes``) each, the last may be less, and of
    at most ``budget`` (what fills one run: a group beyond it would spill into a second, tiny run
    whose parts double pass 2's reads); a larger source is alone. A writer's run then fills
    however small the files are. A pure function of the file list and the budget: a re-run
    forms the same groups and writes the same runs."""
    target = _unit_bytes(sources, budget)
    groups, group, held = [], [], 0
    for source in sources:
        if group and held + source.span_bytes > budget:
            groups.append(tuple(group))
            group, held = [], 0
        group.append(source)
        held += source.span_bytes
        if held >= target:
            groups.append(tuple(group))
            group, held = [], 0
    if group:
        groups.append(tuple(group))
    return groups
