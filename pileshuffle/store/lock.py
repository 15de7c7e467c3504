"""The store's lock, ``{P}-store/LOCK``, and the lock file it is one of.

Every command that changes a store holds its lock from before it reads the current version
until after it publishes. A lock file is created exclusively, whole or not at all, and names
its holder (command, host, pid, time, a token): a lock whose holder was a process on this host
that no longer runs is stale and taken over; any other lock refuses, naming its holder. A
token releases only the lock it took. ``FileLock`` is also the shard output's lock
(``planning.locations.OutputLock``).

A command that publishes the store's next version holds its lock from before it reads the current
manifest until it has published (``store_lock``); killed at any point, the store stays readable at
its previous version, and the same command run again finishes the job.
"""

import contextlib
import dataclasses
import json
import os
import socket
import sys
import uuid

from pileshuffle import interrupt
from pileshuffle.engine.output_files import (
    lock_holder_at,
    missing_local_folders,
    release_lock_file,
    remove_empty_folders,
)
from pileshuffle.errors import OutputError
from pileshuffle.io import storage
from pileshuffle.names import STORE_LOCK_NAME as LOCK_NAME
from pileshuffle.names import store_dir
from pileshuffle.store.layout import now_iso

__all__ = [
    "FileLock",
    "StoreLock",
    "lock_path",
    "lock_holder",
    "release_lock",
    "remove_if_empty",
    "command_line",
    "store_lock",
]


@dataclasses.dataclass
class FileLock:
    """A lock file at ``path``, created exclusively and naming its holder (command, host,
    pid, time, a token). A lock whose holder was a process on this host that no longer runs
    is stale and taken over (a killed command's re-run must be able to finish it); any
    other lock refuses, naming its holder. ``acquire()`` returns the token that ``release``
    needs (the step that publishes may run in another process); ``held()`` is the context
    manager that releases on success, failure and interruption alike."""

    path: str
    command: str
    what: str = ""  # what the lock guards, as a refusal names it
    same_process_is_stale: bool = False  # composed use: a failed pipeline of this process left it
    # a job that outlives this process holds the lock after it (``held(handed_over=True)``)
    job: str = None

    def acquire(self) -> str:
        """Take the lock; returns its token. It returns the token or leaves no lock of its own:
        a Ctrl-C that comes while the lock is being created (it takes effect as that step
        ends) removes it again."""
        token = uuid.uuid4().hex
        holder = {
            "command": self.command,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "since": now_iso(),
            "token": token,
            **({"job": self.job} if self.job else {}),
        }
        data = json.dumps(holder).encode()
        for _ in range(3):
            try:
                self._create(data)
            except FileExistsError:
                current = lock_holder_at(self.path)
                if current is not None and not self._stale(current):
                    raise OutputError(self.refusal(current)) from None
                try:
                    storage.delete([self.path])  # stale: its holder died
                except Exception:
                    pass
            except BaseException:
                self.release(token)
                raise
            else:
                return token
        raise OutputError(f"cannot take {self.path}: it keeps reappearing")

    def refusal(self, holder: dict) -> str:
        return (
            f"{self.what} is locked by `{holder.get('command')}` (pid {holder.get('pid')} on "
            f"{holder.get('host')}, since {holder.get('since')}); wait for it to finish, or delete "
            f"{self.path} if that process is gone"
        )

    def release(self, token: str):
        """Remove the lock if ``token`` still holds it (best effort; Ctrl-C does not cut it)."""
        with interrupt.not_cut():
            release_lock_file(self.path, token)

    @contextlib.contextmanager
    def held(self, handed_over: bool = False):
        """Hold the lock; on leaving, release it and remove the local folders taking it
        created if they are empty (a failed or refused command leaves no folder behind).
        ``handed_over``: on leaving without an error the lock stays, held by ``job``,
        which releases it (by its token)."""
        created = missing_local_folders(storage.split(self.path)[0])
        token = self.acquire()
        try:
            yield token
        except BaseException:
            self.release(token)
            remove_empty_folders(created)
            raise
        if not handed_over:
            self.release(token)
            remove_empty_folders(created)

    def _create(self, data: bytes):
        try:
            storage.makedirs(storage.split(self.path)[0] or ".")
        except OSError as error:
            raise OutputError(f"cannot write the lock {self.path}: {error}") from error
        try:  # whole content or nothing: a killed command never leaves an empty lock
            storage.create_exclusive(self.path, data, f"{self.path}.tmp-{uuid.uuid4().hex[:12]}")
        except FileExistsError:
            raise
        except OSError as error:
            raise OutputError(f"cannot write the lock {self.path}: {error}") from error

    def _stale(self, holder: dict) -> bool:
        """Whether the holder is gone: a process of this host that no longer runs (a
        job's lock is never stale)."""
        if (
            holder.get("job")
            or holder.get("host") != socket.gethostname()
            or not isinstance(holder.get("pid"), int)
        ):
            return False
        if holder["pid"] == os.getpid():
            return self.same_process_is_stale
        try:
            os.kill(holder["pid"], 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False


class StoreLock(FileLock):
    """``{P}-store/LOCK``: held by every command that changes the store, from before it
    reads the current version until after it publishes."""

    def __init__(self, prefix: str, command: str, same_process_is_stale: bool = False):
        super().__init__(lock_path(prefix), command, store_dir(prefix), same_process_is_stale)
        self.prefix = prefix


def lock_path(prefix: str) -> str:
    """The store lock's path: ``{P}-store/LOCK``."""
    return storage.join(store_dir(prefix), LOCK_NAME)


def lock_holder(prefix: str):
    """The store lock's holder (dict), None if unlocked."""
    return lock_holder_at(lock_path(prefix))


def release_lock(prefix: str, token: str):
    """Remove the store lock if ``token`` still holds it (best effort)."""
    StoreLock(prefix, "").release(token)


def remove_if_empty(prefix: str):
    """Remove the store's folder if it holds nothing (what taking the lock of a store that did
    not exist created). Local only: an object store has no empty folders. ``rmdir`` checks
    emptiness atomically, so a lock another command has just taken there stays."""
    if not storage.is_remote(store_dir(prefix)):
        with contextlib.suppress(OSError):
            os.rmdir(store_dir(prefix))


def command_line() -> str:
    """How a lock names the command that holds it: this process's command line, its program
    by name."""
    return " ".join([os.path.basename(sys.argv[0]) if sys.argv else "python", *sys.argv[1:]])


@contextlib.contextmanager
def store_lock(prefix: str, command: str):
    """Hold the store's lock for a command that publishes its next version; yields the
    token. The publication releases it (``PublishGeneration``), or the command does when it
    has nothing to publish. A refusal, failure or Ctrl-C releases it and removes the store
    folder if that holds nothing else: a first run that published nothing leaves no
    ``-store`` folder."""
    token, created = None, missing_local_folders(storage.split(prefix)[0])
    # taking the lock too: a Ctrl-C as it is taken leaves neither the lock nor the folder it made
    try:
        token = StoreLock(prefix, command).acquire()
        yield token
    except BaseException:
        # one step: no lock, nor an empty folder, is left by a Ctrl-C inside it
        with interrupt.not_cut():
            if token is not None:
                release_lock(prefix, token)
            remove_if_empty(prefix)
            remove_empty_folders(created)  # and the folders above it this command made
        raise
