"""NVLink throughput and IB error rates in fail-slow detection (issue 25 leftovers): a node whose
NVLink carries far less than its job peers', or one of whose IB ports counts errors while its
peers' count none, becomes a suspect through the same peer and persistence rules (never a drain);
a metric NVML did not answer is absent, never a zero that would look slow."""

from __future__ import annotations

from datetime import datetime, timedelta

import numpy as np
import pandas as pd
import pytest

from rsc_health.config import load_config
from rsc_health.historian.failslow import detect_frame
from rsc_health.historian.failslow.core import Rules, find_runs, judged
from rsc_health.sim.failslow import FailSlowConfig, simulate_failslow

T0 = datetime(2026, 11, 26, 10, 0, 0)
CFG = load_config(None)
NODES = [f"gpu{i:03d}" for i in range(1, 9)]
GB = 1e9


def _job(nodes=NODES, job_id: str = "77", **extra) -> pd.DataFrame:
    return pd.DataFrame({"job_id": job_id, "node": nodes, "start": T0,
                         "end": T0 + timedelta(hours=3), **extra})


def _samples(metric: str, value, component, sweeps: int = 14, seed: int = 0) -> pd.DataFrame:
    """One sample per node per sweep at the node's own phase; value(i, s) None: not answered."""
    rng = np.random.default_rng(seed)
    rows = []
    for i, node in enumerate(NODES):
        phase = int(rng.integers(5, 290))
        for s in range(sweeps):
            v = value(i, s)
            if v is not None:
                rows.append({"node": node, "time": T0 + timedelta(seconds=60 + 300 * s + phase),
                             "metric": metric, "value": v, "component": component(i, s)})
    return pd.DataFrame(rows)


def _traffic(seed: int = 1, level: float = 80 * GB, sd: float = 0.05):
    table = level * np.exp(np.random.default_rng(seed).normal(0, sd, (len(NODES), 40)))
    return lambda i, s: float(table[i, s])


def _gpu(i, s):
    return f"gpu{(i + s) % 8}"  # a healthy node's least busy GPU changes sweep to sweep


def test_a_node_whose_nvlink_carries_a_fifth_of_its_peers_bytes_is_a_suspect():
    level = _traffic()
    samples = _samples("nvlink_data_rate",
                       lambda i, s: level(i, s) * (0.2 if i == 5 and s >= 6 else 1.0),
                       lambda i, s: "gpu2" if i == 5 and s >= 6 else _gpu(i, s))
    found = detect_frame(samples, _job(), None, CFG)
    assert [(e.node, e.metric, e.source) for e in found] == [
        ("gpu006", "nvlink_data_rate", "telemetry")]
    ev = found[0]
    assert ev.value < 0.3 * ev.peer_median and "gpu2" in ev.detail
    assert T0 + timedelta(minutes=31) <= ev.since <= T0 + timedelta(minutes=36)


def test_nvlink_traffic_a_tenth_under_its_peers_or_one_dip_is_not_a_suspect():
    level = _traffic(seed=2)
    steady = _samples("nvlink_data_rate",
                      lambda i, s: level(i, s) * (0.88 if i == 2 else 1.0), _gpu)
    dip = _samples("nvlink_data_rate",
                   lambda i, s: level(i, s) * (0.3 if (i, s) == (4, 7) else 1.0), _gpu)
    assert detect_frame(steady, _job(), None, CFG) == []
    assert detect_frame(dip, _job(), None, CFG) == []


def test_a_checkpoint_that_idles_every_node_for_part_of_its_interval_flags_no_one():
    level = _traffic(seed=3)
    share = np.random.default_rng(9).uniform(0.2, 0.9, len(NODES))

    def ckpt(i, s):  # sweeps 5 and 6: each node idle for its own share of the interval
        return level(i, s) * (share[i] if s in (5, 6) else 1.0)

    assert detect_frame(_samples("nvlink_data_rate", ckpt, _gpu), _job(), None, CFG) == []


def test_nvlink_throughput_not_answered_is_absent_and_never_judged_as_zero():
    """NOT_SUPPORTED (the real H200's answer for the throughput fields) leaves no sample: a node
    with none, or with none for some sweeps, is judged on what it has or not at all."""
    level = _traffic(seed=4)
    samples = _samples("nvlink_data_rate",
                       lambda i, s: None if i == 3 or (i == 6 and s % 2) else level(i, s), _gpu)
    assert detect_frame(samples, _job(), None, CFG) == []
    obs = judged(samples, _job(), None, Rules.from_config(CFG))
    assert "gpu004" not in set(obs["node"]) and (obs["value"] > 0).all()


def test_a_port_whose_errors_rise_while_its_peers_count_none_is_a_suspect():
    def errors(i, s):
        return 0.05 * 1.2 ** (s - 5) if i == 1 and s >= 5 else 0.0

    samples = _samples("ib_error_rate", errors,
                       lambda i, s: "mlx5_3:1" if i == 1 and s >= 5 else "mlx5_0:1")
    found = detect_frame(samples, _job(), None, CFG)
    assert [(e.node, e.metric) for e in found] == [("gpu002", "ib_error_rate")]
    assert found[0].peer_median == 0.0 and "mlx5_3:1" in found[0].detail


