"""A streaming probe's reports (the NVML child's: every GPU's answers so far, after each GPU)
cost the parent nothing when the probe answers: only its answer, the last line, is decoded.
Before, every job start decoded each report twice (8 GPUs: 2 x 36 GPUs' answers for the 8
it used, 19 M instructions of a live prolog's parent). An abandoned probe still gives its last
report."""

from __future__ import annotations

import json
import time

import pytest

from rsc_health.collect import bounded


class CountingJson:
    """bounded's JSON decoder (compat.json_loads), counting the lines the parent decodes."""

    def __init__(self):
        self.decoded = 0

    def loads(self, text):
        self.decoded += 1
        return json.loads(text)


@pytest.fixture
def counting(monkeypatch):
    shim = CountingJson()
    monkeypatch.setattr(bounded, "json_loads", shim.loads)
    return shim


def test_a_streaming_answer_is_decoded_without_its_reports(counting):
    def probe(emit):
        for i in range(40):
            emit({"devices": list(range(i))})
        return {"done": 40}

    assert bounded.call(probe, 10, streaming=True) == {"done": 40}
    assert counting.decoded == 1  # the answer, the last line


def test_an_abandoned_streaming_probe_gives_its_last_report(counting):
    def probe(emit):
        for i in range(5):
            emit({"gpu": i})
        time.sleep(60)

    started = time.monotonic()
    with pytest.raises(bounded.Abandoned) as got:
        bounded.call(probe, 0.5, streaming=True)
    assert time.monotonic() - started < 5
    assert got.value.partial == {"gpu": 4}


def test_a_failing_streaming_probe_says_its_error(counting):
    def probe(emit):
        emit({"gpu": 0})
        raise ValueError("bad answer")

    with pytest.raises(RuntimeError, match="ValueError: bad answer"):
        bounded.call(probe, 10, streaming=True)


def test_a_child_that_wrote_more_than_its_pipe_holds_before_it_was_asked_is_not_a_hang():
    """The IB child is forked before NVML is waited for and asked after. One that had written
    more than a pipe holds (64 KiB) by then sat blocked on the pipe: read after its deadline,
    the first empty look ended the read, and a child that had answered everything was
    abandoned as hung (toward ib_wedged's drain), every time."""
    def fn(emit):
        for i in range(3000):  # about 240 KB of reports, then the answer
            emit({"p": i % 64, "f": {"counters/port_rcv_errors": "0\n" * 10}})
        return "done"

    abandoned = 0
    for _ in range(5):
        pid, fd = bounded.start(fn, streaming=True)
        started = time.monotonic()
        time.sleep(0.3)  # the parent waits on another probe meanwhile
        got = bounded.collect({"x": (pid, fd)}, started + 0.1)["x"]
        abandoned += got is None or got.get("ok") != "done"
    assert abandoned == 0


def test_a_child_still_writing_past_its_deadline_is_read_no_longer_than_the_grace():
    """The grace is for a child blocked on its pipe, not one that writes for ever."""
    def fn(emit):
        while True:
            emit({"x": "y" * 1000})

    pid, fd = bounded.start(fn, streaming=True)
    started = time.monotonic()
    time.sleep(0.2)
    assert bounded.collect({"x": (pid, fd)}, started + 0.1)["x"] is None
    assert time.monotonic() - started < 0.2 + bounded.PIPE_GRACE_S + 0.3


def test_the_answer_is_had_when_written_not_when_the_child_has_exited(monkeypatch):
    """A child's exit can take a while after its answer (an NVML child's exit closes the
    driver's handles): the parent's wait ends at the answer. A child whose exit takes 2 s
    here is answered within a fraction of it."""
    import os

    real_exit = os._exit

    def slow_exit(code):
        time.sleep(2.0)
        real_exit(code)

    monkeypatch.setattr(os, "_exit", slow_exit)  # the forked child inherits the patch
    start = time.monotonic()
    try:
        assert bounded.call(lambda: {"answer": 42}, 5.0) == {"answer": 42}
    finally:
        monkeypatch.setattr(os, "_exit", real_exit)
    assert time.monotonic() - start < 1.5
