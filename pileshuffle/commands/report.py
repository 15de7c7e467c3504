"""What every command shares on the command line: our errors as one line and exit code 2,
and the summaries printed after a run, an append or a materialize."""

import functools
import logging
import sys

from pileshuffle import interrupt
from pileshuffle.engine.inputs import describe_left_out, describe_skipped
from pileshuffle.errors import (
    HOLD_WORKER_STDERR,
    PileshuffleError,
    UsageError,
    find_error,
    user_message,
)
from pileshuffle.names import STORE_KIND, manifest_path, store_dir

__all__ = [
    "summary",
    "reporting_errors",
    "store_summary",
    "as_command",
    "shards_at_stake_on_interrupt",
    "store_at_stake_on_interrupt",
    "finished_at",
    "submitted",
    "dedup_units",
]


def summary(manifest: dict, finished: str = None) -> str:
    """The lines printed after a run or a materialize: counts, bytes, piles, time, what
    ``--input`` matched but was left out or skipped, and where the manifest is (a store's
    manifest: ``store_summary``). ``finished``: the output is an earlier run's, finished then
    (``finished_at``); its line replaces the time and speed, which this command did not take."""
    if manifest.get("kind") == STORE_KIND:
        return store_summary(manifest)
    lines = _totals_lines(manifest, finished)
    if manifest.get("between_passes"):
        payload_bytes = manifest["totals"]["payload_bytes"]
        lines.append(_between_passes_line(manifest["between_passes"], payload_bytes))
    if manifest.get("balance"):
        lines.append(_balance_line(manifest["balance"]))
    lines += _input_not_shuffled_lines(manifest)
    lines.append(f"manifest  {manifest_path(manifest['output'])}")
    return "\n".join(lines)


def _totals_lines(manifest: dict, finished: str) -> list:
    """A shard manifest's records (what its fingerprints prove), bytes and piles, and the time and
    speed of the run (or ``finished``: when the earlier run that wrote it finished)."""
    totals = manifest["totals"]
    seconds = manifest.get("wall_seconds") or manifest.get("seconds") or float("nan")
    piles = manifest["pile_records"]
    balance, dedup = manifest.get("balance"), manifest.get("dedup")
    return [
        _dedup_records_line(dedup)
        if dedup
        else f"records   {totals['records']:,} (fingerprints of input and output match)"
        if not balance
        else f"records   {totals['records']:,}: the input's "
        f"{manifest['input_fingerprint']['records']:,} and their copies "
        f"(fingerprints of what pass 1 put in and the output match)",
        f"bytes     {totals['payload_bytes']:,} payload, {totals['shard_bytes']:,} in "
        f"{manifest['num_piles']} shard(s)",
        f"piles     {manifest['num_piles']}; records per pile "
        f"min {piles['min']:,} / mean {piles['mean']:,.0f} / max {piles['max']:,}; split again: "
        f"{manifest['piles_split']}",
        f"finished  {finished} (an earlier run: nothing was run now)"
        if finished
        else f"time      {seconds:.2f} s, {totals['payload_bytes'] / 1e6 / seconds:,.1f} MB/s",
    ]


def _input_not_shuffled_lines(manifest: dict) -> list:
    """What of the input a shard manifest says the run did not shuffle: files ``--input`` matched
    but left out or skipped, names of files already matched (read once), corrupt records and blank
    lines."""
    lines = []
    if manifest.get("inputs_left_out"):
        left_out = manifest["inputs_left_out"]
        lines.append(
            f"left out  {len(left_out)} file(s) that --input matched but pileshuffle wrote: "
            f"{describe_left_out(left_out)}"
        )
    if manifest.get("inputs_skipped"):
        skipped = manifest["inputs_skipped"]
        lines.append(
            f"skipped   {len(skipped)} matched name(s) that are not input files: "
            f"{describe_skipped(skipped)}"
        )
    if manifest.get("input_duplicates"):
        duplicates = manifest["input_duplicates"]
        lines.append(
            f"duplicate {len(duplicates)} name(s) of files already matched, read once: "
            + ", ".join(f"{name} = {kept}" for name, kept in sorted(duplicates.items())[:3])
            + (", ..." if len(duplicates) > 3 else "")
        )
    if manifest["skipped"]["records"]:
        lines.append(
            f"skipped   {manifest['skipped']['records']} corrupt record(s), "
            f"{manifest['skipped']['bytes']:,} bytes"
        )
    if manifest["skipped"].get("blank_lines"):
        lines.append(
            f"blank     {manifest['skipped']['blank_lines']:,} blank line(s) in the input: not "
            "records"
        )
    return lines


