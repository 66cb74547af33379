"""A big job's shift (a leaf switch's event over 30% of its nodes) paired every mover with
every node of the job: 2,000 nodes took 50 s and 3.2 GB a detector pass, a 4,000-node job
would have taken some 13 GB (benchmarks/bench_failslow.py, big job). Slots with more outliers
than they allow are now decided by a sorted count in their own slot; the judgement is the same
as the pairs' (which stay for every other slot)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from rsc_health.historian.failslow import core
from rsc_health.historian.failslow.core import Rules, find_runs, judged
from tests.historian.test_failslow_detect import CFG, T0, _job, _samples


def _shifted_job(n: int, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    wait = 1e6 * np.exp(rng.normal(0, 0.25, (n, 12)))
    wait[: int(0.3 * n), 4:9] *= 8  # a leaf's nodes
    wait[n - 1, 3:] *= 6  # a congested port of its own, before and through the shift
    wait[n - 2, 7:] *= 5  # one that begins inside it
    return wait


@pytest.mark.parametrize("n,seed", [(130, 1), (200, 2), (300, 3)])
def test_a_shift_judged_by_the_count_alone_is_judged_as_the_pairs_judge_it(monkeypatch, n,
                                                                           seed):
    rules = Rules.from_config(CFG)
    wait = _shifted_job(n, seed)
    nodes = [f"n{i:04d}" for i in range(n)]
    samples = _samples(nodes, "ib_xmit_wait_rate", lambda i, s: float(wait[i, s]), 12,
                       seed=seed)
    members = _job("big", nodes)
    fast = judged(samples, members, None, rules)
    decided = core._past_allowed_alone  # noqa: SLF001
    calls: list[int] = []

    def counted(*args):
        out = decided(*args)
        calls.append(len(out))
        return out

    monkeypatch.setattr(core, "_past_allowed_alone", counted)
    judged(samples, members, None, rules)
    assert sum(calls) > 0  # the shift's slots were decided by the count
    monkeypatch.setattr(core, "_past_allowed_alone",
                        lambda *a: pd.Series(dtype="int64"))
    slow = judged(samples, members, None, rules)
    cols = ["job_id", "node", "metric", "slot", "outlier", "job_wide", "overtaken"]
    pd.testing.assert_frame_equal(fast[cols].reset_index(drop=True),
                                  slow[cols].reset_index(drop=True))
    assert find_runs(fast, rules)[["node", "confirmed"]].equals(
        find_runs(slow, rules)[["node", "confirmed"]])


def test_the_port_congested_before_the_shift_is_still_found_in_a_big_job():
    rules = Rules.from_config(CFG)
    n = 600
    wait = _shifted_job(n, 4)
    nodes = [f"n{i:04d}" for i in range(n)]
    samples = _samples(nodes, "ib_xmit_wait_rate", lambda i, s: float(wait[i, s]), 12, seed=4)
    runs = find_runs(judged(samples, _job("big", nodes, start=T0), None, rules), rules)
    assert nodes[n - 1] in set(runs["node"])
    assert not set(runs["node"]) & set(nodes[: int(0.3 * n)])  # the leaf's nodes: no one


def test_step_times_with_a_node_in_two_sections_are_counted_by_node_as_the_pairs_count(
        monkeypatch):
    """NVRx reports put each node in a slot once per section: counting rows, not nodes, made
    a lone slow node's own two rows two movers (its slot the job's, the straggler missed)."""
    rules = Rules.from_config(CFG)
    rng = np.random.default_rng(7)
    nodes = [f"n{i:03d}" for i in range(70)]  # 140 rows a slot: counted alone
    rows = []
    for s in range(12):
        t = T0 + pd.Timedelta(minutes=5 * s + 1)
        for i, node in enumerate(nodes):
            for section in ("section:fwd_bwd", "gpu"):
                slow = (1.4 if i == 7 and s >= 3 else 1.0) * (2.0 if i < 20 and 5 <= s < 8
                                                              else 1.0)
                rows.append({"job_id": "s", "rank": i, "node": node, "stage": section,
                             "step": s, "seconds": float(slow * rng.normal(1.0, 0.01)),
                             "time": t})
    steps = pd.DataFrame(rows)
    members = _job("s", nodes)
    fast = judged(None, members, steps, rules)
    monkeypatch.setattr(core, "_past_allowed_alone", lambda *a: pd.Series(dtype="int64"))
    slow = judged(None, members, steps, rules)
    cols = ["node", "group", "slot", "outlier", "job_wide"]
    pd.testing.assert_frame_equal(fast[cols].reset_index(drop=True),
                                  slow[cols].reset_index(drop=True))
    assert "n007" in set(find_runs(fast, rules)["node"])
