"""Fail-slow detection: each node of a multi-node job against the job's other nodes, persisting,
never for a job-wide move (rsc_health/historian/failslow/core.py, docs/failslow.md)."""

from __future__ import annotations

import math
from datetime import datetime, timedelta

import numpy as np
import pandas as pd
import pytest

from rsc_health.config import load_config
from rsc_health.historian.failslow import SuspectEvidence, detect_frame
from rsc_health.historian.failslow.core import Rules, find_runs, judged

T0 = datetime(2026, 11, 26, 10, 0, 0)
CFG = load_config(None)


def _job(job_id: str, nodes: list[str], start=T0, end=None, **extra) -> pd.DataFrame:
    return pd.DataFrame({"job_id": job_id, "node": nodes, "start": start,
                         "end": end or start + timedelta(hours=3), **extra})


def _samples(nodes: list[str], metric: str, values, sweeps: int, start=T0,
             seed: int = 0) -> pd.DataFrame:
    """One sample per node per sweep, each node at its own phase in the sweep; `values` is a
    function (node index, sweep) -> value."""
    rng = np.random.default_rng(seed)
    rows = []
    for i, node in enumerate(nodes):
        phase = int(rng.integers(5, 290))
        for s in range(sweeps):
            rows.append({"node": node, "time": start + timedelta(seconds=60 + 300 * s + phase),
                         "metric": metric, "value": values(i, s), "component": "gpu3"})
    return pd.DataFrame(rows)


NODES = [f"gpu{i:03d}" for i in range(1, 9)]


def _noisy(seed: int, level: float, sd: float):
    rng = np.random.default_rng(seed)
    table = level + rng.normal(0, sd, (len(NODES), 40))
    return lambda i, s: float(table[i, s])


def test_a_gpu_stuck_in_hw_slowdown_is_a_suspect_after_two_sweeps_with_its_evidence():
    base = _noisy(1, 0.0, 0.01)
    samples = _samples(NODES, "throttle_hw_frac",
                       lambda i, s: max(0.0, base(i, s)) + (0.8 if i == 4 and s >= 6 else 0.0),
                       12)
    found = detect_frame(samples, _job("4242", NODES), None, CFG)
    assert [(e.node, e.metric, e.source, e.job_ids) for e in found] == [
        ("gpu005", "throttle_hw_frac", "telemetry", ("4242",))]
    ev = found[0]
    assert isinstance(ev, SuspectEvidence)
    assert ev.value == pytest.approx(0.8, abs=0.05) and abs(ev.peer_median) < 0.02
    assert ev.deviation > CFG.get("failslow.k")
    assert T0 + timedelta(minutes=31) <= ev.since <= T0 + timedelta(minutes=36)
    assert ev.last > ev.since and "gpu3" in ev.detail and "4242" in ev.detail


def test_one_outlying_sweep_is_noise_not_a_suspect():
    samples = _samples(NODES, "throttle_hw_frac", lambda i, s: 0.9 if (i, s) == (2, 5) else 0.0,
                       12)
    assert detect_frame(samples, _job("1", NODES), None, CFG) == []


def test_a_point_sampled_clock_needs_three_sweeps():
    clock = _noisy(2, 0.97, 0.004)

    def two_dips(i, s):
        return clock(i, s) * (0.7 if i == 1 and s in (4, 5) else 1.0)

    assert detect_frame(_samples(NODES, "sm_clock_ratio", two_dips, 12), _job("1", NODES),
                        None, CFG) == []

    def stuck(i, s):
        return clock(i, s) * (0.7 if i == 1 and s >= 4 else 1.0)

    found = detect_frame(_samples(NODES, "sm_clock_ratio", stuck, 12), _job("1", NODES),
                         None, CFG)
    assert [(e.node, e.metric) for e in found] == [("gpu002", "sm_clock_ratio")]


def test_direction_matters_a_faster_clock_or_a_quieter_port_is_never_suspect():
    clock = _noisy(3, 0.95, 0.004)
    fast = _samples(NODES, "sm_clock_ratio", lambda i, s: 1.0 if i == 0 else clock(i, s), 12)
    wait = _noisy(4, 1e6, 5e4)
    quiet = _samples(NODES, "ib_xmit_wait_rate", lambda i, s: 0.0 if i == 0 else wait(i, s), 12)
    busy = _samples(NODES, "ib_xmit_wait_rate",
                    lambda i, s: 8 * wait(i, s) if i == 0 and s > 3 else wait(i, s), 12)
    member = _job("9", NODES)
    assert detect_frame(pd.concat([fast, quiet]), member, None, CFG) == []
    assert [(e.node, e.metric) for e in detect_frame(busy, member, None, CFG)] == [
        ("gpu001", "ib_xmit_wait_rate")]


