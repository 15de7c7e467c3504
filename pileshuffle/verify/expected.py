"""The fingerprint a shard output must have, recomputed from its input as the run read it.

The input is re-read with the run's options: corrupt records skipped only if the run skipped
them, under ``--dedup`` only the first of each distinct record kept (keyed as the run keyed
them), under ``--balance`` each record counted as many times as the run copied it. Nothing here
reads the output: ``checks`` compares the two.
"""

from typing import NamedTuple

from pileshuffle.engine.dedup import Dedup, distinct_fingerprint
from pileshuffle.formats import ReadReport, read_fingerprint
from pileshuffle.formats.base import DEFAULT_CHUNK_BYTES
from pileshuffle.records.fingerprint import Fingerprint

__all__ = ["copies_fingerprint", "InputRead", "read_input", "with_copies"]


class InputRead(NamedTuple):
    """The input as re-read: its fingerprint, the distinct records' (``--dedup``, else None), the
    corrupt records skipped, the blank lines, and {path: records} of each file."""

    fingerprint: Fingerprint
    distinct: Fingerprint | None
    skipped: int
    blank: int
    per_file: dict


def read_input(fmt, sources, manifest, skip_corrupt: bool) -> InputRead:
    """``sources`` re-read as the run read them (with ``--dedup`` if the ``manifest`` has it)."""
    dedup = Dedup.from_options((manifest or {}).get("options"))
    input_fp, distinct, reports, per_file = Fingerprint(), None, [], {}
    if dedup is not None:
        input_fp, distinct = distinct_fingerprint(
            _content_chunks(fmt, sources, dedup, skip_corrupt, reports, per_file)
        )
    else:
        for source in sources:
            with fmt.read_once(source.path, source.size):
                fingerprint, report, _ = read_fingerprint(fmt, source.path, skip_corrupt)
            input_fp += fingerprint
            reports.append(report)
            per_file[source.path] = fingerprint.records
    skipped = sum(r.skipped_records for r in reports)
    blank = sum(r.blank_lines for r in reports)
    return InputRead(input_fp, distinct, skipped, blank, per_file)


def _content_chunks(fmt, sources, dedup, skip_corrupt: bool, reports: list, per_file: dict):
    """``(content hashes, record hashes, lengths)`` of every chunk of ``sources`` in input order,
    as a ``--dedup`` run keys them (``Dedup.file_contents``); each file's ``ReadReport`` appended
    to ``reports``."""
    from pileshuffle.formats import record_lengths

    for source in sources:
        report, records = ReadReport(), 0
        with fmt.read_once(source.path, source.size):
            for table, hashes, contents in dedup.file_contents(
                fmt, source.path, skip_corrupt, report
            ):
                yield contents, hashes, record_lengths(table)
                records += table.num_rows
        reports.append(report)
        per_file[source.path] = records


def with_copies(fmt, sources, manifest: dict, skip_corrupt: bool) -> Fingerprint:
    """The fingerprint of the input's records each as many times as ``--balance`` copies it,
    recomputed from the input as the run did (``copies_fingerprint``)."""
    from pileshuffle.engine.balance import from_manifest_options

    field, policy, keep_unlabeled = from_manifest_options(manifest.get("options", {}))
    return copies_fingerprint(
        fmt, sources, field, policy, int(manifest.get("seed") or 0), skip_corrupt, keep_unlabeled
    )


def copies_fingerprint(
    fmt,
    sources,
    field: str,
    policy,
    seed: int,
    skip_corrupt: bool = False,
    keep_unlabeled: bool = False,
) -> Fingerprint:
    """The fingerprint of ``sources``' records (``Source``s, ids = ranks as pass 1 numbered
    them) each as many times as ``policy`` copies it: their classes counted, then each
    record's copies, as pass 1 computes them (for a shard output, and a store's generation)."""
    from pileshuffle.engine.transforms.assign import INPUT_STREAM, copies_balance, keyed_chunks

    balance = copies_balance(fmt, sources, field, policy, seed, skip_corrupt, keep_unlabeled)
    total = Fingerprint()
    for source in sources:
        with fmt.read_once(source.path, source.size):
            for _, _, hashes, lengths, _ in keyed_chunks(
                fmt,
                source,
                seed,
                (INPUT_STREAM, source.id),
                DEFAULT_CHUNK_BYTES,
                skip_corrupt,
                ReadReport(),
                balance,
            ):
                total += Fingerprint.of(hashes, int(lengths.sum()))
    return total
