"""The fail-slow rules that pair a metric with another (`corroborated_by`) or judge it at each
node's own level (`levelled`) are [failslow.metrics.NAME] config keys with their defaults in
default_config.toml (issue 25), not constants of core.py: a site can switch them, and a
misspelt corroborator is a config error, never a rule that silently never vouches."""

from __future__ import annotations

from datetime import datetime, timedelta

import numpy as np
import pandas as pd
import pytest

from rsc_health.config import ConfigError, load_config
from rsc_health.historian.failslow import detect_frame
from rsc_health.historian.failslow.core import Rules

T0 = datetime(2026, 11, 26, 10, 0, 0)
NODES = [f"gpu{i:03d}" for i in range(1, 9)]
DEFAULTS = load_config(None)


def _site(tmp_path, text: str):
    path = tmp_path / "config.toml"
    path.write_text(text)
    return load_config(str(path))


def _job() -> pd.DataFrame:
    return pd.DataFrame({"job_id": "31", "node": NODES, "start": T0,
                         "end": T0 + timedelta(hours=3)})


def _samples(metric: str, value, component, sweeps: int = 12, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    for i, node in enumerate(NODES):
        phase = int(rng.integers(5, 290))
        for s in range(sweeps):
            rows.append({"node": node, "time": T0 + timedelta(seconds=60 + 300 * s + phase),
                         "metric": metric, "value": value(i, s), "component": component(i, s)})
    return pd.DataFrame(rows)


def test_the_pairing_rules_are_config_keys_with_their_defaults():
    rules = Rules.from_config(DEFAULTS).metrics
    assert rules["throttle_hw_frac"].corroborated_by == ("sm_clock_ratio",)
    assert rules["nvlink_data_rate"].levelled
    others = {m for m, r in rules.items() if r.corroborated_by or r.levelled}
    assert others == {"throttle_hw_frac", "nvlink_data_rate"}


def _jitter_twice() -> pd.DataFrame:
    """GPU 3 of node 2 throttled a third of two intervals in a row, its clock with its peers'
    (the jitter a corroborator tells from a GPU held in slowdown)."""
    clock = np.random.default_rng(5).normal(0.97, 0.004, (len(NODES), 12))
    hw = _samples("throttle_hw_frac", lambda i, s: 0.33 if i == 1 and s in (5, 6) else 0.0,
                  lambda i, s: "gpu3" if i == 1 else f"gpu{s % 8}")
    sm = _samples("sm_clock_ratio", lambda i, s: float(clock[i, s]), lambda i, s: f"gpu{s % 8}")
    return pd.concat([hw, sm], ignore_index=True)


def test_a_site_that_names_no_corroborator_confirms_a_throttle_run_at_two_sweeps(tmp_path):
    samples = _jitter_twice()
    assert detect_frame(samples, _job(), None, DEFAULTS) == []
    bare = _site(tmp_path, '[failslow.metrics.throttle_hw_frac]\ndirection = "high"\n'
                       "corroborated_by = []\n")
    found = detect_frame(samples, _job(), None, bare)
    assert [(e.node, e.metric) for e in found] == [("gpu002", "throttle_hw_frac")]


def test_a_site_that_turns_levelling_off_judges_a_node_light_from_the_start(tmp_path):
    """A node at half its peers' NVLink bytes from its first sweep is at its own level (no
    onset) and under two lines past them: no suspect by default; judged on the raw median,
    it is past the line in every sweep."""
    level = 60e9 * np.exp(np.random.default_rng(7).normal(0, 0.05, (len(NODES), 12)))
    samples = _samples("nvlink_data_rate",
                       lambda i, s: float(level[i, s]) * (0.5 if i == 4 else 1.0),
                       lambda i, s: "gpu2" if i == 4 else f"gpu{(i + s) % 8}")
    assert detect_frame(samples, _job(), None, DEFAULTS) == []
    flat = _site(tmp_path, '[failslow.metrics.nvlink_data_rate]\ndirection = "low"\n'
                       "levelled = false\n")
    found = detect_frame(samples, _job(), None, flat)
    assert [(e.node, e.metric) for e in found] == [("gpu005", "nvlink_data_rate")]


def test_a_corroborator_that_is_no_judged_metric_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match=r"throttle_hw_frac\] corroborated_by: "
                                          r"'sm_clock_ration' is not a judged metric"):
        _site(tmp_path, '[failslow.metrics.throttle_hw_frac]\ndirection = "high"\n'
                        'corroborated_by = ["sm_clock_ration"]\n')
    # a site's own metric may corroborate, and be corroborated
    cfg = _site(tmp_path, '[failslow.metrics.my_rate]\ndirection = "high"\n'
                          'corroborated_by = ["step_seconds"]\n'
                          '[failslow.metrics.throttle_hw_frac]\ndirection = "high"\n'
                          'corroborated_by = ["my_rate"]\n')
    assert Rules.from_config(cfg).metrics["my_rate"].corroborated_by == ("step_seconds",)


