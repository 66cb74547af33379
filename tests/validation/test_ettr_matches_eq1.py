"""Measured ETTR of long simulated runs against the paper's Eq. (1) for the same parameters.

The simulator checkpoints hourly and an interrupted instance loses min(runtime, 30 min) = dt/2
of work; it models no restart overhead u0 nor checkpoint write time w_cp, and requeues after
121 s + Exp(600 s) of queue. Both sides use exactly that (validate.SIM_*), the measured r_f, each
run's N, productive runtime and mean queue per instance.

Tolerance: the mean difference over the runs must be within 3 standard errors of the paired
differences (runs are independent draws; each has a handful of failures, so single runs differ
a lot) and within 5% of the expected value, the paper's own accuracy for Eq. (1) against Monte
Carlo (Appendix A). The stressed fleet fails ~5x as often, so there the failure term matters."""

from __future__ import annotations

import pandas as pd
from validation_harness import validate


def _check(runs: pd.DataFrame) -> dict:
    a = validate.ettr_agreement(runs)
    assert a["runs"] >= 30, a
    assert a["interruptions"] >= 30, a  # failures do happen in these runs
    assert abs(a["diff"]) <= 3 * a["se"], a
    assert abs(a["diff"]) <= 0.05 * a["expected"], a
    return a


def test_long_runs_on_validation_seeds_agree_with_eq1(fleets, rf_rows):
    runs = pd.concat([validate.long_runs(f, r["rf_est"] / 1000)
                      for f, r in zip(fleets, rf_rows, strict=True)])
    _check(runs)


def test_long_runs_at_five_times_the_failure_rate_agree_with_eq1(stress_fleet):
    r_f = validate.rf_check(stress_fleet)["rf_est"] / 1000
    a = _check(validate.long_runs(stress_fleet, r_f))
    assert a["expected"] < 0.9, a  # the failure and queue terms are far from negligible here


def test_agreement_is_sensitive_to_the_failure_rate(stress_fleet):
    """The comparison sees the failure term: Eq. (1) with no failures, or with twice the measured
    r_f, falls outside the same tolerance on the same runs."""
    r_f = validate.rf_check(stress_fleet)["rf_est"] / 1000
    for wrong in (r_f * 1e-4, 2 * r_f):
        a = validate.ettr_agreement(validate.long_runs(stress_fleet, wrong))
        assert abs(a["diff"]) > 3 * a["se"], a
