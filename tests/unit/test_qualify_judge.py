"""Peer judgement of qualification metrics: relative to the peers' median and robust spread,
a baseline only while peers are few, inconclusive with neither; on real healthy spreads the
targets of issue 24 hold where a single run can show a 5% loss at all."""

from __future__ import annotations

from pathlib import Path

import pytest

from rsc_health.config import load_config
from rsc_health.qualify import Metric
from rsc_health.qualify.judge import FAIL, INCONCLUSIVE, PASS, Rules, judge, robust_spread
from rsc_health.sim.qualify_tools import real_spreads, simulate

FIX = Path(__file__).resolve().parents[1] / "fixtures"
PEERS = [100.0, 100.4, 99.7, 100.2, 99.9, 100.1, 99.8, 100.3, 100.0, 99.6]


def test_a_node_5_percent_under_tight_peers_fails_and_one_1_percent_under_passes():
    assert judge(Metric("m", 95.0, "GB/s"), PEERS).status == FAIL
    ok = judge(Metric("m", 99.0, "GB/s"), PEERS)
    assert ok.status == PASS and ok.basis == "peers" and ok.peers == len(PEERS)
    assert ok.percentile == 0.0 and ok.threshold == pytest.approx(100.0 * (1 - 0.025))


def test_noisy_peers_widen_the_line_but_never_past_the_relative_floor():
    noisy = [100 + d for d in (-3, 3, -2, 2, -1, 1, 0, -2.5, 2.5, 0.5)]
    wide = judge(Metric("m", 96.0, "u"), noisy)
    assert wide.status == PASS  # 4 x spread puts the line under 96
    assert judge(Metric("m", 94.9, "u"), noisy).status == FAIL  # 5% under: always a fail


def test_one_broken_peer_does_not_move_the_line():
    broken = PEERS + [10.0, float("nan"), -5.0]
    assert judge(Metric("m", 96.0, "u"), broken).threshold == pytest.approx(
        judge(Metric("m", 96.0, "u"), PEERS + [10.0]).threshold)
    assert robust_spread(PEERS + [10.0]) < 1.0


def test_lower_is_better_metrics_fail_above_the_line():
    lat = [10.0, 10.1, 9.9, 10.0, 10.2, 9.8, 10.0, 10.1]
    assert judge(Metric("lat", 11.0, "ns", higher_is_better=False), lat).status == FAIL
    assert judge(Metric("lat", 9.0, "ns", higher_is_better=False), lat).status == PASS


def test_few_peers_use_the_baseline_and_none_is_inconclusive_never_a_pass():
    few = PEERS[:3]
    with_base = judge(Metric("m", 91.0, "u"), few, baseline=100.0)
    assert with_base.basis == "baseline" and with_base.status == PASS  # 10% baseline margin
    assert judge(Metric("m", 89.0, "u"), few, baseline=100.0).status == FAIL
    none = judge(Metric("m", 100.0, "u"), few)
    assert none.status == INCONCLUSIVE and "need 8" in none.reason


def test_rules_come_from_the_config():
    assert Rules.from_config(load_config(None)) == Rules()


def test_real_spreads_meet_issue_24s_targets_where_one_run_can_show_a_5_percent_loss():
    spreads = real_spreads(FIX)
    assert robust_spread(spreads["bf16 GEMM run median x8 (H200)"]) < 0.005
    for name, deviations in spreads.items():
        healthy_fail, recall = simulate(deviations, nodes=3000, degrade=0.05, seed=11)
        assert healthy_fail <= 0.001, name
        # With the line at k = 4 spreads, a run shows a 5% loss with 99% recall only when the
        # healthy spread is under ~0.7% (5% >= (4 + 2.33) sigma). A run's figure (its median
        # after the warm-up: 0.15% across 8 fresh H200 runs), gpu-burn per GPU, IB per HCA, HBM
        # and H2D are; one GEMM repetition (3.4% with the warm-up boost, ~1% after) is not.
        if robust_spread(deviations) < 0.005:
            assert recall >= 0.99, name


def test_the_detectors_array_tolerances_are_the_judges_own_rule_element_by_element():
    # rsc_health/historian/failslow draws every node's line at once with tolerances(); it must
    # be tolerance() on each element, edges included (0, inf and NaN spreads, floor over cap)
    import numpy as np

    from rsc_health.qualify.judge import tolerance, tolerances

    rel = np.array([0.0, 1e-9, 0.01, 0.02, 0.05, 0.3, 2.0, np.inf, np.nan])
    lo = np.array([0.05, 0.05, 0.0, 0.3, 0.05, 0.05, 1.5, 0.05, 0.05])
    hi = np.array([0.1, 0.1, 0.5, 0.5, 0.1, 0.1, 3.0, 0.5, 0.1])
    got = tolerances(rel, 2.0, lo, hi)
    want = [tolerance(r, 2.0, a, b) for r, a, b in zip(rel, lo, hi, strict=True)]
    np.testing.assert_array_equal(got, np.array(want, dtype=float))
    assert got[0] == 0.05 and got[7] == 0.5 and np.isnan(got[8])
