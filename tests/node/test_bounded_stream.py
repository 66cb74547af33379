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
    """json for bounded, counting the lines the parent decodes."""

    def __init__(self):
        self.decoded = 0

    def loads(self, text):
        self.decoded += 1
        return json.loads(text)

    def dumps(self, *args, **kwargs):
        return json.dumps(*args, **kwargs)


@pytest.fixture
def counting(monkeypatch):
    shim = CountingJson()
    monkeypatch.setattr(bounded, "json", shim)
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
