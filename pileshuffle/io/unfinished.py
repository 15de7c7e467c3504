"""What a run that has not finished leaves at an output prefix, in words: ``verify``, ``info``
and the loader name it instead of saying that nothing is there.

A shard output is finished when ``{P}-manifest.json`` exists. Before that, a run holds the
output's lock (``{P}.pileshuffle-lock``, naming its command, host and pid) and stages shards
in ``{P}.pileshuffle-staging``. A run killed before it published leaves both; running the
same command again takes the lock over (its process is gone), clears what was left and writes
the output. Reads through ``pileshuffle.io.storage`` only: the loader uses it too.
"""

import os
import re
import socket

from pileshuffle.io import storage
from pileshuffle.names import manifest_path, output_lock_path, staging_dir

__all__ = ["unfinished_run"]


def unfinished_run(prefix: str, filesystem=None, shown: str = None):
    """Why ``prefix`` holds no finished output although a run has been there (its lock or its
    staging folder, no manifest), as the problem after ``{shown}: `` (``shown``: the prefix as
    the user wrote it, gs://...): the run, whether it still runs, and the command that finishes
    or clears it. None when no run has left anything there, or its manifest is in place."""
    shown = shown or prefix
    lock, staging = output_lock_path(prefix), staging_dir(prefix)
    if storage.exists(manifest_path(prefix), filesystem):
        return None
    locked = storage.exists(lock, filesystem)
    if not locked and not (
        storage.exists(staging, filesystem) or storage.is_folder(staging, filesystem)
    ):
        return None
    holder = _holder(lock, filesystem) if locked else {}
    where = {
        "lock": output_lock_path(shown),
        "staging": staging_dir(shown),
        "manifest": manifest_path(shown),
    }
    return _described(holder, _running(holder), where)


def _holder(lock: str, filesystem) -> dict:
    """The lock's holder (command, host, pid, since; a job's name), {} when it cannot be read."""
    try:
        holder = storage.read_json(lock, filesystem)
    except Exception:  # a lock being written or damaged still marks an unfinished run
        return {}
    return holder if isinstance(holder, dict) else {}


def _running(holder: dict):
    """Whether the lock's holder still runs: True, False (a process of this host that is gone),
    or None (a job, another host's process, an unreadable lock: it cannot be told from here)."""
    pid = holder.get("pid")
    if holder.get("job") or holder.get("host") != socket.gethostname() or not isinstance(pid, int):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _described(holder: dict, running, where: dict) -> str:
    """The problem text for an unfinished run whose lock names ``holder`` ({}: no lock, or
    unreadable)."""
    since = re.sub(r"\.[0-9]+", "", str(holder.get("since", "?")))
    command = holder.get("command")
    again = "run that command again" if command else "run the same `pileshuffle run` command again"
    clear = (
        f"delete {where['staging']}, {where['lock']} and the run's .pileshuffle-work-* folder"
        if holder
        else f"delete {where['staging']} and the run's .pileshuffle-work-* folder"
    )
    if holder.get("job"):
        return (
            f"no finished output yet: Dataflow job {holder['job']} (launched {since}) holds it: "
            f"wait for it to publish {where['manifest']}; if it failed or was cancelled, {again} "
            f"to write the output, or {clear} to clear what it left"
        )
    who = (
        f"`{command}` (pid {holder.get('pid')} on {holder.get('host')}, started {since})"
        if command
        else "a run"
    )
    if running:
        return (
            f"no finished output yet: {who} is writing it now: wait for it to publish "
            f"{where['manifest']}"
        )
    if running is None and command:
        return (
            f"no finished output yet: {who} holds it and may still be running there: wait for it "
            f"to publish {where['manifest']}; if it stopped, {again} to finish it, or {clear} to "
            "clear what it left"
        )
    return (
        f"an unfinished run is there, not a finished output: {who} stopped before it published "
        f"{where['manifest']}; {again} to finish it (it clears what was left and writes the "
        f"output), or {clear} to clear it"
    )
