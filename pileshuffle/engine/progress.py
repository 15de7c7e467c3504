"""Progress of a local run on stderr: pass 1 (files and bytes read, MB/s, ETA), then pass 2
(piles written of M). A tqdm line on a terminal; elsewhere (CI logs, the flex-template
launcher) the same text as a plain line every few seconds and at the end of each pass.

Invariant: reporting only counts; it never touches records, so shards are the same bytes
with and without it. The local runner runs DoFns in threads of this process, so the DoFns
report to this process's reporter (``showing``); in any other process (Dataflow or Dask
workers, the local runner's multi_processing workers) there is none and ``read``,
``file_read`` and ``pile_written`` do nothing. Those runners show progress their own way
(Dataflow's job page, Dask's dashboard).
"""

import contextlib
import os
import threading
import time

from tqdm import tqdm

from pileshuffle import interrupt

__all__ = ["read", "file_read", "pile_written", "Progress", "showing"]

_PLAIN_INTERVAL_SECONDS = 5.0
_PASS1_FORMAT = (
    "{desc}: {percentage:3.0f}% {n_fmt}B of {total_fmt}B{postfix} [{elapsed}<{remaining}, "
    "{rate_fmt}]"
)
_PASS2_FORMAT = "{desc}: {n_fmt} of {total_fmt} piles written [{elapsed}<{remaining}]"

_current = None  # the Progress of the run going on in this process, if any


def read(source, nbytes: int):
    """Pass 1 read about ``nbytes`` more of ``source``'s stored bytes."""
    if _current is not None:
        _current.read(source, nbytes)


def file_read(source):
    """Pass 1 finished ``source``."""
    if _current is not None:
        _current.file_read(source)


def pile_written():
    """Pass 2 wrote one shard."""
    if _current is not None:
        _current.pile_written()


class _Line:
    """One pass's counter: a tqdm bar on a terminal, else a plain line every few seconds."""

    def __init__(
        self,
        stream,
        live,
        total,
        desc,
        bar_format,
        unit="",
        unit_scale=False,
        interval=_PLAIN_INTERVAL_SECONDS,
    ):
        self.stream, self.live, self.interval = stream, live, interval
        self.total, self.desc, self.bar_format, self.unit, self.unit_scale = (
            total,
            desc,
            bar_format,
            unit,
            unit_scale,
        )
        self.n, self.postfix, self.started, self.printed = 0, "", time.monotonic(), time.monotonic()
        self.bar = (
            tqdm(
                total=total,
                desc=desc,
                unit=unit,
                unit_scale=unit_scale,
                file=stream,
                mininterval=0.5,
                **_width(stream),
            )
            if live
            else None
        )

    def update(self, n, postfix=None):
        self.n += n
        if postfix is not None:
            self.postfix = postfix
        if self.bar is not None:
            if postfix is not None:
                self.bar.set_postfix_str(postfix, refresh=False)
            self.bar.update(n)
        elif time.monotonic() - self.printed >= self.interval and not interrupt.interrupted():
            self.print_line()

    def print_line(self):
        self.printed = time.monotonic()
        text = tqdm.format_meter(
            self.n,
            self.total,
            self.printed - self.started,
            prefix=self.desc,
            unit=self.unit,
            unit_scale=self.unit_scale,
            postfix=self.postfix or None,
            bar_format=self.bar_format,
        )
        self.stream.write(f"pileshuffle: {text}\n")
        self.stream.flush()

    def close(self):
        if self.bar is not None:
            self.bar.close()
        elif not interrupt.interrupted():  # after Ctrl-C only the command's one line is printed
            self.print_line()


def _width(stream) -> dict:
    """tqdm follows the terminal's width; a terminal that reports none gets 100 columns."""
    try:
        columns = os.get_terminal_size(stream.fileno()).columns
    except (OSError, ValueError):
        columns = 0
    return {"dynamic_ncols": True} if columns else {"ncols": 100}


class Progress:
    """The counters of one run; thread-safe (DoFns run in several threads)."""

    def __init__(
        self,
        files: int,
        total_bytes: int,
        num_piles: int,
        stream,
        live: bool,
        interval=_PLAIN_INTERVAL_SECONDS,
    ):
        self.files, self.total_bytes, self.num_piles = files, total_bytes, num_piles
        self.stream, self.live, self.interval = stream, live, interval
        self.lock = threading.Lock()
        # bytes counted by (source id, span) and by file
        self.done_files, self.counted, self.file_bytes = 0, {}, {}
        self.pass1 = self._line(total_bytes, "pass 1", _PASS1_FORMAT, unit="B", unit_scale=True)
        self.pass2 = None

    def _line(self, total, desc, bar_format, **units):
        return _Line(
            self.stream, self.live, total, desc, bar_format, interval=self.interval, **units
        )

    def read(self, source, nbytes):
        with self.lock:
            self._count(
                source,
                min(nbytes, source.span_bytes - self.counted.get((source.id, source.span), 0)),
            )

    def file_read(self, source):
        """``source`` (a file, or a span of one) is read: a file is done when all its bytes are."""
        with self.lock:
            rest = source.span_bytes - self.counted.get((source.id, source.span), 0)
            self.done_files += (
                source.span is None or self.file_bytes.get(source.id, 0) + rest >= source.size
            )
            self._count(source, rest)

    def _count(self, source, nbytes):
        if self.pass1 is None or nbytes < 0:
            return
        self.counted[source.id, source.span] = (
            self.counted.get((source.id, source.span), 0) + nbytes
        )
        self.file_bytes[source.id] = self.file_bytes.get(source.id, 0) + nbytes
        self.pass1.update(nbytes, f"{self.done_files}/{self.files} files")

    def pile_written(self):
        with self.lock:
            if self.pass2 is None:  # the GroupByKey between the passes: pass 1 is over
                self._close_pass1()
                self.pass2 = self._line(self.num_piles, "pass 2", _PASS2_FORMAT, unit=" piles")
            self.pass2.update(1)

    def _close_pass1(self):
        if self.pass1 is not None:
            self.pass1.close()
            self.pass1 = None

    def close(self):
        with self.lock:
            self._close_pass1()
            if self.pass2 is not None:
                self.pass2.close()
                self.pass2 = None


@contextlib.contextmanager
def showing(
    files: int,
    total_bytes: int,
    num_piles: int,
    enabled: bool = True,
    interval=_PLAIN_INTERVAL_SECONDS,
):
    """Report this process's pass-1 and pass-2 progress on stderr while the block runs.
    Writes to a duplicate of file descriptor 2 taken on entry, so a later redirection of
    descriptor 2 (the command line holds worker output) does not hide it."""
    global _current
    if not enabled:
        yield None
        return
    stream = os.fdopen(os.dup(2), "w", buffering=1, encoding="utf-8", errors="replace")
    progress = Progress(
        files, total_bytes, num_piles, stream, live=stream.isatty(), interval=interval
    )
    _current = progress
    try:
        yield progress
    finally:
        _current = None
        progress.close()
        stream.close()
