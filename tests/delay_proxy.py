"""An HTTP proxy that makes a local Cloud Storage emulator answer like a distant service: every
request waits ``delay`` seconds (concurrently with the others), then goes on to the emulator.

Cloud Storage's first byte takes tens of ms; the emulator answers in a few ms, one request at a
time (``http.server.HTTPServer``: one connection at a time, HTTP/1.0, a listen backlog of 5).
So the proxy keeps its clients' connections open (HTTP/1.1, as Cloud Storage does), delays
each request on its own, then forwards it over at most ``UPSTREAM`` connections at once (the
emulator's backlog drops the rest's SYNs, a 1 s stall each) and relays the answer. What it
cannot hide is the emulator's own serial service time: a test through it measures how far
concurrency hides the delay, not Cloud Storage's bandwidth.

It counts, for the tests and bench/pass2_fetch.py: requests, the most in flight at once (from
the request's head read until its answer starts back), and each request's method, target,
Range header and when it came and was answered (seconds on the proxy's clock).
``GET /__proxy__/stats`` answers them as JSON (not counted); ``/__proxy__/reset`` zeroes them.

    python tests/delay_proxy.py UPSTREAM_PORT DELAY_SECONDS  # prints its port, serves until killed
"""

import asyncio
import json
import sys

UPSTREAM = 4  # connections to the emulator at once (its listen backlog is 5)


class Counts:
    def __init__(self):
        self.requests, self.active, self.peak, self.seen = 0, 0, 0, []

    def as_json(self) -> bytes:
        counted = {"requests": self.requests, "peak": self.peak, "seen": self.seen}
        return json.dumps(counted).encode()


def _header(lines, name: bytes, default=None):
    """The value of header ``name`` (lower case, with its colon) in ``lines``, or ``default``."""
    found = (line.split(b":", 1)[1].strip() for line in lines if line.lower().startswith(name))
    return next(found, default)


async def _read_body(reader, head: bytes) -> bytes:
    """The request's body, raw (as sent: by Content-Length, or chunked to its last chunk)."""
    lines = head.split(b"\r\n")
    if b"chunked" in _header(lines, b"transfer-encoding:", b"").lower():
        body = b""
        while True:
            size_line = await reader.readuntil(b"\r\n")
            size = int(size_line.split(b";")[0], 16)
            body += size_line + await reader.readexactly(size + 2)
            if size == 0:
                return body
    length = int(_header(lines, b"content-length:", b"0"))
    return await reader.readexactly(length) if length else b""


def _for_client(answer: bytes, method: str) -> bytes:
    """The emulator's HTTP/1.0 answer (it closes after it) as an HTTP/1.1 one the client keeps
    its connection open after: a Content-Length of the body's size, no Connection header."""
    head, _, body = answer.partition(b"\r\n\r\n")
    status, *headers = head.split(b"\r\n")
    dropped = (b"connection:", b"content-length:", b"keep-alive:")
    kept = [h for h in headers if not h.lower().startswith(dropped)]
    size = _header(headers, b"content-length:", b"0") if method == "HEAD" else b"%d" % len(body)
    status = b"HTTP/1.1" + status[len(b"HTTP/1.0") :]
    return b"\r\n".join([status, *kept, b"Content-Length: " + size]) + b"\r\n\r\n" + body


async def _forward(request: bytes, upstream_port: int, gate) -> bytes:
    async with gate:
        reader, writer = await asyncio.open_connection("127.0.0.1", upstream_port)
        try:
            writer.write(request)
            await writer.drain()
            return await reader.read()  # HTTP/1.0: the answer ends when the emulator closes
        finally:
            writer.close()


def _own_answer(target: str, counts: Counts) -> bytes:
    """The counts as JSON; for ``/__proxy__/reset``, zeroed after."""
    body = counts.as_json()
    if target.startswith("/__proxy__/reset"):
        counts.__init__()
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
    return head % len(body) + body


async def _serve_client(reader, writer, upstream_port: int, delay: float, counts: Counts, gate):
    loop = asyncio.get_running_loop()
    try:
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, ConnectionError):
                return
            method, target = (word.decode() for word in head.split(b" ", 2)[:2])
            if target.startswith("/__proxy__/"):
                writer.write(_own_answer(target, counts))
                await writer.drain()
                continue
            body = await _read_body(reader, head)
            counts.requests += 1
            counts.active += 1
            counts.peak = max(counts.peak, counts.active)
            ranged = _header(head.split(b"\r\n"), b"range:")
            seen = [method, target, ranged and ranged.decode(), loop.time(), None]
            counts.seen.append(seen)
            try:
                await asyncio.sleep(delay)
                answer = await _forward(head + body, upstream_port, gate)
            finally:  # answered before a byte goes back: a client's next request never overlaps it
                counts.active -= 1
                seen[4] = loop.time()
            writer.write(_for_client(answer, method))
            await writer.drain()
    finally:
        writer.close()


async def main(upstream_port: int, delay: float):
    counts, gate = Counts(), asyncio.Semaphore(UPSTREAM)

    def serve(reader, writer):
        return _serve_client(reader, writer, upstream_port, delay, counts, gate)

    server = await asyncio.start_server(serve, "127.0.0.1", 0, backlog=1024)
    print(server.sockets[0].getsockname()[1], flush=True)
    async with server:
        await server.serve_forever()


def start(upstream: str, delay: float):
    """``(process, "http://127.0.0.1:port")`` of a proxy in its own process in front of the
    emulator at ``upstream`` (``http://127.0.0.1:P``), delaying every request by ``delay`` s."""
    import subprocess

    port = upstream.rsplit(":", 1)[1]
    command = [sys.executable, __file__, port, str(delay)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    return process, f"http://127.0.0.1:{process.stdout.readline().strip()}"


def counts(endpoint: str, reset: bool = False) -> dict:
    """The proxy's counts ``{"requests", "peak", "seen": [[method, target, range, came, answered],
    ...]}``, zeroed after if ``reset``."""
    import urllib.request

    with urllib.request.urlopen(f"{endpoint}/__proxy__/{'reset' if reset else 'stats'}") as answer:
        return json.loads(answer.read())


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), float(sys.argv[2])))
