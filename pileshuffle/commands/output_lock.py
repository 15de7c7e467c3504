"""The shard output's lock, ``{output}.pileshuffle-lock``: one writer of an output at a time.

``run`` takes it before it touches the output's files and holds it until it has published or
cleaned up, so two runs never share a work folder and a second launch never removes the work of
a first. A job that outlives its launcher (Dataflow) is handed the lock: it names the job and
stays when the launcher returns, and the job's last step releases it after publishing
(``transforms.finalize.Finalize``). A process's lock whose process is gone is stale and taken over;
a job's lock never is: the refusal says how to take over the output of a job that has ended.
"""

import contextlib
import logging

from pileshuffle.engine.output_files import discard_unpublished, remove_tree
from pileshuffle.names import output_lock_path, staging_dir
from pileshuffle.planning.locations import check_shard_output, check_writable
from pileshuffle.store.lock import FileLock

__all__ = ["OutputLock", "taken_output"]

_log = logging.getLogger("pileshuffle")


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
