"""A node shared between a multi-node job and another job (GPUs split: the multi-node job takes
4 of 8 GPUs per node, the other job the other 4). The node-level figure is its worst busy GPU's,
whoever's GPU that is, so such samples are judged in neither job, whatever the other job's size:
a one-node job is no member (membership reads jobs of two or more nodes), and its GPUs' clock
was blamed on the node in the multi-node job (load.co_tenants, core.shared_samples)."""

from __future__ import annotations

from datetime import datetime, timedelta

import numpy as np
import pandas as pd
import pytest

from rsc_health import spool
from rsc_health.config import load_config
from rsc_health.historian.failslow import detect
from rsc_health.historian.failslow.core import Rules, telemetry_observations
from rsc_health.historian.ingest.delivery import deliver
from tests.historian.job_rows import add_job

CFG = load_config(None)
T0 = datetime(2026, 11, 26, 10, 0, 0)
NODES = [f"gpu{i:03d}" for i in range(1, 9)]
SHARED_FROM = T0 + timedelta(minutes=20)


def _telemetry(historian, tmp_path):
    rng = np.random.default_rng(3)
    sdir = tmp_path / "spool"
    sdir.mkdir()
    for i, node in enumerate(NODES + ["gpu009"]):
        records = []
        for s in range(12):
            t = T0 + timedelta(seconds=300 * s + 20 + 30 * i)
            clock, comp = 0.97 + rng.normal(0, 0.004), "gpu1"
            if node == "gpu001" and t > SHARED_FROM:
                # the other job's GPUs (gpu4-7) at their power cap under a burn: healthy
                clock, comp = 0.70, "gpu5"
            records.append(spool.record("telemetry", node, t, source="sweep", job_id=None,
                                        interval_s=300.0, metrics={
                                            "sm_clock_ratio": {"value": clock,
                                                               "component": comp}}))
        spool.append(sdir, records)
    deliver(historian, sdir)


@pytest.mark.parametrize("other", [["gpu001", "gpu009"], ["gpu001"]],
                         ids=["two-node-other-job", "one-node-other-job"])
def test_a_node_sharing_its_gpus_with_another_job_is_judged_in_neither(historian, tmp_path,
                                                                        other):
    add_job(historian, "7001", T0, NODES)
    add_job(historian, "8001", SHARED_FROM - timedelta(minutes=1), other)
    _telemetry(historian, tmp_path)
    found = detect(historian, T0 + timedelta(hours=1), CFG)
    assert [(e.node, e.metric, e.job_ids) for e in found] == []


def test_a_one_node_job_that_ended_before_leaves_the_node_judged(historian, tmp_path):
    """Only while the one-node job ran: one that ended before the node went slow shares
    nothing, and the slow GPU is the multi-node job's node's own."""
    add_job(historian, "7001", T0, NODES)
    add_job(historian, "8001", T0 - timedelta(hours=2), ["gpu001"],
            end=T0 - timedelta(minutes=5), state="COMPLETED")
    _telemetry(historian, tmp_path)
    found = detect(historian, T0 + timedelta(hours=1), CFG)
    assert [(e.node, e.metric, e.job_ids) for e in found] == [
        ("gpu001", "sm_clock_ratio", ("7001",))]


def test_shared_samples_stay_in_the_frame_and_are_judged_in_no_job():
    """Marked, not dropped: the node's newest sample still says how far its spool was
    delivered (core.delivered)."""
    from rsc_health.historian.failslow.core import shared_samples

    t = pd.Timestamp(T0)
    samples = pd.DataFrame({"node": ["a", "a", "b"],
                            "time": [t, t + pd.Timedelta(minutes=10), t],
                            "metric": ["sm_clock_ratio"] * 3, "value": [0.7, 0.7, 0.97],
                            "component": ["gpu5"] * 3})
    others = pd.DataFrame({"job_id": ["9"], "node": ["a"], "start": [t + pd.Timedelta(minutes=5)],
                           "end": [None]})
    marked = shared_samples(samples, others)
    assert len(marked) == 3 and marked["shared"].tolist() == [False, True, False]
    members = pd.DataFrame({"job_id": ["1", "1"], "node": ["a", "b"],
                            "start": [t - pd.Timedelta(hours=1)] * 2, "end": [None, None]})
    obs = telemetry_observations(marked, members, Rules.from_config(CFG))
    assert sorted(zip(obs["node"], obs["time"], strict=True)) == [("a", t), ("b", t)]


def test_a_stale_one_node_job_row_does_not_hide_a_slow_node_for_ever(historian, tmp_path):
    """A one-node job ran on gpu001 before the multi-node job (it had ended by then), but the
    historian still holds it as sacct last read it, RUNNING (no end), and its epilog record
    never arrived (the node crashed in it, its spool lost). Read as running from its start
    with no end, it made every later sample of gpu001 'shared', judged in no job: its slow
    GPU was never flagged, in this job or any later one (helper-210)."""
    add_job(historian, "8001", T0 - timedelta(hours=2), ["gpu001"])  # end None, no epilog
    add_job(historian, "7001", T0, NODES)
    _telemetry(historian, tmp_path)
    found = detect(historian, T0 + timedelta(hours=1), CFG)
    assert [(e.node, e.metric, e.job_ids) for e in found] == [
        ("gpu001", "sm_clock_ratio", ("7001",))]
