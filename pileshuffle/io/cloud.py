"""Where Cloud Storage requests go and as whom: one rule for every client of the process.

- ``STORAGE_EMULATOR_HOST`` set (``http://host:port``, or ``host:port``, taken as http): every
  client goes there anonymously and nothing looks for credentials: Beam's ``gcsio`` and
  ``google-cloud-storage`` (they read the variable; Beam's 4 retried credential lookups, 15-25 s
  per process, are skipped), ``pyarrow.fs.GcsFileSystem`` (given the endpoint: it ignores the
  variable), and DataLoader workers (they inherit the environment).
- otherwise Google's credential chain (Application Default Credentials), looked up once per
  process: the pyarrow file system is made once and kept.

Fail fast: the first request to a bucket (``first_contact``) gets ``FIRST_CONTACT_SECONDS`` of
retries, so a wrong endpoint, missing credentials, a missing bucket or a refused permission is
one line naming the path within 30 s; a service that answers busy (429, 5xx) is there, and is
waited out even then. After it, a transient error (429, 503, a dropped connection: passing
states of a healthy service) is retried with backoff for ``TRANSIENT_RETRY_SECONDS``, and said
on stderr while it lasts: by ``patiently`` around the pyarrow reads (pyarrow itself gets
``ATTEMPT_SECONDS`` windows), and by ``report_retries`` for google-cloud-storage's own retries
under Beam.
"""

import datetime
import functools
import logging
import os
import re
import sys
import threading
import time

from pileshuffle.errors import InputError, PileshuffleError

__all__ = [
    "EMULATOR_VARIABLE",
    "FIRST_CONTACT_SECONDS",
    "TRANSIENT_RETRY_SECONDS",
    "ATTEMPT_SECONDS",
    "emulator",
    "arrow_gcs",
    "configure_beam",
    "first_contact",
    "explain",
    "create_if_absent",
    "read_range",
    "patiently",
    "patiently_on",
    "report_retries",
    "refused",
    "refusals_explained",
]

EMULATOR_VARIABLE = "STORAGE_EMULATOR_HOST"
# pyarrow's default is 15 minutes of retries, and without credentials it waits out all of them.
# 8 s of retries ends in about 12 s when nothing answers: one line well within 30 s.
FIRST_CONTACT_SECONDS = 8
# google-cloud-storage's (and so Beam's) default deadline: a 503 or 429 burst outlives a few
# seconds.
TRANSIENT_RETRY_SECONDS = 120
# pyarrow's own retries per attempt of ``patiently``: short, so a persisting error is said on
# stderr.
ATTEMPT_SECONDS = 5
_TRANSIENT = re.compile(
    r"UNAVAILABLE|RESOURCE_EXHAUSTED|DEADLINE_EXCEEDED|\b(429|500|502|503|504)\b|"
    r"Retry policy exhausted|Could not connect|Connection reset"
)


def _transient(error: BaseException) -> bool:
    return bool(_TRANSIENT.search(str(error)))


def _answered_busy(error: BaseException) -> bool:
    """Whether ``error`` is Cloud Storage answering 429 or 5xx: it is there and reachable,
    unlike an endpoint that does not answer, which the first contact must not wait out."""
    return _cause(str(error)) in (_THROTTLED, _UNAVAILABLE)


def emulator():
    """``(scheme, "host:port")`` of the emulator ``STORAGE_EMULATOR_HOST`` names, or None. A value
    without a scheme is made ``http://`` in the environment too: google-cloud-storage needs it."""
    value = os.environ.get(EMULATOR_VARIABLE, "").strip().rstrip("/")
    if not value:
        return None
    if "://" not in value:
        value = f"http://{value}"
        os.environ[EMULATOR_VARIABLE] = value
    scheme, _, host = value.partition("://")
    return scheme, host


@functools.lru_cache(maxsize=None)
def _arrow_gcs(endpoint, retry_seconds: float):
    import pyarrow.fs as pafs

    limit = datetime.timedelta(seconds=retry_seconds)
    if endpoint is None:
        return pafs.GcsFileSystem(retry_time_limit=limit)
    scheme, host = endpoint
    return pafs.GcsFileSystem(
        anonymous=True, scheme=scheme, endpoint_override=host, retry_time_limit=limit
    )


def arrow_gcs(retry_seconds: float = ATTEMPT_SECONDS):
    """The process's ``pyarrow.fs.GcsFileSystem`` under the endpoint rule (made once per
    endpoint)."""
    return _arrow_gcs(emulator(), retry_seconds)


