"""Load the next item on one background thread while the current one is used.

``prefetched(items, load)`` yields ``load(item)`` in order. The thread loads item i+1
while the caller holds item i and waits before loading i+2 until the caller has taken
i+1: at most two loaded items exist at once (the caller's and the next); with ``ahead=n``
it loads up to n items past the last one taken (a Mixture: one per source). An error in
``load`` is raised in the caller. Closing the generator (or Ctrl-C while the caller waits)
stops the thread without waiting for it: it ends after the load it may be doing (a load
can take seconds; a daemon thread never keeps the process alive).
"""

import itertools
import queue
import threading

__all__ = ["prefetched"]

_DONE = object()


class _Failed:
    def __init__(self, error):
        self.error = error


def prefetched(items, load, ahead: int = 1):
    """``load(item)`` for each of ``items`` in order, the next ``ahead`` loaded on a background
    thread; at most ``ahead + 1`` loaded items exist at once (see the module docstring).
    ``items`` may be a generator: the thread takes each item as it loads it."""
    items = iter(items)
    first = next(items, _DONE)
    if first is _DONE:
        return
    items = itertools.chain((first,), items)
    ready = queue.Queue()
    may_load = threading.Semaphore(ahead)
    stop = threading.Event()

    def work():
        try:
            for item in items:
                may_load.acquire()
                if stop.is_set():
                    return
                ready.put(load(item))
            ready.put(_DONE)
        except BaseException as error:  # handed to the caller
            ready.put(_Failed(error))

    thread = threading.Thread(target=work, name="pileshuffle-prefetch", daemon=True)
    thread.start()
    try:
        while True:
            loaded = ready.get()
            if loaded is _DONE:
                return
            if isinstance(loaded, _Failed):
                raise loaded.error
            may_load.release()  # the caller now holds this one: the thread may load the next
            yield loaded
            del loaded
    finally:
        stop.set()
        may_load.release()  # wakes the thread if it waits: it sees ``stop`` and ends
