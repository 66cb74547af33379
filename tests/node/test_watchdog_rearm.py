"""The watchdog's re-arming (rsc_health.node.exits.Watchdog): armed with the packaged budget
before the config is read, re-armed with the config's once it is. A later deadline is kept by
the thread already waiting (one thread a run, not two: a thread start and a GIL handoff on
every job start); an earlier one still fires at its own time; a cancel still stops it."""

from __future__ import annotations

import _thread
import time
import types

from rsc_health.node import exits


class Counting:
    """exits._thread with its thread starts counted."""

    def __init__(self) -> None:
        self.started = 0
        self.allocate_lock = _thread.allocate_lock
        self.TIMEOUT_MAX = _thread.TIMEOUT_MAX
        self.LockType = _thread.LockType

    def start_new_thread(self, fn, args):
        self.started += 1
        return _thread.start_new_thread(fn, args)


class Recorded(exits.Watchdog):
    """A watchdog whose firing is recorded (when, and how often) instead of exiting."""

    def __init__(self, after_s: float) -> None:
        self.fired: list[float] = []
        self.rang = _thread.allocate_lock()
        self.rang.acquire()
        super().__init__(types.SimpleNamespace(), after_s)

    def _fire(self) -> None:
        self.fired.append(time.monotonic())
        self.rang.release()

    def wait_fired(self, within_s: float) -> bool:
        return self.rang.acquire(timeout=within_s)


def test_rearm_to_a_later_deadline_starts_no_second_thread(monkeypatch):
    counting = Counting()
    monkeypatch.setattr(exits, "_thread", counting)
    dog = Recorded(30.0)
    dog.rearm(32.0)
    dog.cancel()
    assert counting.started == 1
    assert dog.fired == []


def test_rearm_to_an_earlier_deadline_still_fires_at_it():
    dog = Recorded(30.0)
    armed = time.monotonic()
    dog.rearm(0.05)
    assert dog.wait_fired(5.0), "re-armed to 0.05 s, the watchdog did not fire in 5 s"
    assert dog.fired[0] - armed >= 0.05
    assert len(dog.fired) == 1


def test_rearm_to_a_later_deadline_fires_at_the_later_one_not_the_first():
    dog = Recorded(0.02)
    rearmed = time.monotonic()
    dog.rearm(0.15)
    assert dog.wait_fired(5.0), "re-armed to 0.15 s, the watchdog did not fire in 5 s"
    assert dog.fired[0] - rearmed >= 0.15, "it fired at the first deadline"
    assert len(dog.fired) == 1


def test_cancel_after_a_later_rearm_never_fires():
    dog = Recorded(0.02)
    dog.rearm(0.05)
    dog.cancel()
    # Past both deadlines (0.15 s against 0.05): a watchdog still armed would have fired.
    assert not dog.wait_fired(0.15)
    assert dog.fired == []


def test_rearm_counted_from_a_start_fires_at_that_start_plus_the_seconds_not_later():
    """The node path re-arms from the run's start once the config is loaded: the time the load
    took is part of the budget, not added to it."""
    dog = Recorded(30.0)
    started = time.monotonic() - 0.2  # the run began 0.2 s ago (its config's load)
    dog.rearm(0.3, since=started)
    assert dog.wait_fired(5.0), "re-armed to start + 0.3 s, the watchdog did not fire in 5 s"
    assert started + 0.3 <= dog.fired[0] < started + 0.45, dog.fired[0] - started


def test_rearm_to_a_deadline_already_past_fires_at_once():
    dog = Recorded(30.0)
    asked = time.monotonic()
    dog.rearm(1.0, since=asked - 5.0)
    assert dog.wait_fired(5.0)
    assert dog.fired[0] - asked < 0.15
