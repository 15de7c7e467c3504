"""gcp-storage-emulator in this process, made faithful where pileshuffle depends on it.

The emulator ignores the precondition ``ifGenerationMatch=0`` (create only if absent) that Cloud
Storage honours and that a store's lock and version manifests are committed with: without it two
writers would both "win". ``start`` adds it: an upload with that precondition onto an existing
object gets Cloud Storage's answer, 412 Precondition Failed (checked and created under one lock).
The same tests run against a real bucket (PILESHUFFLE_TEST_BUCKET), where the service enforces it.
It also injects the faults the tests need on purpose, on objects named for them: a 503 outage
and a refused permission (403); and on buckets named for it, the refusal of the bucket's own GET
that a caller with only object permissions gets (roles/storage.objectAdmin has no
storage.buckets.get).
"""

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


# Objects whose name holds FLAKY answer every read with 503 for FLAKY_SECONDS from the first one:
# a transient outage, which clients must retry through (and say so while it lasts).
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
            import time

            started = first_seen.setdefault(name, time.monotonic())
            if time.monotonic() - started < FLAKY_SECONDS:
                response.status = HTTPStatus.SERVICE_UNAVAILABLE
                response.json(SERVICE_UNAVAILABLE)
                return
        return handler(request, response, storage, *args, **kwargs)

    return flaky


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


def _inject_outages():
    for _, handlers in emulator_server.HANDLERS:
        for method, handler in list(handlers.items()):
            if handler is buckets.get:
                handlers[method] = _bucket_get_refused_when_named(handler)
            elif handler in (objects.get, objects.download):
                handlers[method] = _refused_when_named(_unavailable_for_a_while(handler))
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
    _inject_outages()
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
