"""How a run waits for the node lock another run holds (rsc_health.node.store.node_lock): in
flock itself, woken the moment the holder lets go, bounded by the run's timeout (an interval
timer), not polled with a sleep between looks (a prolog behind an epilog or a sweep waited up
to one more poll, 50 ms, after the lock was free). Off the main thread, where no signal can
bound the wait, it still polls."""

from __future__ import annotations

import _thread
import fcntl
import os
import signal
import time

import pytest

from rsc_health.node import store


def held(sdir) -> int:
    """The node lock taken by another open file description (another run, as flock sees it)."""
    os.makedirs(sdir, exist_ok=True)
    fd = os.open(os.path.join(sdir, store.LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def let_go_after(fd: int, seconds: float) -> None:
    """Close the holder's descriptor (releasing its flock) from a thread, `seconds` from now."""
    never = _thread.allocate_lock()
    never.acquire()

    def later() -> None:
        never.acquire(timeout=seconds)
        os.close(fd)

    _thread.start_new_thread(later, ())


def test_a_lock_let_go_by_its_holder_is_taken_without_polling(tmp_path, monkeypatch):
    def no_polling(seconds):
        raise AssertionError(f"node_lock slept {seconds} s between looks at the lock")

    monkeypatch.setattr(store.time, "sleep", no_polling)
    let_go_after(held(tmp_path), 0.05)
    t0 = time.monotonic()
    with store.node_lock(tmp_path, 5.0) as (writable, note):
        took = time.monotonic() - t0
    assert writable is True and note is None
    assert 0.04 <= took < 2.0


def test_a_lock_held_past_the_timeout_is_given_up_at_the_timeout(tmp_path):
    fd = held(tmp_path)
    try:
        t0 = time.monotonic()
        with pytest.raises(store.LockTimeout):
            with store.node_lock(tmp_path, 0.1):
                pass
        assert 0.1 <= time.monotonic() - t0 < 2.0
    finally:
        os.close(fd)


def test_the_wait_leaves_no_timer_and_the_alarm_handler_as_it_was(tmp_path):
    before = signal.getsignal(signal.SIGALRM)
    let_go_after(held(tmp_path), 0.02)
    with store.node_lock(tmp_path, 5.0):
        pass
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    assert signal.getsignal(signal.SIGALRM) is before
    fd = held(tmp_path)
    try:
        with pytest.raises(store.LockTimeout):
            with store.node_lock(tmp_path, 0.05):
                pass
    finally:
        os.close(fd)
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    assert signal.getsignal(signal.SIGALRM) is before


def test_off_the_main_thread_the_lock_is_still_waited_for(tmp_path):
    let_go_after(held(tmp_path), 0.05)
    done = _thread.allocate_lock()
    done.acquire()
    got: list = []

    def take() -> None:
        try:
            with store.node_lock(tmp_path, 5.0) as answer:
                got.append(answer)
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
            got.append(exc)
        finally:
            done.release()

    _thread.start_new_thread(take, ())
    assert done.acquire(timeout=10)
    assert got == [(True, None)]
