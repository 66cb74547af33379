"""The fail-slow detector on real per-rank traces: ByteDance's straggler study's three sample
jobs (tests/fixtures/failslow/README.md): the worker slowed on purpose is the one suspect; a
job slowed by its sequence lengths or by a long last stage has none."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from rsc_health.config import load_config
from rsc_health.historian.failslow import detect_frame
from rsc_health.historian.failslow.core import Rules

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from _straggler_traces import step_frame  # noqa: E402

RULES = Rules.from_config(load_config(None))


@pytest.mark.parametrize("stage_known", [True, False])
def test_the_worker_slowed_on_purpose_is_the_only_suspect(stage_known):
    steps, members = step_frame("AR", RULES.slot_s)
    if not stage_known:
        steps, members = steps.assign(stage=""), members.drop(columns="stage")
    found = detect_frame(None, members, steps, RULES)
    assert [(e.node, e.source, e.job_ids) for e in found] == [("AR-dp0-pp0", "steps", ("AR",))]
    assert found[0].value / found[0].peer_median > 2.0


@pytest.mark.parametrize("trace", ["SE", "ST"])
@pytest.mark.parametrize("stage_known", [True, False])
def test_workload_imbalance_makes_no_suspect(trace, stage_known):
    steps, members = step_frame(trace, RULES.slot_s)
    if not stage_known:
        steps, members = steps.assign(stage=""), members.drop(columns="stage")
    assert detect_frame(None, members, steps, RULES) == []
