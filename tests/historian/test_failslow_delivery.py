"""Slots judged only once their job's samples are in (core.delivered): the nodes flush their
spools every 30 minutes, each at its own fixed minute (deploy/node/rsc-health-flush.timer:
OnCalendar=*:0/30, RandomizedDelaySec=30min, FixedRandomDelay), and `suspects apply` runs the
detector every minute over the last hour. So the newest half hour of a job's slots holds the
samples of only the nodes whose flush came since: a slot is judged once every node of the job
has delivered a sample at or after it, or once it is [failslow] complete_after_s old."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import numpy as np

from rsc_health.historian.failslow import detect_frame
from rsc_health.historian.failslow.core import Rules
from tests.historian.test_failslow_detect import CFG, NODES, T0, _job, _noisy, _samples

NODES16 = [f"n{i:02d}" for i in range(16)]
LEAF = {1, 4, 6, 9, 11, 14}  # 6 of 16 behind one leaf switch, 6x congestion from sweep 6


def _leaf_congestion():
    noise = np.exp(np.random.default_rng(7).normal(0, 0.25, (16, 20)))
    return _samples(NODES16, "ib_xmit_wait_rate",
                    lambda i, s: 5e5 * noise[i, s] * (6 if i in LEAF and s >= 6 else 1), 12)


def test_a_leaf_congestion_seen_before_every_node_flushed_flags_no_node():
    samples = _leaf_congestion()
    member = _job("1", NODES16)
    # every node's samples in: the leaf's share of the job moved together, no one is flagged
    assert detect_frame(samples, member, None, CFG) == []
    # the pass a few minutes later, before the other half of the job's nodes flushed the
    # half hour since the congestion began: only n01 of the leaf's six has; the rest of its
    # samples are on the nodes' disks, not missing
    onset = T0 + timedelta(seconds=60 + 300 * 6)
    flushed = {NODES16[i] for i in (0, 1, 2, 3, 5, 7, 8, 10)}
    delivered = samples[(samples["time"] < onset) | samples["node"].isin(flushed)]
    now = samples["time"].max() + timedelta(minutes=2)
    # judged among the healthy nodes that happened to flush first, n01 was a suspect, its
    # episode opened (kept off big jobs, sent to qualification) before its leaf-mates'
    # samples arrived to show the move was the switch's
    assert detect_frame(delivered, member, None, CFG, now=now) == []
    # ... as it is with the wait turned off
    no_wait = replace(Rules.from_config(CFG), complete_s=0)
    assert [e.node for e in detect_frame(delivered, member, None, no_wait, now=now)] == ["n01"]


_BASE = _noisy(1, 0.0, 0.01)


def _stuck(i, s):
    """gpu005 stuck in HW slowdown from sweep 6, the others' healthy jitter."""
    return max(0.0, _BASE(i, s)) + (0.8 if i == 4 and s >= 6 else 0.0)


def test_a_real_onset_waits_for_its_jobs_samples_and_is_found_once_they_are_in():
    samples = _samples(NODES, "throttle_hw_frac", _stuck, 12)
    member = _job("4242", NODES)
    onset = T0 + timedelta(seconds=60 + 300 * 6)
    late = {"gpu002", "gpu003", "gpu007"}  # their flush has not come since the onset
    early = samples[(samples["time"] < onset) | ~samples["node"].isin(late)]
    now = samples["time"].max() + timedelta(minutes=1)
    assert detect_frame(early, member, None, CFG, now=now) == []
    # the late nodes flush: the same slots, whole, show gpu005 alone, from its onset
    found = detect_frame(samples, member, None, CFG, now=now)
    assert [(e.node, e.metric) for e in found] == [("gpu005", "throttle_hw_frac")]
    assert onset <= found[0].since <= onset + timedelta(minutes=5)


def test_a_node_that_stopped_reporting_holds_its_job_back_only_for_complete_after_s():
    samples = _samples(NODES, "throttle_hw_frac", _stuck, 12)
    member = _job("4242", NODES)
    gone = samples[~((samples["node"] == "gpu008")
                     & (samples["time"] >= T0 + timedelta(minutes=20)))]
    last = samples["time"].max()
    assert detect_frame(gone, member, None, CFG, now=last + timedelta(minutes=1)) == []
    bound = timedelta(seconds=CFG.get("failslow.complete_after_s"))
    found = detect_frame(gone, member, None, CFG, now=last + bound)
    assert [(e.node, e.metric) for e in found] == [("gpu005", "throttle_hw_frac")]
