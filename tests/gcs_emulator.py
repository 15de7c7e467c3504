"""gcp-storage-emulator in this process, made faithful where pileshuffle depends on it.

The emulator ignores the precondition ``ifGenerationMatch=0`` (create only if absent) that Cloud
Storage honours and that a store's lock and version manifests are committed with: without it two
writers would both "win". ``start`` adds it: an upload with that precondition onto an existing
object gets Cloud Storage's answer, 412 Precondition Failed (checked and created under one lock).
The same tests run against a real bucket (PILESHUFFLE_TEST_BUCKET), where the service enforces it.
It also injects the faults the tests need on purpose, on objects named for them: a 503 outage,
a refused permission (403) and a download cut off midway; and on buckets named for it, the refusal of the bucket's own GET
that a caller with only object permissions gets (roles/storage.objectAdmin has no
storage.buckets.get).
"""

import os
import threading
from http import HTTPStatus

from gcp_storage_emulator import server as emulator_server
from gcp_storage_emulator.exceptions import NotFound
from gcp_storage_emulator.handlers import buckets, objects

PRECONDITION_FAILED = {
    "error": {
        "code": 412,
        "message": "At least one of the pre-conditions you specified did not hold.",
        "errors": [
            {
                "reason": "conditionNotMet",
                "domain": "global",
                "message": "At least one of the pre-conditions you specified did not hold.",
            }
        ],
    }
}


def _object_name(request):
    if "name" in request.query:
        return request.query["name"][0]
    data = request.data
    return data.get("meta", {}).get("name") if isinstance(data, dict) else None


def _insert_if_absent(insert):
    lock = threading.Lock()

    def guarded(request, response, storage, *args, **kwargs):
        if request.query.get("ifGenerationMatch", [None])[0] != "0":
            return insert(request, response, storage, *args, **kwargs)
        with lock:
            try:
                storage.get_file_obj(request.params["bucket_name"], _object_name(request))
            except NotFound:
                return insert(request, response, storage, *args, **kwargs)
            response.status = HTTPStatus.PRECONDITION_FAILED
            response.json(PRECONDITION_FAILED)

    guarded.honours_preconditions = True
    return guarded


# Objects whose name holds FLAKY answer every read with 503 for FLAKY_SECONDS from the first one
# (``flaky-503-2s``: for 2 s): a transient outage, which clients must retry through (and say so
# while it lasts).
FLAKY, FLAKY_SECONDS = "flaky-503", 7.0
SERVICE_UNAVAILABLE = {
    "error": {
        "code": 503,
        "message": "Service Unavailable (the emulator's injected outage)",
        "errors": [{"reason": "backendError", "domain": "global", "message": "Backend Error"}],
    }
}


def _unavailable_for_a_while(handler):
    first_seen = {}

    def flaky(request, response, storage, *args, **kwargs):
        name = request.path
        if FLAKY in name:
            import re
            import time

            started = first_seen.setdefault(name, time.monotonic())
            given = re.search(FLAKY + r"-(\d+)s", name)
            if time.monotonic() - started < (float(given.group(1)) if given else FLAKY_SECONDS):
                response.status = HTTPStatus.SERVICE_UNAVAILABLE
                response.json(SERVICE_UNAVAILABLE)
                return
        return handler(request, response, storage, *args, **kwargs)

    return flaky


# Objects whose name holds CUT answer their first download of more than CUT_AFTER bytes with the
# whole Content-Length but only the first CUT_AFTER bytes of the body, then close the connection:
# a download dropped midway, which a reader must resume (or retry) and never take as the object.
# Each path cut is added to the file ``cut_log(port)`` names, a line each.
CUT, CUT_AFTER = "cut-once", 64 * 1024


def cut_log(endpoint: str) -> str:
    """The file where the emulator at ``endpoint`` lists the paths whose download it cut."""
    import tempfile

    return os.path.join(tempfile.gettempdir(), f"emulator-{endpoint.rsplit(':', 1)[1]}-cuts")


def cut_paths(endpoint: str) -> list:
    """The request paths (``/bucket/name`` or ``/download/...``) whose download was cut."""
    with open(cut_log(endpoint)) as log:
        return log.read().splitlines()


