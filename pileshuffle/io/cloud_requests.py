"""pileshuffle's own requests to Cloud Storage: retried while the service is passing through
a transient state, said on stderr while they are, and given up at once on Ctrl-C.

Fail fast: the first request to a bucket (``first_contact``) gets ``FIRST_CONTACT_SECONDS`` of
retries, so a wrong endpoint, missing credentials, a missing bucket or a refused permission is
one line naming the path within 30 s; a service that answers busy (429, 5xx) is there, and is
waited out even then. After it, a transient error (``cloud.transient``) is retried with backoff
for ``TRANSIENT_RETRY_SECONDS``, one line on stderr a retry (``patiently``; pyarrow itself gets
``cloud.ATTEMPT_SECONDS`` windows). A request ``patiently`` makes for the main thread runs in a
thread of its own while the main thread waits for it, so Ctrl-C is acted on at once, not when
the client's retries of that attempt end (1-8 s later in an outage).
"""

import sys
import threading
import time

from pileshuffle.errors import InputError
from pileshuffle.io import cloud

__all__ = [
    "FIRST_CONTACT_SECONDS",
    "TRANSIENT_RETRY_SECONDS",
    "first_contact",
    "create_if_absent",
    "read_range",
    "patiently",
    "patiently_on",
    "patiently_writing",
]

# pyarrow's default is 15 minutes of retries, and without credentials it waits out all of them.
# 8 s of retries ends in about 12 s when nothing answers: one line well within 30 s.
FIRST_CONTACT_SECONDS = 8
# google-cloud-storage's (and so Beam's) default deadline: a 503 or 429 burst outlives a few
# seconds.
TRANSIENT_RETRY_SECONDS = 120


def create_if_absent(path: str, data: bytes):
    """Upload ``data`` as the ``gs://`` object ``path`` only if no object is there: one request
    with the precondition ``ifGenerationMatch=0``, so of two writers exactly one succeeds.
    ``FileExistsError`` when the object exists."""
    from google.api_core import exceptions

    first_contact(path)
    bucket, _, name = path[len("gs://") :].partition("/")
    blob = cloud.storage_client().bucket(bucket).blob(name)
    try:
        blob.upload_from_string(data, if_generation_match=0, timeout=FIRST_CONTACT_SECONDS * 4)
    except exceptions.PreconditionFailed:
        if blob.download_as_bytes() == data:  # a retried request whose first attempt went through
            return
        raise FileExistsError(17, f"{path} exists") from None


def read_range(path: str, offset: int, length: int) -> bytes:
    """``length`` bytes of the ``gs://`` object ``path`` from ``offset``: one ranged GET (no
    metadata read first), retried like every other request (``patiently``)."""
    first_contact(path)
    bucket, _, name = path[len("gs://") :].partition("/")
    blob = cloud.storage_client().bucket(bucket).blob(name)
    data = patiently(
        path,
        lambda: blob.download_as_bytes(
            start=offset, end=offset + length - 1, checksum=None, timeout=FIRST_CONTACT_SECONDS * 4
        ),
    )
    if len(data) != length:
        raise OSError(
            f"{path}: read {len(data):,} bytes at {offset:,} where {length:,} were expected "
            "(a shorter object)"
        )
    return data


def patiently(path: str, attempt, worth_waiting=None):
    """``attempt()``, tried again with backoff while it fails with a transient Cloud Storage
    error (or one ``worth_waiting(error)`` says is), for up to ``TRANSIENT_RETRY_SECONDS``; each
    retry is one line on stderr. A permanent error (not found, permission) and the last transient
    one are raised as they are. ``attempt`` changes no file: on the main thread it runs in a
    thread of its own that Ctrl-C does not wait for (``_interruptibly``)."""
    return _retried(path, lambda: _interruptibly(attempt), worth_waiting or cloud.transient)


