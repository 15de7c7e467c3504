"""Where a run writes, decided and checked before it writes anything: ``--output`` as a prefix
of file names (no wildcards, hiding no store, its files replaceable: ``check_shard_output``),
the run's temp directory (``work_dir_for``: the same for every run of one output) and a probe
that a location takes writes (``check_writable``); ``plan.make_plan`` only reads.

``taken_output`` then probes and takes them under the output's lock,
``{output}.pileshuffle-lock``: one writer of an output at a time. ``run`` takes it before it
touches the output's files and holds it until it has published or cleaned up, so two runs never
share a work folder and a second launch never removes the work of a first. A job that outlives
its launcher (Dataflow) is handed the lock: it names the job and stays when the launcher
returns, and the job's last step releases it after publishing
(``transforms.finalize.Finalize``). A process's lock whose process is gone is stale and taken
over; a job's lock never is: the refusal says how to take over the output of a job that has
ended.
"""

import contextlib
import hashlib
import logging
import re
import uuid

from pileshuffle import interrupt
from pileshuffle.engine.output_files import (
    check_replaceable,
    discard_unpublished,
    missing_local_folders,
    remove_empty_folders,
    remove_tree,
)
from pileshuffle.errors import OutputError
from pileshuffle.io import storage
from pileshuffle.names import manifest_path, output_lock_path, staging_dir, store_dir, work_dir_name
from pileshuffle.store.layout import is_store
from pileshuffle.store.lock import FileLock

__all__ = [
    "work_dir_for",
    "check_writable",
    "check_shard_output",
    "output_prefix",
    "OutputLock",
    "taken_output",
]

_log = logging.getLogger("pileshuffle")


def work_dir_for(output: str, temp_location) -> str:
    """The run's temp directory: deterministic per output, so a re-run after a crash
    finds and replaces what a killed run left."""
    if temp_location:
        _refuse_unexpanded_home("--temp_location", temp_location)
        _refuse_wildcards("--temp_location", temp_location)
    digest = hashlib.sha1(output.encode()).hexdigest()[:12]
    root = temp_location or storage.split(output)[0]
    return storage.join(root, work_dir_name(digest))


def check_writable(directory: str, what: str):
    """Write and delete a probe file in ``directory``, one step Ctrl-C does not cut; leaves no
    directory it created (and removes only empty ones: another run may be filling the same
    folder)."""
    probe = storage.join(directory, f".probe-{uuid.uuid4().hex[:8]}")
    missing = missing_local_folders(directory)
    try:
        with interrupt.not_cut():  # a Ctrl-C between the write and the delete left the probe behind
            with storage.open_write(probe, "uncompressed") as handle:
                handle.write(b"ok")
            storage.delete([probe])
    except Exception as error:
        raise OutputError(f"cannot write to {what} {directory}: {error}") from error
    finally:
        remove_empty_folders(missing)


def check_shard_output(text: str, overwrite: bool) -> tuple:
    """``--output`` of a command that writes shards (``run``, ``materialize``), before it reads
    or writes anything: a prefix of file names without wildcards, hiding no store, and its files
    replaceable (``check_replaceable``). Returns ``(prefix, OutputFiles)``."""
    output = output_prefix(text)
    _refuse_hiding_a_store(output)
    return output, check_replaceable(output, overwrite)


def output_prefix(text: str) -> str:
    """``--output`` as a prefix of file names; one that ends in a slash names a folder."""
    if not text:
        raise OutputError("--output: is required (a prefix of file names, e.g. --output=out/train)")
    if text.endswith(("/", "\\")):
        raise OutputError(
            f"--output {text}: ends with '/', but the output is a prefix of file names, "
            f"not a folder: give e.g. --output {text}train "
            f"(shards {text}train-00000-of-..., {text}train-manifest.json)"
        )
    _refuse_unexpanded_home("--output", text)
    _refuse_wildcards("--output", text)
    return text


def _refuse_unexpanded_home(option: str, location: str):
    """A location starting with ``~`` would be a folder named ``~`` here
    (``storage.unexpanded_home``): refused, naming the path meant, before anything is written."""
    advice = storage.unexpanded_home(location)
    if advice:
        raise OutputError(
            f"{option} {location}: this would be a folder named ~ in the current one; {advice}"
        )


def _refuse_wildcards(option: str, location: str):
    """A location a run writes and deletes under must hold no ``* ? [ ]``: Beam's
    ``FileSystems.delete`` takes every path as a pattern (it has no escape), so deleting
    ``t[1]-00000-...`` would delete ``t1-00000-...`` instead."""
    found = sorted(set(re.findall(r"[*?\[\]]", location)))
    if found:
        raise OutputError(
            f"{option} {location}: holds {' '.join(found)}, which Beam's file systems take as "
            "wildcards when they list and delete files (there is no escape): choose a location "
            "without * ? [ ]"
        )


def _refuse_hiding_a_store(output: str):
    """Shards at a store's prefix would hide it: readers and ``verify`` take
    ``{P}-manifest.json`` first (as ``run --layout store`` refuses the reverse)."""
    if is_store(output):
        raise OutputError(
            f"a pile store exists at {store_dir(output)}/: shards at --output {output} would hide "
            f"it from the loader and verify (they read {manifest_path(output)} first); write the "
            f"shards elsewhere, e.g. `pileshuffle materialize --store {output} --output OTHER`"
        )


class OutputLock(FileLock):
    """``{output}.pileshuffle-lock``: held by a ``run`` from before it touches the output's files
    until it has published or cleaned up, so two runs never share a work folder; a Dataflow job
    holds it after its launcher has returned (``job``), until it has published."""

    def __init__(self, output: str, command: str, job: str = None):
        super().__init__(output_lock_path(output), command, f"output {output}", job=job)

    def refusal(self, holder: dict) -> str:
        output = self.what[len("output ") :]
        if holder.get("job"):
            return (
                f"output {output} is locked by Dataflow job {holder['job']} "
                f"(launched {holder.get('since')} from {holder.get('host')}), which may still be "
                "running: wait for it to publish; if it failed or was cancelled "
                f"(`gcloud dataflow jobs list --filter name={holder['job']}`), delete {self.path} "
                "to take the output over"
            )
        return (
            f"output {output} is locked by a run started at {holder.get('since')} (pid "
            f"{holder.get('pid')} on {holder.get('host')}: `{holder.get('command')}`); wait for it "
            f"to finish, or delete {self.path} if that process is gone"
        )


@contextlib.contextmanager
def taken_output(output: str, overwrite: bool, work_dir: str, command: str, job: str = None):
    """Hold the shard output ``output`` (from ``check_shard_output``) for a command that writes
    it, with ``work_dir`` its temp folder; yields the lock's token. First probe that both
    locations can be written (leaving nothing behind), then take ``OutputLock`` (released on
    success, failure and Ctrl-C; with ``job``, a submitted job's name, kept on success for the
    job to release) and, under it, check the output again (another command may have published
    meanwhile) and remove what an unfinished run left: its journal's files, staging and work
    folders."""
    check_writable(staging_dir(output), "the output location")
    check_writable(work_dir, "the temp location")
    with OutputLock(output, command, job).held(handed_over=job is not None) as token:
        check_shard_output(output, overwrite)
        removed = discard_unpublished(output)
        if removed:
            _log.warning(
                "removed %d file(s) under %s that an unfinished run was publishing "
                "(its journal lists them)",
                len(removed),
                output,
            )
        remove_tree(work_dir)
        yield token
