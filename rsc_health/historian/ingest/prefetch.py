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


def prefetch(items: Iterable[T], depth: int = 1) -> Prefetched[T]:
    """Yield what `items` yields, producing up to `depth` items ahead. The producer starts
    now, not at the first next(): the caller's own setup (for the sacct ingest, the index
    drops before the first write) overlaps the first item. An exception in the producer is
    raised here, in the consumer; a consumer that stops early (close(), or dropping the
    iterator) stops the producer at its next item."""
    return Prefetched(items, depth)


class Prefetched(Iterator[T]):
    def __init__(self, items: Iterable[T], depth: int) -> None:
        self._ahead: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        # The thread holds the queue and the event, not this object: the consumer dropping
        # its iterator then closes it (__del__), stopping the producer.
        self._worker = threading.Thread(target=_produce, args=(items, self._ahead, self._stop),
                                        name="prefetch", daemon=True)
        self._worker.start()

    def __next__(self) -> T:
        if self._stop.is_set():
            raise StopIteration
        item = self._ahead.get()
        if item is _DONE:
            self.close()
            raise StopIteration
        if isinstance(item, _Failed):
            self.close()
            raise item.exc
        return item

    def close(self) -> None:
        """Stop the producer (at its next item) and wait for its thread to end."""
        self._stop.set()
        if self._worker is not threading.current_thread():
            self._worker.join()

    def __del__(self) -> None:
        self.close()


def _produce(items: Iterable, ahead: queue.Queue, stop: threading.Event) -> None:
    try:
        for item in items:
            if not _put(ahead, item, stop):
                return
        _put(ahead, _DONE, stop)
    except BaseException as exc:  # handed to the consumer, raised there
        _put(ahead, _Failed(exc), stop)


def _put(ahead: queue.Queue, item, stop: threading.Event) -> bool:
    """Put `item` unless the consumer has gone; False when it has."""
    while not stop.is_set():
        try:
            ahead.put(item, timeout=0.1)
            return True
        except queue.Full:
            continue
    return False