def patiently_writing(path: str, attempt):
    """``patiently``, for an ``attempt`` that writes a file: it runs in the caller's thread, so
    that the caller's clean-up after Ctrl-C comes after it, never beside it."""
    return _retried(path, attempt, cloud.transient)


def _retried(path: str, attempt, worth_waiting):
    """``attempt()``, tried again while ``worth_waiting`` says its error is (``patiently``)."""
    started, tries = time.monotonic(), 0
    while True:
        try:
            return attempt()
        except OSError as error:
            waited = time.monotonic() - started
            if not worth_waiting(error) or waited > TRANSIENT_RETRY_SECONDS:
                raise
            tries += 1
            print(
                f"pileshuffle: {path}: {cloud.explain(error)}; retrying ({waited:.0f} s so far)",
                file=sys.stderr,
            )
            time.sleep(min(2.0**tries, 16.0))


def _interruptibly(attempt):
    """``attempt()``. On the main thread it runs in a daemon thread while the main thread waits,
    in a wait that a signal interrupts: a pyarrow request holds the main thread in C until its
    own retries end, and Python runs a signal handler only when that thread is back. An attempt
    given up that way ends on its own; its answer is dropped."""
    if threading.current_thread() is not threading.main_thread():
        return attempt()
    outcome, answered = [], threading.Event()

    def ask():
        try:
            outcome.append((True, attempt()))
        except BaseException as error:  # handed to the caller as the attempt raised it
            outcome.append((False, error))
        finally:
            answered.set()

    threading.Thread(target=ask, name="pileshuffle-request", daemon=True).start()
    answered.wait()
    succeeded, value = outcome[0]
    if not succeeded:
        raise value
    return value


def patiently_on(path: str, filesystem, attempt):
    """``attempt()`` of a request to ``filesystem`` (pyarrow's): ``patiently`` unless it is the
    local file system, whose errors are not transient."""
    import pyarrow.fs as pafs

    return attempt() if isinstance(filesystem, pafs.LocalFileSystem) else patiently(path, attempt)


_contacted, _contact_lock = set(), threading.Lock()


def first_contact(path: str):
    """Check once per process and bucket that ``path``'s bucket answers, in at most about 12 s:
    an ``InputError`` naming ``path`` and the cause otherwise; an answer that the service is busy
    (429, 5xx) is waited out as any later request's (``patiently``). Only ``gs://`` paths are
    checked."""
    if not path.startswith("gs://"):
        return
    bucket, _, name = path[len("gs://") :].partition("/")
    key = (cloud.emulator(), bucket)
    with _contact_lock:
        if key in _contacted:
            return
    # the first attempt gets the fail-fast window; a busy service's next ones a read's
    windows = iter([FIRST_CONTACT_SECONDS])
    try:
        found = patiently(
            path,
            lambda: _bucket_found(bucket, name, next(windows, cloud.ATTEMPT_SECONDS)),
            worth_waiting=cloud.answered_busy,
        )
    except OSError as error:
        raise InputError(path, cloud.explain(error)) from None
    if not found:
        raise InputError(path, f"bucket gs://{bucket} does not exist{cloud.where()}")
    with _contact_lock:
        _contacted.add(key)


def _bucket_found(bucket: str, name: str, retry_seconds: float) -> bool:
    """Whether ``bucket`` exists, asked as an object reader may: the GET of ``name`` itself
    (storage.objects.get) first; only when nothing is there, the bucket's own GET
    (storage.buckets.get, which object roles lack: its refusal, after an object request that
    was allowed, says the bucket is there). pyarrow retries each for ``retry_seconds``."""
    import pyarrow.fs as pafs

    gcs, named = cloud.arrow_gcs(retry_seconds), bool(name.strip("/"))
    if named and gcs.get_file_info(f"{bucket}/{name}").type != pafs.FileType.NotFound:
        return True
    try:
        return gcs.get_file_info(bucket).type != pafs.FileType.NotFound
    except OSError as error:
        if named and cloud.refused(error):
            return True
        raise
