"""Where Cloud Storage requests go and as whom: one rule for every client of the process; and
what a client's error means.

- ``STORAGE_EMULATOR_HOST`` set (``http://host:port``, or ``host:port``, taken as http): every
  client goes there anonymously and nothing looks for credentials: Beam's ``gcsio`` and
  ``google-cloud-storage`` (they read the variable; Beam's 4 retried credential lookups, 15-25 s
  per process, are skipped), ``pyarrow.fs.GcsFileSystem`` (given the endpoint: it ignores the
  variable), and DataLoader workers (they inherit the environment).
- otherwise Google's credential chain (Application Default Credentials), looked up once per
  process: the pyarrow file system is made once and kept.

An error is transient (429, 503, a dropped connection: passing states of a healthy service:
``transient``), the service answering busy (``answered_busy``), or a refusal (``refused``);
``explain`` says any of them in one line. pileshuffle's own requests are retried by
``cloud_requests``; google-cloud-storage's retries under Beam are said on stderr by
``report_retries``.
"""

import datetime
import functools
import logging
import os
import re
import sys

from pileshuffle.errors import InputError, PileshuffleError

__all__ = [
    "EMULATOR_VARIABLE",
    "ATTEMPT_SECONDS",
    "emulator",
    "where",
    "arrow_gcs",
    "storage_client",
    "configure_beam",
    "report_retries",
    "explain",
    "transient",
    "answered_busy",
    "refused",
    "refusals_explained",
]

EMULATOR_VARIABLE = "STORAGE_EMULATOR_HOST"
# pyarrow's own retries per attempt of ``cloud_requests.patiently``: short, so a persisting
# error is said on stderr.
ATTEMPT_SECONDS = 5


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


def storage_client():
    """The process's ``google.cloud.storage.Client`` under the endpoint rule (made once per
    endpoint)."""
    return _storage_client(emulator())


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


def where() -> str:
    """What an error adds to say that requests went to an emulator (``" (on the emulator at
    ...)"``), or nothing."""
    found = emulator()
    return f" (on the emulator at {found[0]}://{found[1]}, {EMULATOR_VARIABLE})" if found else ""


# the service answered, busy: waited out, even at the first contact (``answered_busy``)
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


_TRANSIENT = re.compile(
    r"UNAVAILABLE|RESOURCE_EXHAUSTED|DEADLINE_EXCEEDED|\b(429|500|502|503|504)\b|"
    r"Retry policy exhausted|Could not connect|Connection reset"
)


def transient(error: BaseException) -> bool:
    """Whether ``error`` is a passing state of a healthy service: worth trying again."""
    return bool(_TRANSIENT.search(str(error)))


def answered_busy(error: BaseException) -> bool:
    """Whether ``error`` is Cloud Storage answering 429 or 5xx: it is there and reachable,
    unlike an endpoint that does not answer, which the first contact must not wait out."""
    return _cause(str(error)) in (_THROTTLED, _UNAVAILABLE)


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
        return meaning.format(where=where())
    first = text.strip().splitlines()[0] if text.strip() else type(error).__name__
    return first[:300]


def _cause(text: str):
    """The meaning (``_CAUSES``) of a client's error text, or None."""
    return next((meaning for pattern, meaning in _CAUSES if re.search(pattern, text)), None)
