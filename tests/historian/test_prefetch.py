"""prefetch: a generator run one step ahead on a thread, with its errors raised in the caller."""

from __future__ import annotations

import threading
import time

import pytest

from rsc_health.historian.ingest.prefetch import prefetch


def test_items_arrive_in_order_and_all_of_them():
    assert list(prefetch(iter(range(1000)), depth=2)) == list(range(1000))


def test_the_producer_runs_on_another_thread_ahead_of_the_consumer():
    produced: list[tuple[int, str]] = []

    def items():
        for i in range(3):
            produced.append((i, threading.current_thread().name))
            yield i

    it = prefetch(items(), depth=1)
    assert next(it) == 0
    deadline = time.monotonic() + 5
    while len(produced) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [name for _, name in produced] == ["prefetch", "prefetch"]  # item 1 is ready
    assert list(it) == [1, 2]


def test_an_error_in_the_producer_is_raised_in_the_consumer_after_the_items_before_it():
    def items():
        yield 1
        raise ValueError("line 7 is broken")

    got = []
    with pytest.raises(ValueError, match="line 7"):
        for item in prefetch(items()):
            got.append(item)
    assert got == [1]


def test_a_consumer_that_stops_early_stops_the_producer():
    produced = []

    def items():
        for i in range(10_000):
            produced.append(i)
            yield i

    for item in prefetch(items(), depth=1):
        if item == 3:
            break
    count = len(produced)
    time.sleep(0.2)
    assert len(produced) == count <= 6  # stopped, a step or two ahead at most


def test_the_producer_starts_before_the_first_next():
    """So the caller's setup (the sacct ingest's index drops) overlaps the first item."""
    started = threading.Event()

    def items():
        started.set()
        yield 1

    it = prefetch(items())
    assert started.wait(5)
    assert list(it) == [1]


def test_closing_before_the_first_next_stops_the_producer():
    produced = []

    def items():
        for i in range(10_000):
            produced.append(i)
            yield i

    it = prefetch(items(), depth=1)
    it.close()
    count = len(produced)
    time.sleep(0.2)
    assert len(produced) == count <= 3
