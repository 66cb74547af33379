"""nvlink.counters (read at every job start, for the baselines: 8 GPUs x 18 links x 4 counters)
takes an answer as a counter when it is an int, with no val() call per answer: an error answer
is a dict, never an int. The counters are those val() gave, on the healthy fixture's answers
and with every kind of answer planted (errors, garbled codes, bools, strings, None, floats)."""

from __future__ import annotations

import copy
import json

from rsc_health.checks import nvlink
from rsc_health.collect.counters import plausible
from rsc_health.collect.gpu import NVLINK_COUNTERS, parse_answers, val
from tests.fixtures.nodes.node_copy import HEALTHY


class _State:
    def __init__(self, gpu):
        self.gpu = gpu


def _reference(state) -> dict:  # as it was: val() first
    out = {}
    for g in state.gpu.gpus if state.gpu else []:
        for link in g.answers.get("nvlink") or []:
            for c in NVLINK_COUNTERS:
                v = val(link.get(c))
                if isinstance(v, int):
                    out[f"nvlink/gpu{g.index}/{link.get('link')}/{c}"] = v
    return out


def test_the_counters_are_the_ones_val_gave():
    doc = json.loads((HEALTHY / "rsc_health" / "nvml.json").read_text())
    healthy = _State(parse_answers(doc))
    assert nvlink.counters(healthy) == _reference(healthy) != {}
    odd = [{"error": "NVML_ERROR_NOT_SUPPORTED"}, {"error": 18}, {"error": ""}, True, False,
           "12", None, 1.5, 2**70, -3, 0, {"value": 4}]
    planted = copy.deepcopy(doc)
    n = 0
    for dev in planted["devices"]:
        for link in dev.get("nvlink") or []:
            for c in NVLINK_COUNTERS:
                link[c] = odd[n % len(odd)]
                n += 1
    state = _State(parse_answers(planted))
    got = nvlink.counters(state)
    assert got == _reference(state)
    assert {type(v) for v in got.values()} == {int, bool}  # as before: plausible() sorts them
    assert not plausible(True) and not plausible(2**70) and not plausible(-3) and plausible(0)


def test_plausible_reads_an_exact_int_at_once_and_anything_else_as_before():
    class Count(int):
        pass

    for value, expect in ((0, True), (2**63 - 1, True), (2**63, False), (-1, False),
                          (True, False), (Count(5), True), (Count(-5), False), (5.0, False),
                          ("5", False), (None, False)):
        assert plausible(value) is expect, value