def test_a_tight_healthy_fleet_does_not_flag_one_percent_noise():
    """A spread of 0.1% would put k x spread at 0.4%: the 2.5% floor keeps a node 1% under
    its peers, for the whole job, in service."""
    tight = _noisy(5, 0.98, 0.001)
    samples = _samples(NODES, "sm_clock_ratio",
                       lambda i, s: tight(i, s) * (0.99 if i == 3 else 1.0), 30)
    assert detect_frame(samples, _job("1", NODES), None, CFG) == []


def test_every_node_shifting_together_is_the_job_not_a_node():
    clock = _noisy(6, 0.97, 0.004)
    samples = _samples(NODES, "sm_clock_ratio",
                       lambda i, s: clock(i, s) * (0.8 if s >= 5 else 1.0), 15)
    assert detect_frame(samples, _job("1", NODES), None, CFG) == []


def test_a_leaf_switchs_share_of_the_job_congested_together_flags_no_node():
    nodes = [f"n{i:02d}" for i in range(16)]
    rng = np.random.default_rng(7)
    noise = np.exp(rng.normal(0, 0.25, (16, 20)))
    leaf = {1, 4, 6, 9, 11, 14}  # 6 of 16 behind one leaf switch, 6x congestion
    samples = _samples(nodes, "ib_xmit_wait_rate",
                       lambda i, s: 5e5 * noise[i, s] * (6 if i in leaf and s >= 6 else 1), 20)
    assert detect_frame(samples, _job("1", nodes), None, CFG) == []


def test_jobs_too_small_to_have_peers_are_not_judged():
    nodes = NODES[:3]
    samples = _samples(nodes, "throttle_hw_frac", lambda i, s: 0.9 if i == 0 else 0.0, 12)
    assert detect_frame(samples, _job("1", nodes), None, CFG) == []


def test_samples_outside_the_jobs_time_are_not_judged_against_it():
    samples = _samples(NODES, "throttle_hw_frac", lambda i, s: 0.9 if i == 0 else 0.0, 12)
    later = _job("1", NODES, start=T0 + timedelta(hours=5))
    assert detect_frame(samples, later, None, CFG) == []


def test_peers_are_the_same_gpu_model():
    """An A100 whose clock sits 20% under its job's seven H100s has no peer of its model: it is
    not judged (nor are they against it); without the model it would be a suspect."""
    clock = _noisy(8, 0.97, 0.003)
    samples = _samples(NODES, "sm_clock_ratio",
                       lambda i, s: clock(i, s) * (0.8 if i == 0 else 1.0), 12)
    models = ["A100"] + ["H100"] * 7
    assert detect_frame(samples, _job("1", NODES, gpu_model=models), None, CFG) == []
    assert [e.node for e in detect_frame(samples, _job("1", NODES), None, CFG)] == ["gpu001"]


def test_hostile_values_are_ignored_not_fatal():
    base = _samples(NODES, "throttle_hw_frac", lambda i, s: 0.0, 12)
    bad = base.copy()
    bad["value"] = bad["value"].astype(object)
    bad.loc[bad.index[::5], "value"] = "garbage"
    bad.loc[bad.index[1::5], "value"] = math.nan
    bad.loc[bad.index[2::5], "value"] = math.inf
    bad.loc[bad.index[3::7], "value"] = -1e308
    other = _samples(NODES, "not_a_metric", lambda i, s: 1e9 if i == 0 else 0.0, 12)
    assert detect_frame(pd.concat([bad, other]), _job("1", NODES), None, CFG) == []


def _steps(nodes, stages, seconds, windows=24, job="77"):
    rows = []
    for i, node in enumerate(nodes):
        for r in range(8):
            for w in range(windows):
                rows.append({"job_id": job, "rank": i * 8 + r, "node": node,
                             "stage": stages[i], "step": w, "seconds": seconds(i, r, w),
                             "time": T0 + timedelta(seconds=150 * w + 149)})
    return pd.DataFrame(rows)


def test_a_rank_slow_in_its_step_times_makes_its_node_a_suspect_from_steps():
    rng = np.random.default_rng(9)
    noise = np.exp(rng.normal(0, 0.02, (8, 8, 24)))
    steps = _steps(NODES, [""] * 8,
                   lambda i, r, w: 0.5 * noise[i, r, w] * (1.3 if (i, r) == (6, 2) and w >= 8
                                                           else 1.0))
    found = detect_frame(pd.DataFrame(columns=["node", "time", "metric", "value", "component"]),
                         _job("77", NODES), steps, CFG)
    assert [(e.node, e.source, e.metric) for e in found] == [("gpu007", "steps", "step_seconds")]
    assert "rank 50" in found[0].detail