def test_error_bursts_on_two_ports_in_two_sweeps_are_not_one_port_rising():
    """Each burst is many lines past peers that count none; the whole-node exception that lets
    a run change GPU does not apply to a cable's errors."""
    def bursts(i, s):
        return 0.3 if i == 4 and s in (6, 7) else 0.0

    samples = _samples("ib_error_rate", bursts,
                       lambda i, s: ("mlx5_1:1" if s == 6 else "mlx5_5:1") if i == 4
                       else "mlx5_0:1")
    assert detect_frame(samples, _job(), None, CFG) == []


def test_a_fabric_event_on_every_port_of_the_job_flags_no_one():
    rng = np.random.default_rng(5)
    level = rng.uniform(0.05, 0.2, (len(NODES), 40))

    def event(i, s):  # sweeps 4-6: a switch flapping, every node's rail-2 port counting
        return float(level[i, s]) if 4 <= s <= 6 else 0.0

    samples = _samples("ib_error_rate", event,
                       lambda i, s: "mlx5_2:1" if 4 <= s <= 6 else "mlx5_0:1")
    assert detect_frame(samples, _job(), None, CFG) == []


def test_a_port_counting_errors_a_little_under_its_busy_peers_stays_in_service():
    """Peers at about 0.3 errors/s (a noisy fabric): a node at twice that is inside the
    heavy-tailed counts' margin (2.5x the median at least)."""
    base = 0.3 * np.exp(np.random.default_rng(6).normal(0, 0.3, (len(NODES), 40)))
    samples = _samples("ib_error_rate",
                       lambda i, s: float(base[i, s]) * (2.0 if i == 0 else 1.0),
                       lambda i, s: "mlx5_0:1")
    assert detect_frame(samples, _job(), None, CFG) == []


@pytest.mark.parametrize("kind,metric", [("nvlink_degraded", "nvlink_data_rate"),
                                         ("ib_port_errors", "ib_error_rate")])
def test_the_lab_injects_the_kind_and_the_detector_finds_most_of_them(kind, metric):
    fleet = simulate_failslow(FailSlowConfig(jobs=30, seed=21, fault_share=1.0,
                                             imbalance_share=0.0, kinds=(kind,),
                                             steps_share=0.0))
    rules = Rules.from_config(CFG)
    runs = find_runs(judged(fleet.samples, fleet.membership, None, rules), rules)
    truth = set(zip(fleet.truth["job_id"], fleet.truth["node"], strict=True))
    found = set(zip(runs["job_id"], runs["node"], strict=True)) & truth
    assert len(found) >= 0.8 * len(truth)
    assert set(runs.loc[runs["metric"] == metric].pipe(
        lambda r: zip(r["job_id"], r["node"], strict=True))) & truth


def _port_counts(counts: dict[int, int], node: int = 3, port: str = "mlx5_6:1"):
    """Errors per sweep on one port of one node (value: errors per second over 300 s); the
    peers' ports count none."""
    def value(i, s):
        return counts.get(s, 0) / 300.0 if i == node else 0.0

    def component(i, s):
        return port if i == node and s in counts else "mlx5_0:1"
    return _samples("ib_error_rate", value, component)


def test_two_healthy_bursts_on_one_port_whose_count_falls_by_three_quarters_are_no_run():
    """Lab seed 1005's false flag: a burst of 77 errors then one of 20 on the same port, then
    none. A port going bad does not fall back to a quarter the next sweep."""
    for first, second in ((77, 20), (91, 13), (60, 22)):
        samples = _port_counts({6: first, 7: second})
        assert detect_frame(samples, _job(), None, CFG) == [], (first, second)


def test_a_failing_port_whose_poisson_count_dips_is_still_found_at_its_second_sweep():
    """16 then 7 errors: under half, but within 3 Poisson sigmas of a steady rate (the drop 9
    against 3 x sqrt(23) = 14.4); and a partial first interval (8 errors, then 40) rising:
    both confirmed at the second outlying sweep, as without the rule."""
    for counts in ({6: 16, 7: 7, 8: 14, 9: 18, 10: 21}, {6: 8, 7: 40, 8: 44, 9: 50},
                   {6: 30, 7: 45, 8: 51, 9: 66}):
        samples = _port_counts(counts)
        found = detect_frame(samples, _job(), None, CFG)
        assert [(e.node, e.metric) for e in found] == [("gpu004", "ib_error_rate")], counts
        rules = Rules.from_config(CFG)
        runs = find_runs(judged(samples, _job(), None, rules), rules)
        second = samples[(samples["node"] == "gpu004")].sort_values("time")["time"].iloc[7]
        assert runs["confirmed"].min() == second, counts


