"""Many byte ranges of objects, fetched concurrently and delivered in the order asked.

Pass 2 in files mode reads a pile's parts, one byte range of a pass-1 run each: thousands of
ranged GETs per pile at tens of ms each. ``in_order`` hands them over in the order given (the
pile's canonical order: the same bytes out) while fetching ahead out of order:

- ranges of one object that overlap or lie within ``gap`` bytes of each other are one request
  (``coalesce``; a merged request grows to at most ``MAX_REQUEST_BYTES`` unless its ranges
  overlap); ranges of different objects never are;
- at most ``in_flight`` requests run at once (threads: the Cloud Storage client and pyarrow
  wait on the network without the interpreter lock), and the read-ahead, the bytes of requests
  started and not yet handed over in full, stays within ``bytes_in_flight``; the request that
  holds the next range is always started, so one larger than the bound still goes (alone);
- a request is ``storage.read_range``: its retries and refusals are the ones every read has
  (``cloud_requests.patiently``, google-cloud-storage's own retries,
  ``cloud.refusals_explained``). A final failure is one line naming the object and the byte
  range (``RangeReadError``).

Measured on the emulator behind a 30 ms proxy: bench/pass2_fetch.py, docs/performance.md.
"""

import collections
import concurrent.futures
import dataclasses

from pileshuffle.errors import OutputError, PileshuffleError
from pileshuffle.io import cloud, storage

__all__ = [
    "IN_FLIGHT",
    "BYTES_IN_FLIGHT",
    "GAP_BYTES",
    "MAX_REQUEST_BYTES",
    "Request",
    "RangeReadError",
    "coalesce",
    "in_order",
]

IN_FLIGHT = 32  # requests at once per call (a pile): a 30-50 ms GET then costs ~1-2 ms a part
BYTES_IN_FLIGHT = 128 << 20  # read-ahead per call: started, not yet handed over (the pile's bytes)
GAP_BYTES = 64 << 10  # ranges of one object this close are one request (the gap read and dropped)
MAX_REQUEST_BYTES = 16 << 20  # a merged request grows no larger: large reads still go in parallel


@dataclasses.dataclass(frozen=True)
class Request:
    """One ranged read: ``length`` bytes of ``path`` from ``offset``; ``parts`` are the ranges it
    serves, ``(index in the call, start within the request, length)``, in index order."""

    path: str
    offset: int
    length: int
    parts: tuple


class RangeReadError(OutputError):
    """A range of a pass-2 part that could not be read once the retries were spent."""


def coalesce(ranges, gap: int = GAP_BYTES, max_request: int = MAX_REQUEST_BYTES) -> list:
    """The ``Request``s that read ``ranges`` (``(path, offset, length)``), ordered by the first
    range each serves. Ranges of one path that overlap, or are at most ``gap`` apart, share a
    request unless it would pass ``max_request`` bytes (overlapping ones always share)."""
    by_path = collections.defaultdict(list)
    for index, (path, offset, length) in enumerate(ranges):
        by_path[path].append((offset, length, index))
    requests = []
    for path, spans in by_path.items():
        spans.sort()
        start, end, members = spans[0][0], spans[0][0] + spans[0][1], [spans[0]]
        for offset, length, index in spans[1:]:
            overlaps, merged_end = offset < end, max(end, offset + length)
            if overlaps or (offset - end <= gap and merged_end - start <= max_request):
                end, members = merged_end, members + [(offset, length, index)]
                continue
            requests.append(_request(path, start, end, members))
            start, end, members = offset, offset + length, [(offset, length, index)]
        requests.append(_request(path, start, end, members))
    return sorted(requests, key=lambda request: request.parts[0][0])


def _request(path: str, start: int, end: int, members: list) -> Request:
    parts = sorted((index, offset - start, length) for offset, length, index in members)
    return Request(path, start, end - start, tuple(parts))


def in_order(
    ranges, in_flight: int = None, bytes_in_flight: int = None, gap: int = None, read=None
):
    """The bytes of each of ``ranges`` (``(path, offset, length)``), as ``pyarrow.Buffer``s in the
    order given, fetched by ``coalesce``'s requests with at most ``in_flight`` at once and at
    most ``bytes_in_flight`` read ahead (see the module; None: this module's defaults, read when
    called). ``read(path, offset, length)`` reads one request (``storage.read_range``). Stopping
    early cancels the requests not yet started."""
    ranges = list(ranges)
    if not ranges:
        return
    requests = coalesce(ranges, GAP_BYTES if gap is None else gap)
    served_by = {}  # range index -> (request number, start within it, length)
    for number, request in enumerate(requests):
        for index, start, length in request.parts:
            served_by[index] = (number, start, length)
    window = _Window(
        requests,
        read or storage.read_range,
        in_flight or IN_FLIGHT,
        bytes_in_flight or BYTES_IN_FLIGHT,
    )
    yield from _deliver(len(ranges), requests, served_by, window)


def _deliver(count: int, requests, served_by, window):
    """The bytes of ranges 0 .. ``count``-1 in order, from ``window``'s requests; a request's
    buffer is let go once the last range it serves is handed over."""
    left = [len(request.parts) for request in requests]
    try:
        for index in range(count):
            number, start, length = served_by[index]
            data = window.result(number)
            yield data.slice(start, length)
            left[number] -= 1
            if not left[number]:
                window.release(number)
    finally:
        window.close()


class _Window:
    """The requests started and not yet handed over in full: started in order, in a pool of
    ``in_flight`` threads, while the bytes they hold stay within ``budget``."""

    def __init__(self, requests, read, in_flight: int, budget: int):
        self._requests, self._read, self._budget = requests, read, budget
        threads = max(1, min(in_flight, len(requests)))
        self._pool = concurrent.futures.ThreadPoolExecutor(threads, "pileshuffle-fetch")
        self._started, self._held, self._next = {}, 0, 0

    def result(self, number: int):
        """Request ``number``'s bytes (started now if it was not: the one awaited always goes)."""
        self._start_more(needed=number)
        return self._started[number].result()

    def release(self, number: int):
        self._held -= self._requests[number].length
        del self._started[number]

    def close(self):
        self._pool.shutdown(wait=True, cancel_futures=True)

    def _start_more(self, needed: int):
        while self._next < len(self._requests):
            request = self._requests[self._next]
            if self._next > needed and self._held and self._held + request.length > self._budget:
                return
            self._started[self._next] = self._pool.submit(_fetch, self._read, request)
            self._held += request.length
            self._next += 1


def _fetch(read, request: Request):
    """One request's bytes, or a ``RangeReadError`` naming its object and range (a refusal,
    already one line naming the path, as it is)."""
    try:
        return read(request.path, request.offset, request.length)
    except PileshuffleError:
        raise
    except Exception as error:
        last = request.offset + request.length - 1
        raise RangeReadError(
            f"{request.path}: cannot read bytes {request.offset:,}-{last:,} "
            f"({len(request.parts)} part(s) of a pass-1 run): "
            f"{cloud.explain(error)}"
        ) from error