def finished_at(path: str) -> str:
    """When the file at ``path`` (a manifest: written last) was written, as ``YYYY-MM-DD HH:MM:SS
    UTC``; "at an unknown time" when its file system does not say."""
    import datetime

    from apache_beam.io.filesystems import FileSystems

    try:
        seconds = FileSystems.last_updated(path)
    except Exception:  # noqa: BLE001 - a file system without modification times
        return "at an unknown time"
    when = datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc)
    return when.strftime("%Y-%m-%d %H:%M:%S UTC")


def _between_passes_line(carried: dict, payload_bytes: int) -> str:
    """How the records went from pass 1 to pass 2: written to storage (per payload byte), kept
    in memory, carried by the runner's shuffle (what is nonzero; written always)."""
    written = carried["written_bytes"]
    parts = [
        f"{written / 1e6:,.1f} MB written ({written / max(1, payload_bytes):.2f} per payload byte)"
    ]
    if carried["in_memory_bytes"]:
        parts.append(f"{carried['in_memory_bytes'] / 1e6:,.1f} MB kept in memory")
    if carried["shuffled_bytes"]:
        parts.append(f"{carried['shuffled_bytes'] / 1e6:,.1f} MB through the runner's shuffle")
    return "between   " + ", ".join(parts)


class _HideReportedErrors(logging.Filter):
    """Drop the runner's log records (with tracebacks) of a failure that is one of our own
    errors: ``main`` reports those in one line."""

    def filter(self, record):
        if record.levelno < logging.ERROR or not record.name.startswith("apache_beam"):
            return True
        if (
            record.exc_info
            and record.exc_info[1] is not None
            and find_error(record.exc_info[1]) is not None
        ):
            return False
        try:
            text = record.getMessage()
        except Exception:
            return True
        return "pileshuffle.errors." not in text and user_message(Exception(text)) is None


def reporting_errors(command) -> int:
    """Exit code of ``command()``; our errors (and runner errors that wrap one) are one
    line on stderr and exit code 2, with the runner's own logging of them held back."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    for handler in logging.getLogger().handlers:
        handler.addFilter(_HideReportedErrors())
    try:
        return command()
    except PileshuffleError as error:
        print(f"pileshuffle: error: {error}", file=sys.stderr)
        return 2
    except Exception as error:
        message = user_message(error)
        if message is None:
            raise
        print(f"pileshuffle: error: {message}", file=sys.stderr)
        return 2


def _dedup_records_line(dedup: dict) -> str:
    """A manifest's ``dedup`` section: records read, kept and dropped, and the largest group."""
    by = dedup_units(dedup.get("field"))
    largest = (
        f"largest group: {dedup['largest_groups'][0]['copies']:,} copies; "
        if dedup["largest_groups"]
        else ""
    )
    return (
        f"records   {dedup['records_kept']:,} distinct {by} kept of {dedup['records_read']:,} "
        "read; "
        f"{dedup['records_dropped']:,} duplicates dropped ({largest}"
        f"fingerprints of what was read and what was kept and dropped match)"
    )


def dedup_units(field) -> str:
    """What a deduplicated output holds one of each of, as summaries say it: ``records``, or
    ``values of 'url'`` (``field``: the ``--dedup_key``, None for whole records)."""
    return "records" if field is None else f"values of {field!r}"


def _balance_line(balance: dict) -> str:
    """A manifest's (or a store generation's) ``balance`` section: the records per class
    before and after."""
    return f"balance   {balance['label']!r}, {balance['policy']}: " + ", ".join(
        f"{c} {balance['records_before'][c]:,} -> {balance['records_after'][c]:,}"
        for c in sorted(balance["records_before"])
    )


