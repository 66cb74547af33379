"""Run a generator one step ahead on a background thread.

The sacct ingest parses block n+1 (Arrow, which releases the GIL) while the database writes
block n (ADBC and psycopg release it too), so a two-core host does both at once."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")
_DONE = object()


class _Failed:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


def prefetch(items: Iterable[T], depth: int = 1) -> Iterator[T]:
    """Yield what `items` yields, producing up to `depth` items ahead. An exception in the
    producer is raised here, in the consumer; a consumer that stops early stops the producer
    at its next item."""
    ahead: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def produce() -> None:
        try:
            for item in items:
                if not _put(ahead, item, stop):
                    return
            _put(ahead, _DONE, stop)
        except BaseException as exc:  # handed to the consumer, raised there
            _put(ahead, _Failed(exc), stop)

    worker = threading.Thread(target=produce, name="prefetch", daemon=True)
    worker.start()
    try:
        while True:
            item = ahead.get()
            if item is _DONE:
                return
            if isinstance(item, _Failed):
                raise item.exc
            yield item
    finally:
        stop.set()
        worker.join()


def _put(ahead: queue.Queue, item, stop: threading.Event) -> bool:
    """Put `item` unless the consumer has gone; False when it has."""
    while not stop.is_set():
        try:
            ahead.put(item, timeout=0.1)
            return True
        except queue.Full:
            continue
    return False