def _cut_once_when_named(handler, log: str):
    cut = set()

    def cut_once(request, response, storage, *args, **kwargs):
        handler(request, response, storage, *args, **kwargs)
        name = request.path
        if CUT not in name or name in cut or len(response._content) <= CUT_AFTER:
            return
        cut.add(name)
        with open(log, "a") as listed:
            listed.write(name + "\n")
        whole = len(response._content)

        def close_midway():
            handler_ = response._handler
            handler_.send_response(response.status.value, response.status.phrase)
            for key, value in response._headers.items():
                handler_.send_header(key, value)
            handler_.send_header("Content-Length", str(whole))
            handler_.end_headers()
            handler_.wfile.write(response._content[:CUT_AFTER])
            handler_.close_connection = True

        response.close = close_midway

    return cut_once


# Objects whose name holds FORBIDDEN refuse every request with 403, as for a caller without permission.
FORBIDDEN = "forbidden-403"
PERMISSION_DENIED = {
    "error": {
        "code": 403,
        "message": "caller does not have storage.objects.get access (injected)",
        "errors": [{"reason": "forbidden", "domain": "global", "message": "Forbidden"}],
    }
}


def _refused_when_named(handler):
    def refused(request, response, storage, *args, **kwargs):
        if (
            FORBIDDEN in request.path
            or FORBIDDEN in str(request.query.get("prefix", ""))
            or FORBIDDEN in str(request.query.get("name", ""))
        ):
            response.status = HTTPStatus.FORBIDDEN
            response.json(PERMISSION_DENIED)
            return
        return handler(request, response, storage, *args, **kwargs)

    return refused


# Buckets whose name holds OBJECTS_ONLY refuse their own GET with 403: objects in them are served.
OBJECTS_ONLY = "objects-only"


def _bucket_get_refused_when_named(handler):
    def refused(request, response, storage, *args, **kwargs):
        if OBJECTS_ONLY in request.path:
            response.status = HTTPStatus.FORBIDDEN
            response.json(PERMISSION_DENIED)
            return
        return handler(request, response, storage, *args, **kwargs)

    return refused


def _inject_outages(cuts: str):
    for _, handlers in emulator_server.HANDLERS:
        for method, handler in list(handlers.items()):
            if handler is buckets.get:
                handlers[method] = _bucket_get_refused_when_named(handler)
            elif handler in (objects.get, objects.download):
                handler = _cut_once_when_named(_unavailable_for_a_while(handler), cuts)
                handlers[method] = _refused_when_named(handler)
            elif handler in (objects.ls, objects.insert):
                handlers[method] = _refused_when_named(handler)


def _honour_create_if_absent():
    if getattr(objects.insert, "honours_preconditions", False):
        return
    guarded = _insert_if_absent(objects.insert)
    for _, handlers in emulator_server.HANDLERS:
        for method, handler in list(handlers.items()):
            if handler is objects.insert:
                handlers[method] = guarded
    objects.insert = guarded  # the server's fallback for uploads posted without /upload


def serve(port: int, bucket: str):
    """Serve an in-memory emulator on 127.0.0.1:``port`` holding ``bucket`` until killed."""
    _honour_create_if_absent()
    open(cut_log(f"127.0.0.1:{port}"), "w").close()
    _inject_outages(cut_log(f"127.0.0.1:{port}"))
    server = emulator_server.create_server("127.0.0.1", port, in_memory=True, default_bucket=bucket)
    server.run()


def start(bucket: str):
    """``(process, endpoint)``: the emulator in a process of its own (in the tests' process, a
    pyarrow read and the emulator's single-threaded server wait on each other), answering."""
    import socket
    import subprocess
    import sys
    import time

    from helpers import free_port

    port = free_port()
    process = subprocess.Popen(
        [sys.executable, __file__, str(port), bucket],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return process, f"http://127.0.0.1:{port}"
        except OSError:
            if process.poll() is not None:
                break
            time.sleep(0.1)
    process.kill()
    raise RuntimeError(f"gcp-storage-emulator did not start on port {port}")


if __name__ == "__main__":
    import sys

    serve(int(sys.argv[1]), sys.argv[2])