def _store_dedup_line(manifest: dict, dedup: dict) -> str:
    """A dedup store: what the readers get, and the newest generation's copies (``dedup``: its
    section, with the store's options ``dedup`` and ``dedup_key``)."""
    by = dedup_units(dedup.get("dedup_key"))
    earlier = sum(dedup["copies_of_earlier"].values())
    return (
        f"distinct  {manifest['totals']['distinct']:,} distinct {by} visible in the window; the "
        "newest generation "
        f"added {dedup['distinct_new']:,} new, {dedup['copies_within']:,} repeat(s) of its own "
        f"and {earlier:,} of "
        f"older live generations (hidden while those live)"
    )


def store_summary(manifest: dict) -> str:
    """A store version in a few lines: live generations and records, the newest generation, time."""
    generations = manifest["generations"]
    newest = generations[-1] if generations else None
    lines = [
        f"store     version {manifest['version']}: {len(generations)} live generation(s), "
        f"{manifest['totals']['records']:,} records, {manifest['totals']['payload_bytes']:,} "
        "payload bytes, "
        f"{manifest['num_piles']} piles"
    ]
    if newest is not None:
        lines.append(
            f"newest    generation {newest['generation']}: {newest['records']:,} records from "
            f"{len(newest['inputs'])} input file(s), {len(newest['files'])} file(s) "
            f"({newest.get('writers', 1)} writer(s) x {manifest['num_piles']} piles at most)"
        )
        if newest.get("balance"):
            lines.append(_balance_line(newest["balance"]))
        if newest.get("dedup"):
            lines.append(_store_dedup_line(manifest, newest["dedup"]))
    seconds = manifest.get("wall_seconds")
    if seconds and newest is not None:
        lines.append(
            f"time      {seconds:.2f} s, {newest['payload_bytes'] / 1e6 / seconds:,.1f} MB/s"
        )
    return "\n".join(lines)


def as_command(function):
    """A store command's ``main(argv)``: ``function(argv)`` with our errors in one line
    (``reporting_errors``) and a bad value (a size, a time) as a usage error; it keeps
    ``function``'s name and docstring."""

    @functools.wraps(function)
    def main(argv=None):

        from pileshuffle.engine.tuning import keep_freed_memory

        keep_freed_memory()
        HOLD_WORKER_STDERR["on"] = True
        return reporting_errors(
            lambda: _values_as_usage_errors(function, list(sys.argv[1:] if argv is None else argv))
        )

    return main


def _values_as_usage_errors(function, argv):
    """A ValueError from parsing a command's values (a size, a time) is a usage error."""
    try:
        return function(argv)
    except ValueError as error:
        if isinstance(error, PileshuffleError):
            raise
        raise UsageError(str(error)) from error


def shards_at_stake_on_interrupt(output: str):
    """What Ctrl-C leaves of a run or materialize that writes shards at ``output``."""
    interrupt.describe(
        f"nothing was published at {output}; run the same command again (it removes what this one "
        f"left and writes the same shards)",
        f"it had published {manifest_path(output)}: the output is complete",
    )


def submitted(result, output: str) -> str:
    """What to tell the user about a job that was submitted and not waited for."""
    job_id = None
    try:
        if getattr(result, "has_job", False):
            job_id = result.job_id()
    except Exception:
        job_id = None
    where = f"job {job_id} submitted" if job_id else "job submitted"
    return f"{where}; {manifest_path(output)} appears when it has finished"


def store_at_stake_on_interrupt(prefix: str, version: int = None):
    """What Ctrl-C leaves of a command that publishes the next version of the store at
    ``prefix``."""
    store, now = (
        store_dir(prefix),
        "" if version is None else f": it is still at version {version}",
    )
    interrupt.describe(
        f"nothing was published to {store}{now}; run the same command again (it removes what this "
        "one "
        f"left and writes the same generation)",
        f"it had published {store}'s next version"
        if version is None
        else f"it had published version {version + 1} of {store}",
    )
