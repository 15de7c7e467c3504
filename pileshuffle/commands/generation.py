"""Writing a store's next generation, as ``run --layout store`` and ``append`` do.

Every command that changes the store holds its lock from before it reads the current
manifest until it has published (``store_lock``), deletes what a killed command of its own
kind left (unpublished generation directories) before it writes, and publishes one manifest
version last. Killed at any point, the store stays readable at its previous version; the
same command run again finishes the job.
"""

import contextlib
import time

from pileshuffle import interrupt, names
from pileshuffle.commands.running import execute
from pileshuffle.engine.output_files import missing_local_folders, remove_empty_folders
from pileshuffle.errors import OutputError
from pileshuffle.io import storage
from pileshuffle.store import layout, lock
from pileshuffle.store import write as store_write
from pileshuffle.store.write import build_generation, writer_groups

__all__ = [
    "same_inputs",
    "input_identity",
    "at_stake_on_interrupt",
    "store_lock",
    "write_generation",
]


def same_inputs(generation: dict, sources) -> bool:
    """Whether a generation was written from exactly ``sources`` (paths and sizes): a re-run."""
    listed = {(i["path"], i.get("bytes")) for i in generation["inputs"]}
    return listed == {(s.path, s.size) for s in sources}


def input_identity(path: str, size) -> tuple:
    """What makes an input the same file under any name: its real identity (resolved real
    path on a local disk, bucket + object on gs://; ``inputs.file_identity``) and its size."""
    from pileshuffle.engine.inputs import file_identity

    return file_identity(path), size


def at_stake_on_interrupt(prefix: str, version: int = None):
    """What Ctrl-C leaves of a command that publishes the next version of the store at
    ``prefix``."""
    store, now = (
        names.store_dir(prefix),
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
        token = lock.StoreLock(prefix, command).acquire()
        yield token
    except BaseException:
        with (
            interrupt.not_cut()
        ):  # one step: no lock, nor an empty folder, is left by a Ctrl-C inside it
            if token is not None:
                lock.release_lock(prefix, token)
            lock.remove_if_empty(prefix)
            remove_empty_folders(created)  # and the folders above it this command made
        raise


def write_generation(
    options, prefix, base, sources, seed, skip_corrupt, token, wait=None, allow_duplicates=False
):
    """Pass 1 of ``sources`` into the store as generation ``base['next_generation']``
    (under ``store_lock``); a failure or Ctrl-C removes the generation's directory."""
    layout.remove_unpublished(prefix)
    try:
        generation = base["next_generation"]
        groups = writer_groups(sources, store_write.STORE_WRITERS)
        sizes = {s.path: s.size for s in sources}
        identities = {s.path: input_identity(s.path, s.size)[0] for s in sources}
        started = time.time()
        result = execute(
            options,
            lambda p: build_generation(
                p,
                prefix,
                base,
                generation,
                groups,
                seed,
                skip_corrupt,
                token,
                sizes,
                identities,
                allow_duplicates,
            ),
            len(groups),
            wait=wait,
        )
        if result is not None:
            return result
        manifest = layout.read_store_manifest(prefix)
        if manifest is None or manifest["version"] != base["version"] + 1:
            raise OutputError(
                f"the pipeline finished but {names.store_dir(prefix)} has no version "
                f"{base['version'] + 1}"
            )
    except BaseException:
        layout.remove_unpublished(prefix)
        raise
    manifest["wall_seconds"] = time.time() - started
    return manifest
