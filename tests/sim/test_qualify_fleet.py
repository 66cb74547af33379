"""The fleet model of what qualification buys big jobs (rsc_health/sim/qualify_fleet)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from rsc_health.sim.qualify_fleet import (
    POLICIES,
    FleetModel,
    catch_table,
    compare,
    limits,
    timeline,
)

SMALL = FleetModel(nodes=256, days=180.0, warmup_days=45.0, jobs=1500, seed=3)


@pytest.fixture(scope="module")
def catch():
    return catch_table(SMALL, nodes=60)


def test_the_judge_catches_most_testable_defects_and_fails_no_healthy_node(catch):
    # A defect of 1-30% in a metric, judged against the real spreads by the product's judge.
    assert 0.5 < catch.defective <= SMALL.testable_share
    assert catch.healthy <= 0.001
    sizes = sorted(catch.by_degradation)
    assert catch.by_degradation[sizes[-1]] == 1.0  # a 30% loss is never missed
    assert catch.by_degradation[sizes[0]] < catch.by_degradation[sizes[-1]]


def test_bad_repairs_fail_qualification_and_a_fleet_without_defects_never_does(catch):
    defective = timeline(SMALL, "qualify", catch)
    assert defective.qualify_fails > 0
    clean = timeline(replace(SMALL, lemon_share=0.0, bad_repair_share=0.0), "qualify", catch)
    assert clean.qualify_fails == 0
    assert clean.silent == 0


def test_qualification_with_lemon_drains_fails_fewer_big_jobs_and_keeps_the_fleet_schedulable(
        catch):
    res = compare(SMALL, catch)
    none, lemon, qual = (res[p] for p in POLICIES)
    assert qual.big_jobs_failed < lemon.big_jobs_failed < none.big_jobs_failed
    assert qual.silent_kills < lemon.silent_kills < none.silent_kills
    assert min(r.schedulable for r in res.values()) >= 0.98
    # The visible rate the model was given is the one it produces, within Poisson noise.
    assert none.rf_visible_per_1000 == pytest.approx(SMALL.rf_per_1000_node_days, rel=0.2)


def test_a_policy_the_model_does_not_know_is_refused(catch):
    with pytest.raises(ValueError, match="policy"):
        timeline(SMALL, "pray", catch)


def test_a_pre_lemon_suspect_is_qualified_in_service_and_a_caught_lemon_needs_no_lemon_drain(
        catch):
    lemony = replace(SMALL, lemon_share=0.05, bad_repair_share=0.0)
    perfect = replace(catch, defective=1.0)
    off = timeline(lemony, "qualify", perfect)
    on = timeline(replace(lemony, qualify_after_kills=1), "qualify", perfect)
    # Off, a lemon with no visible failure kills jobs until the lemon rule drains it; on, its
    # first attributed kill sends it to qualification, which fails it (a perfect test here).
    assert off.lemon_drains > 0 and on.lemon_drains < off.lemon_drains / 2
    assert on.silent < off.silent and on.qualify_fails > off.qualify_fails


def test_the_limits_of_qualification_are_measured_on_the_same_draws(catch):
    lim = limits(SMALL, catch)
    assert set(lim) == {"qualify", "perfect_test", "floor"}
    assert all(0.0 < v < 0.2 for v in lim.values())
    # A test that misses nothing leaves no more failures than the real judge (same job and
    # failure draws; only qualification's verdicts differ), within a job or two of noise.
    assert lim["perfect_test"] <= lim["qualify"] + 2 / SMALL.jobs
