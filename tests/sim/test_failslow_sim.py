"""The fail-slow lab (rsc_health/sim/failslow.py): the same seed gives the same fleet, the truth
names nodes that ran the jobs it names, and the injected faults show in the metric they are
about from their onset."""

from __future__ import annotations

import pandas as pd

from rsc_health.sim.failslow import FailSlowConfig, simulate_failslow


def test_the_same_seed_gives_the_same_fleet_and_another_seed_another():
    a = simulate_failslow(FailSlowConfig(jobs=12, seed=3))
    b = simulate_failslow(FailSlowConfig(jobs=12, seed=3))
    c = simulate_failslow(FailSlowConfig(jobs=12, seed=4))
    pd.testing.assert_frame_equal(a.samples, b.samples)
    pd.testing.assert_frame_equal(a.steps, b.steps)
    assert not a.samples["value"].equals(c.samples["value"])


def test_every_injected_node_ran_its_job_and_shows_its_fault_after_onset():
    fleet = simulate_failslow(FailSlowConfig(jobs=60, seed=5, fault_share=1.0,
                                             imbalance_share=0.0))
    members = set(zip(fleet.membership["job_id"], fleet.membership["node"], strict=True))
    metric = {"hw_slowdown": "throttle_hw_frac", "pcie_x8": "pcie_link_ratio",
              "ib_congested": "ib_xmit_wait_rate", "thermal": "gpu_temp_c"}
    s = fleet.samples
    for row in fleet.truth.itertuples():
        assert (row.job_id, row.node) in members
        m = metric[row.kind]
        mine = s[(s["node"] == row.node) & (s["metric"] == m)]
        after = mine[mine["time"] >= row.onset + pd.Timedelta(seconds=300)]["value"].median()
        before = mine[mine["time"] < row.onset]["value"].median()
        assert after > before if row.kind != "pcie_x8" else after < before, row
    assert set(fleet.truth["kind"]) == {"hw_slowdown", "pcie_x8", "ib_congested", "thermal"}