def test_a_heavier_last_pipeline_stage_is_the_workload_when_the_stage_is_known():
    nodes = [f"n{i:02d}" for i in range(16)]
    stages = [str(i // 4) for i in range(16)]
    rng = np.random.default_rng(10)
    noise = np.exp(rng.normal(0, 0.03, (16, 8, 24)))
    steps = _steps(nodes, stages,
                   lambda i, r, w: noise[i, r, w] * (1.3 if stages[i] == "3" else 1.0))
    member = _job("77", nodes, stage=stages)
    assert detect_frame(None, member, steps, CFG) == []


def test_evidence_from_two_jobs_is_one_suspect_naming_both():
    first = _samples(NODES, "throttle_hw_frac", lambda i, s: 0.9 if i == 0 else 0.0, 6)
    later = T0 + timedelta(hours=4)
    second = _samples(NODES, "throttle_hw_frac", lambda i, s: 0.9 if i == 0 else 0.0, 6,
                      start=later)
    member = pd.concat([_job("1", NODES), _job("2", NODES, start=later)])
    found = detect_frame(pd.concat([first, second]), member, None, CFG)
    assert [(e.node, e.job_ids) for e in found] == [("gpu001", ("1", "2"))]
    assert found[0].since < later < found[0].last


def test_runs_say_when_persistence_was_reached():
    samples = _samples(NODES, "throttle_hw_frac", lambda i, s: 0.9 if i == 0 and s >= 4 else 0,
                       12)
    rules = Rules.from_config(CFG)
    runs = find_runs(judged(samples, _job("1", NODES), None, rules), rules)
    run = runs.iloc[0]
    assert run["since"] < run["confirmed"] <= run["since"] + timedelta(minutes=10)


def test_a_direction_that_is_neither_low_nor_high_is_refused():
    from rsc_health.config import Config

    cfg = Config({"failslow": {"metrics": {"x": {"direction": "sideways"}}}})
    with pytest.raises(ValueError, match="sideways"):
        Rules.from_config(cfg)


def test_aware_and_naive_times_are_the_same_utc_clock():
    """Telemetry stamped with an offset, jobs in the historian's naive UTC: one clock."""
    samples = _samples(NODES, "throttle_hw_frac", lambda i, s: 0.9 if i == 0 and s >= 4 else 0,
                       12)
    aware = samples.assign(time=pd.to_datetime(samples["time"]).dt.tz_localize("UTC")
                           .dt.tz_convert("Europe/Paris"))
    found = detect_frame(aware, _job("1", NODES), None, CFG)
    assert [e.node for e in found] == ["gpu001"]
    assert found[0].since == detect_frame(samples, _job("1", NODES), None, CFG)[0].since


def test_config_check_names_a_metric_direction_that_is_neither(tmp_path):
    from rsc_health.config import ConfigError

    path = tmp_path / "config.toml"
    path.write_text('[failslow.metrics.my_metric]\ndirection = "sideways"\n')
    with pytest.raises(ConfigError, match="my_metric: direction: expected one of low, high"):
        load_config(path)


def test_a_step_file_naming_nodes_its_job_never_ran_on_makes_no_suspect_of_them():
    """Step times are the job's word: a file that puts a slow rank on a node outside the job
    (or outside the job's time there) is not judged; the job's own nodes still are."""
    rng = np.random.default_rng(12)
    noise = np.exp(rng.normal(0, 0.02, (8, 8, 24)))
    outsiders = [f"victim{i}" for i in range(8)]
    steps = _steps(outsiders, [""] * 8,
                   lambda i, r, w: 0.5 * noise[i, r, w] * (3.0 if i == 0 else 1.0))
    assert detect_frame(None, _job("77", NODES), steps, CFG) == []
    early = _job("77", outsiders, start=T0 + timedelta(hours=2))
    assert detect_frame(None, early, steps, CFG) == []
    assert [e.node for e in detect_frame(None, _job("77", outsiders), steps, CFG)] == [
        "victim0"]
    assert detect_frame(None, pd.DataFrame(columns=["job_id", "node", "start", "end"]), steps,
                        CFG) == []


def test_a_negative_link_ratio_from_a_garbled_node_does_not_hide_a_real_downtrain():
    """A value no node writes (a link ratio of -5: the flush refuses it now, rows stored
    before are still there) is not judged: counted, it was a node that moved with its job in
    a job of 8, and gpu005's x16 -> x8 onset was the job's."""
    def link(i, s):
        if i == 4 and s >= 5:
            return 0.5  # gpu005: x16 -> x8 mid-job
        if i == 6:
            return -5.0  # gpu007: a garbled (or hostile) record, every sweep
        return 1.0

    found = detect_frame(_samples(NODES, "pcie_link_ratio", link, 12), _job("1", NODES),
                         None, CFG)
    assert [(e.node, e.metric) for e in found] == [("gpu005", "pcie_link_ratio")]
