"""The across-jobs lab (rsc_health/sim/recurring.py): its step times carry what the product's
load.job_steps hands the judge (each node's mean a job, grouped by the stage the files name),
the roles the judge must not take for faults, and nodes slow in their steps alone."""

from __future__ import annotations

import numpy as np
import pandas as pd

from rsc_health.sim.recurring import KINDS, RecurringConfig, simulate_recurring


def _fleet():
    return simulate_recurring(RecurringConfig(seed=3, nodes=128, days=4, jobs_per_day=80,
                                              slow_share=0.06))


def test_half_the_jobs_write_steps_grouped_by_the_stage_their_files_name():
    r = _fleet().rollups
    steps = r[r["metric"] == "step_seconds"]
    jobs = r["job_id"].nunique()
    assert 0.35 < steps["job_id"].nunique() / jobs < 0.65
    assert steps["group"].str.startswith("stage:").all()
    assert (steps["group"] == "stage:").any() and (steps["group"] != "stage:").any()
    assert np.isfinite(steps["value"]).all() and (steps["value"] > 0).all()
    # one row a job and node, as the database's average gives it
    assert not steps.duplicated(["job_id", "node"]).any()


def test_a_steps_slow_node_is_behind_its_peers_in_its_steps_and_level_in_its_telemetry():
    fleet = _fleet()
    r = fleet.rollups
    assert set(fleet.slow["kind"]) <= set(KINDS)
    slow = fleet.slow[fleet.slow["kind"] == "steps_slow"]
    assert len(slow)
    ratios: dict[str, list[float]] = {"step_seconds": [], "nvlink_data_rate": []}
    for _, s in slow.iterrows():
        mine = r[(r["node"] == s["node"]) & (pd.to_datetime(r["start"]) >= s["since"])]
        for (job, metric, grp), row in mine.groupby(["job_id", "metric", "group"]):
            if metric not in ratios:
                continue
            peers = r[(r["job_id"] == job) & (r["metric"] == metric) & (r["group"] == grp)
                      & (r["node"] != s["node"])]
            if len(peers) >= 3:
                ratios[metric].append(float(row["value"].iloc[0] / peers["value"].median()))
    assert ratios["step_seconds"] and ratios["nvlink_data_rate"]
    assert 1.03 < float(np.median(ratios["step_seconds"])) < 1.2
    assert 0.93 < float(np.median(ratios["nvlink_data_rate"])) < 1.07


def test_a_trainings_last_node_takes_longer_steps_in_stage_less_files():
    r = _fleet().rollups
    steps = r[(r["metric"] == "step_seconds") & r["workload"].str.contains("/train-")]
    assert steps["job_id"].nunique() >= 5
    last = []
    for _job, j in steps.groupby("job_id"):
        order = sorted(j["node"])
        v = j.set_index("node")["value"]
        last.append(float(v[order[-1]] / v[order[:-1]].median()))
    assert (np.asarray(last) > 1.05).mean() > 0.8
