"""D4: judge.judge with a peers' median of 0 (higher is better): rel spread is set to inf, the
margin to max_margin, the line to 0 x (1 - margin) = 0, and `value < 0` is never true: every
value passes, 0 GB/s included. The fleet's first nodes' values are peers whatever they measured
(store._usable: UNJUDGED), so a tool that printed 0.00 on them (perftest BW average, nccl busbw:
outcome.number accepts 0) makes a node measuring 0 GB/s pass, and be stored as a PASS peer."""
from __future__ import annotations

from rsc_health.qualify.judge import Rules, judge  # noqa: E402
from rsc_health.qualify.outcome import Metric  # noqa: E402
from rsc_health.sim import qualify_tools as standin  # noqa: E402
from tests.unit.qualify_bad_node.qhelp import IB, db, qrun, tier, tools  # noqa: E402

CONFIG = tier(IB)


def test_judge_passes_zero_against_a_zero_median():
    m = Metric("ib-loopback/ib_write_8388608_mlx5_0_bw", 0.0, "GB/s", "hca", "mlx5_0")
    j = judge(m, [0.0] * 8, rules=Rules(min_peers=4))
    assert j.status != "pass", j     # observed: pass, line 0


def test_a_node_measuring_0_gbps_passes_once_the_first_nodes_did(tmp_path):
    cfg = tmp_path / "config.toml"
    cfg.write_text(CONFIG)
    url = db(tmp_path)
    zero = standin.perftest(0.0)
    assert " 0.00" in zero
    codes = [qrun(cfg, url, f"gpu{i:03d}", tools(tmp_path, f"gpu{i:03d}",
                                                   {"ib_write_bw": zero}))[0] for i in range(5)]
    # Observed [4, 4, 4, 4, 0]: the 5th node, 0 GB/s on mlx5_0, passes (exit 0).
    assert 0 not in codes, codes