def configure_beam():
    """Set up this process's Beam for Cloud Storage (idempotent, before its first request):
    report google-cloud-storage's retries (``report_retries``), skip its telemetry's bucket reads,
    and with an emulator named, tell Beam's credential cache there are none (anonymous), as Beam
    itself concludes after 4 retried lookups. Beam has no option for it: this sets the cache its
    ``auth`` module keeps (tests/test_gcs.py times a Beam process to catch a change)."""
    report_retries()
    # google-cloud-storage >= 3 reads the bucket's metadata for its telemetry with every new client,
    # and Beam makes a client per file operation: one more billed class B read per operation
    os.environ.setdefault("DISABLE_GCS_PYTHON_CLIENT_OTEL_BUCKET_METADATA", "true")
    if emulator() is None:
        return
    try:
        from apache_beam.internal.gcp import auth
    except ImportError:
        return
    with auth._Credentials._credentials_lock:
        auth._Credentials._credentials_init = True
        auth._Credentials._credentials = None


@functools.lru_cache(maxsize=None)
def _storage_client(endpoint):
    from google.cloud import storage as gcs  # google-cloud-storage: comes with apache-beam[gcp]

    # an emulator's anonymous client reads STORAGE_EMULATOR_HOST itself
    client = gcs.Client.create_anonymous_client() if endpoint is not None else gcs.Client()
    _pool_connections(client._http, CONNECTIONS)
    return client


# connections to Cloud Storage a process keeps open for reuse: pass 2's concurrent range reads
# (``part_fetch``, 32 a pile) in a few worker threads. Past it a request opens a connection and
# drops it after (requests' default keeps 10: one warning and one new connection a request).
# Not a wait for a free one: a connection never given back would hang every thread after it.
CONNECTIONS = 128


def _pool_connections(session, connections: int):
    """Keep up to ``connections`` open connections per host in ``session`` (a requests Session);
    an adapter of another kind (mutual TLS) is left as it is."""
    import requests

    for prefix, adapter in list(session.adapters.items()):
        if type(adapter) is requests.adapters.HTTPAdapter:
            session.mount(prefix, requests.adapters.HTTPAdapter(pool_maxsize=connections))


