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


def test_a_healthy_ports_lone_error_burst_stays_within_what_the_infiniband_family_keeps():
    """ib_error_rate is the link's own physical errors: a healthy port's one-sweep burst is at
    most what the infiniband family keeps in service in a sweep (symbol 10 + link recovery 1 +
    link integrity 10 = 21; past it the family drains the node as a bad cable). A count past
    that on a healthy node is a fabric event's: in its sweep, another node of the job counts
    errors on the same port."""
    from rsc_health.sim.failslow import HEALTHY_BURST_MAX

    assert HEALTHY_BURST_MAX == 21
    fleet = simulate_failslow(FailSlowConfig(jobs=80, seed=8, fault_share=0.0))
    s = fleet.samples[fleet.samples["metric"] == "ib_error_rate"].merge(
        fleet.membership[["job_id", "node", "start"]], on="node")
    s = s.assign(count=(s["value"] * 300).round(),
                 sweep=((s["time"] - s["start"]).dt.total_seconds() - 60) // 300)
    big = s[s["count"] > HEALTHY_BURST_MAX]
    assert len(big) > 0  # fabric events do count past it
    others = s[s["count"] > 0].groupby(["job_id", "sweep", "component"])["node"].nunique()
    for row in big.itertuples():
        assert others[(row.job_id, row.sweep, row.component)] >= 2, row


def test_from_start_puts_every_fault_at_its_jobs_first_sweep_in_the_same_jobs():
    usual = simulate_failslow(FailSlowConfig(jobs=30, seed=4))
    early = simulate_failslow(FailSlowConfig(jobs=30, seed=4, from_start=True))
    starts = early.membership.groupby("job_id")["start"].min()
    onsets = early.truth.set_index("job_id")["onset"]
    assert len(onsets) and (pd.to_datetime(onsets)
                            == pd.to_datetime(starts.reindex(onsets.index))
                            + pd.Timedelta(seconds=60)).all()
    # the same jobs (sizes, kinds, spans): the plans are drawn before the faults (the shifts
    # are drawn after a job's faults, so they differ)
    cols = ["job_id", "nodes", "start", "end", "kind"]
    pd.testing.assert_frame_equal(usual.jobs[cols], early.jobs[cols])
    assert len(usual.truth) == len(early.truth)


def test_a_healthy_link_reads_gen1_only_where_the_collector_would_call_its_gpu_busy():
    # The collector reads an idle GPU's link width only (checks/telemetry._pcie_link_ratio),
    # so a checkpoint idling a job's GPUs leaves a healthy link at 1.0 but for the few GPUs
    # caught busy as their link idles down (TRANSITION_SHARE of the nodes it catches).
    from rsc_health.checks.telemetry import _pcie_link_ratio
    from rsc_health.sim.failslow import TRANSITION_SHARE

    idle_gen1 = {"gen": 1, "max_gen": 4, "width": 16, "max_width": 16}
    assert _pcie_link_ratio(idle_gen1, busy=False) == 1.0
    assert _pcie_link_ratio(idle_gen1, busy=True) == 0.25
    fleet = simulate_failslow(FailSlowConfig(jobs=60, seed=7, fault_share=0.0))
    pcie = fleet.samples[fleet.samples["metric"] == "pcie_link_ratio"]["value"]
    quarter = float((pcie == 0.25).mean())
    # checkpoints in 3% of sweeps catch 30-100% of a job's nodes: ~2% of samples before
    assert 0 < quarter < 0.03 * TRANSITION_SHARE * 2
    assert set(pcie.unique()) <= {0.25, 1.0}