def test_a_failing_port_that_halves_once_after_a_burst_is_found_one_sweep_later():
    """The rule's cost, stated: 60 errors then 20 (a drop beyond chance) starts the run again
    at 20; the port is still found once it keeps counting (20, 24, 30)."""
    samples = _port_counts({6: 60, 7: 20, 8: 24, 9: 30, 10: 33})
    rules = Rules.from_config(CFG)
    runs = find_runs(judged(samples, _job(), None, rules), rules)
    times = samples[(samples["node"] == "gpu004")].sort_values("time")["time"]
    assert list(runs["node"]) == ["gpu004"]
    assert runs["confirmed"].iloc[0] == times.iloc[8]


NODES16 = [f"gpu{i:03d}" for i in range(1, 17)]


def _pipeline_nvlink(degraded: dict[int, tuple[int, float]], seed: int = 11,
                     sweeps: int = 16) -> pd.DataFrame:
    """16 nodes of a 4-stage pipeline the job does not name (no step file): the last stage
    (nodes 12-15) moves 0.75 of the others' NVLink bytes (a role); each node a few percent off
    the job's level, 5% noise a sample (the lab's healthy spread). degraded: {node: (from
    sweep, share of its own bytes)}."""
    rng = np.random.default_rng(seed)
    offset = np.exp(rng.normal(0, 0.03, (16, 1)))
    table = 40 * GB * offset * np.exp(rng.normal(0, 0.05, (16, sweeps)))
    table[12:] *= 0.75
    rows = []
    for i, node in enumerate(NODES16):
        phase = int(rng.integers(5, 290))
        for s in range(sweeps):
            v = float(table[i, s])
            comp = f"gpu{(i + s) % 8}"
            if i in degraded and s >= degraded[i][0]:
                v *= degraded[i][1]
                comp = "gpu2"
            rows.append({"node": node, "time": T0 + timedelta(seconds=60 + 300 * s + phase),
                         "metric": "nvlink_data_rate", "value": v, "component": comp})
    return pd.DataFrame(rows)


def test_a_gpu_at_half_its_bytes_beside_a_lighter_last_stage_is_found_in_two_sweeps():
    """Lab seed 3003, job 5108: a lighter last stage the telemetry cannot name widens the
    job's spread, the line sits at its 50% cap, and a GPU dropping to 0.55 of its own bytes
    crossed it only now and then (found 27 minutes late). Each node is judged against its own
    level in the job (its first slots' share of the peers' median, the lighter role only):
    the stage is level with the rest, and the drop is 45% of the node's own bytes."""
    samples = _pipeline_nvlink({2: (6, 0.55)})
    job = _job(NODES16)
    rules = Rules.from_config(CFG)
    runs = find_runs(judged(samples, job, None, rules), rules)
    assert list(runs["node"]) == ["gpu003"] and list(runs["metric"]) == ["nvlink_data_rate"]
    times = samples[samples["node"] == "gpu003"].sort_values("time")["time"].reset_index(
        drop=True)
    assert runs["since"].iloc[0] == times[6] and runs["confirmed"].iloc[0] == times[7]
    # the lighter stage alone is a role: no suspect
    assert detect_frame(_pipeline_nvlink({}), job, None, CFG) == []


def test_a_gpu_whose_nvlink_was_down_before_its_job_began_is_still_a_suspect():
    """A node's own level is its first slots': one at a fifth of its peers' bytes from the
    start is at its level, and is still judged against its peers (four lines past: the
    bar for a node with no onset)."""
    samples = _pipeline_nvlink({5: (0, 0.2)})
    found = detect_frame(samples, _job(NODES16), None, CFG)
    assert [(e.node, e.metric) for e in found] == [("gpu006", "nvlink_data_rate")]


def test_a_busy_gpu_read_at_gen1_on_two_gpus_in_two_sweeps_is_not_a_link_going_bad():
    # A checkpoint's first second: a GPU whose utilization sample still holds its last kernels
    # while its link has idled to Gen1 reads a quarter. Caught twice in a row, on gpu6 then
    # gpu4 (seed 108 job 5042 of the lab once the lab read idle GPUs as the collector does).
    blip = _samples("pcie_link_ratio", lambda i, s: 0.25 if (i, s) in ((3, 4), (3, 5)) else 1.0,
                    lambda i, s: {(3, 4): "gpu6", (3, 5): "gpu4"}.get((i, s), "gpu0"))
    assert detect_frame(blip, _job(), None, CFG) == []
    # A link downtrained to x8 stays one GPU's: a suspect from its second sweep.
    x8 = _samples("pcie_link_ratio", lambda i, s: 0.5 if i == 3 and s >= 4 else 1.0,
                  lambda i, s: "gpu6" if i == 3 and s >= 4 else "gpu0")
    found = detect_frame(x8, _job(), None, CFG)
    assert [(e.node, e.metric) for e in found] == [("gpu004", "pcie_link_ratio")]
    assert "gpu6" in found[0].detail
    assert T0 + timedelta(minutes=21) <= found[0].since <= T0 + timedelta(minutes=26)