def _steps(slow_node: int | None, from_sweep: int, factor: float) -> pd.DataFrame:
    """8 ranks a node, two windows a sweep, 2% noise; `slow_node`'s rank 5 `factor` slower from
    `from_sweep` on (a step file's lines: the job's clock)."""
    noise = np.exp(np.random.default_rng(3).normal(0, 0.02, (len(NODES), 8, 24)))
    rows = []
    for i, node in enumerate(NODES):
        for r in range(8):
            for w in range(24):
                slow = factor if i == slow_node and r == 5 and w // 2 >= from_sweep else 1.0
                rows.append({"job_id": "31", "rank": i * 8 + r, "node": node, "stage": "",
                             "step": w, "seconds": 0.5 * noise[i, r, w] * slow,
                             "time": T0 + timedelta(seconds=150 * w + 149)})
    return pd.DataFrame(rows)


def test_an_error_run_a_site_asks_to_show_a_slowdown_waits_a_sweep_without_one(tmp_path):
    """`corroborated_by` on ib_error_rate (a site's choice; not the default): a port counting
    errors two sweeps running is confirmed at its second sweep when its node's step times are
    slow in one of them (any rank: the step metric's component is a rank, not a port), else at
    its third. Its count, many lines past peers that count none, does not vouch for itself."""
    site = _site(tmp_path, '[failslow.metrics.ib_error_rate]\ndirection = "high"\n'
                           'corroborated_by = ["ib_xmit_wait_rate", "step_seconds"]\n')
    rules = Rules.from_config(site)

    def port(errors_from: int):
        return _samples("ib_error_rate",
                        lambda i, s: 0.1 if i == 2 and s >= errors_from else 0.0,
                        lambda i, s: "mlx5_3:1" if i == 2 else "mlx5_0:1")

    def confirmed(samples, steps, cfg):
        from rsc_health.historian.failslow.core import find_runs, judged
        runs = find_runs(judged(samples, _job(), steps, cfg), cfg)
        runs = runs[runs["metric"] == "ib_error_rate"]
        times = samples[samples["node"] == "gpu003"].sort_values("time")["time"].tolist()
        return [times.index(t) for t in runs["confirmed"]]

    keeps_pace = _steps(None, 0, 1.0)
    slowed = _steps(2, 6, 1.25)
    assert confirmed(port(6), keeps_pace, Rules.from_config(DEFAULTS)) == [7]
    assert confirmed(port(6), keeps_pace, rules) == [8]
    assert confirmed(port(6), slowed, rules) == [7]
    # two sweeps and no more, nothing slow: no suspect for the site, one by default
    burst = _samples("ib_error_rate", lambda i, s: 0.1 if i == 2 and s in (6, 7) else 0.0,
                     lambda i, s: "mlx5_3:1" if i == 2 else "mlx5_0:1")
    assert detect_frame(burst, _job(), keeps_pace, site) == []
    assert [e.node for e in detect_frame(burst, _job(), keeps_pace, DEFAULTS)] == ["gpu003"]