def create_if_absent(path: str, data: bytes):
    """Upload ``data`` as the ``gs://`` object ``path`` only if no object is there: one request
    with the precondition ``ifGenerationMatch=0``, so of two writers exactly one succeeds.
    ``FileExistsError`` when the object exists."""
    from google.api_core import exceptions

    first_contact(path)
    bucket, _, name = path[len("gs://") :].partition("/")
    blob = _storage_client(emulator()).bucket(bucket).blob(name)
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
    blob = _storage_client(emulator()).bucket(bucket).blob(name)
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
    one are raised as they are."""
    worth_waiting = worth_waiting or _transient
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
                f"pileshuffle: {path}: {explain(error)}; retrying ({waited:.0f} s so far)",
                file=sys.stderr,
            )
            time.sleep(min(2.0**tries, 16.0))


def patiently_on(path: str, filesystem, attempt):
    """``attempt()`` of a request to ``filesystem`` (pyarrow's): ``patiently`` unless it is the
    local file system, whose errors are not transient."""
    import pyarrow.fs as pafs

    return attempt() if isinstance(filesystem, pafs.LocalFileSystem) else patiently(path, attempt)


class _RetryReport(logging.Handler):
    """google-api-core's retry log ("Retrying due to ..."), as one line on stderr per retry."""

    def emit(self, record):
        found = re.match(r"Retrying due to (.*), sleeping ([0-9.]+)s", record.getMessage(), re.S)
        if found:
            print(
                f"pileshuffle: {explain(found.group(1))}; retrying in {found.group(2)} s",
                file=sys.stderr,
            )


def report_retries():
    """Say google-cloud-storage's retries on stderr (Beam's Cloud Storage requests go through
    it, and it retries 429, 5xx and dropped connections for up to 120 s, silently)."""
    logger = logging.getLogger("google.api_core.retry")
    if not any(isinstance(h, _RetryReport) for h in logger.handlers):
        logger.addHandler(_RetryReport(logging.DEBUG))
        logger.setLevel(logging.DEBUG)


_contacted, _contact_lock = set(), threading.Lock()


def first_contact(path: str):
    """Check once per process and bucket that ``path``'s bucket answers, in at most about 12 s:
    an ``InputError`` naming ``path`` and the cause otherwise; an answer that the service is busy
    (429, 5xx) is waited out as any later request's (``patiently``). Only ``gs://`` paths are
    checked."""
    if not path.startswith("gs://"):
        return
    bucket, _, name = path[len("gs://") :].partition("/")
    key = (emulator(), bucket)
    with _contact_lock:
        if key in _contacted:
            return
    # the first attempt gets the fail-fast window; a busy service's next ones a read's (Ctrl-C
    # waits for the window it falls in)
    windows = iter([FIRST_CONTACT_SECONDS])
    try:
        found = patiently(
            path,
            lambda: _bucket_found(bucket, name, next(windows, ATTEMPT_SECONDS)),
            worth_waiting=_answered_busy,
        )
    except OSError as error:
        raise InputError(path, explain(error)) from None
    if not found:
        raise InputError(path, f"bucket gs://{bucket} does not exist{_where()}")
    with _contact_lock:
        _contacted.add(key)


def _bucket_found(bucket: str, name: str, retry_seconds: float) -> bool:
    """Whether ``bucket`` exists, asked as an object reader may: the GET of ``name`` itself
    (storage.objects.get) first; only when nothing is there, the bucket's own GET
    (storage.buckets.get, which object roles lack: its refusal, after an object request that
    was allowed, says the bucket is there). pyarrow retries each for ``retry_seconds``."""
    import pyarrow.fs as pafs

    gcs, named = arrow_gcs(retry_seconds), bool(name.strip("/"))
    if named and gcs.get_file_info(f"{bucket}/{name}").type != pafs.FileType.NotFound:
        return True
    try:
        return gcs.get_file_info(bucket).type != pafs.FileType.NotFound
    except OSError as error:
        if named and refused(error):
            return True
        raise


def _where() -> str:
    found = emulator()
    return f" (on the emulator at {found[0]}://{found[1]}, {EMULATOR_VARIABLE})" if found else ""


# the service answered, busy: waited out, even at the first contact (``_answered_busy``)
_THROTTLED = "Cloud Storage is throttling requests (429){where}"
_UNAVAILABLE = "Cloud Storage is unavailable (5xx){where}"
_CAUSES = [  # (what the client library says, what it means), first match wins
    (
        r"OAuth2 access token|credentials were not found|DefaultCredentialsError",
        "no Google Cloud credentials found: run `gcloud auth application-default login`, set "
        "GOOGLE_APPLICATION_CREDENTIALS to a key file, or set STORAGE_EMULATOR_HOST for an "
        "emulator",
    ),
    (
        r"Could not connect|Couldn't connect|Connection refused|Failed to establish|"
        r"Could not resolve|Name or service not known|timed out|Timeout",
        "cannot reach Cloud Storage{where}",
    ),
    (r"\b429\b|Too Many Requests|RESOURCE_EXHAUSTED", _THROTTLED),
    (r"\b503\b|Service Unavailable|\b50[024]\b", _UNAVAILABLE),
    (r"PERMISSION_DENIED|\b403\b|Forbidden", "permission denied{where}"),
    (r"UNAUTHENTICATED|\b401\b|Unauthorized", "the credentials were refused{where}"),
    (r"NOT_FOUND|\b404\b|No such|does not exist", "not found{where}"),
]


_REFUSED = re.compile(
    r"PERMISSION_DENIED|\b403\b|Forbidden|UNAUTHENTICATED|\b401\b|Unauthorized|"
    r"OAuth2 access token|credentials were not found"
)


def refused(error: BaseException) -> bool:
    """Whether a client's error says the request was refused (permission, credentials): no
    retry or fallback changes that, and the user must hear it as such, not as "not found"."""
    return bool(_REFUSED.search(str(error)))


def refusals_explained(operation):
    """``operation`` (its first argument a path, a pattern or a list of them), with a refusal
    by a remote store (``refused``: permission, credentials) raised as an ``InputError`` naming
    the path and the cause in one line. Every ``storage`` operation wears it."""

    @functools.wraps(operation)
    def explained(where, *args, **kwargs):
        try:
            return operation(where, *args, **kwargs)
        except PileshuffleError:
            raise
        except Exception as error:
            path = where[0] if isinstance(where, (list, tuple)) and where else where
            if isinstance(path, str) and refused(error):
                filesystem = kwargs.get("filesystem", args[0] if args else None)
                if getattr(filesystem, "type_name", "") == "gcs" and "://" not in path:
                    # a path on a pyarrow file system: named as the user wrote it
                    path = f"gs://{path}"
                raise InputError(path, explain(error)) from None
            raise

    return explained


def explain(error: BaseException) -> str:
    """One line saying what a Cloud Storage client's error means (its first line otherwise)."""
    text = str(error)
    meaning = _cause(text)
    if meaning is not None:
        return meaning.format(where=_where())
    first = text.strip().splitlines()[0] if text.strip() else type(error).__name__
    return first[:300]


def _cause(text: str):
    """The meaning (``_CAUSES``) of a client's error text, or None."""
    return next((meaning for pattern, meaning in _CAUSES if re.search(pattern, text)), None)
