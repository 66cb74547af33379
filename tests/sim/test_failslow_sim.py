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
              "ib_congested": "ib_xmit_wait_rate", "thermal": "gpu_temp_c",
              "nvlink_degraded": "nvlink_data_rate", "ib_port_errors": "ib_error_rate"}
    s = fleet.samples
    for row in fleet.truth.itertuples():
        assert (row.job_id, row.node) in members
        m = metric[row.kind]
        mine = s[(s["node"] == row.node) & (s["metric"] == m)]
        after = mine[mine["time"] >= row.onset + pd.Timedelta(seconds=300)]["value"].median()
        before = mine[mine["time"] < row.onset]["value"].median()
        lower = row.kind in ("pcie_x8", "nvlink_degraded")
        assert after < before if lower else after > before, row
    assert set(fleet.truth["kind"]) == {"hw_slowdown", "pcie_x8", "ib_congested", "thermal",
                                        "nvlink_degraded", "ib_port_errors"}


def test_nvlink_throughput_not_supported_is_no_sample_never_a_zero():
    """A share of jobs' GPUs answer NOT_SUPPORTED for the throughput fields (the real H200):
    those jobs have no nvlink_data_rate sample at all; where there is one it is traffic."""
    fleet = simulate_failslow(FailSlowConfig(jobs=40, seed=6, nvlink_unsupported_share=0.5))
    nvl = fleet.samples[fleet.samples["metric"] == "nvlink_data_rate"]
    assert (nvl["value"] > 0).all() and nvl["value"].notna().all()
    with_nvl = fleet.membership[fleet.membership["node"].isin(set(nvl["node"]))]["job_id"]
    assert 0 < with_nvl.nunique() < fleet.jobs["job_id"].nunique()
