"""The simulator's schedule respects the nodes: at no instant more GPUs allocated on a node than
it has, no job started on a node that is out for repair, and the fleet kept about 85% busy."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from rsc_health.sim import SimConfig, simulate

sys.path.insert(0, str(Path(__file__).parent))
from capacity import intervals, load, max_gpus_per_node, starts_during_repair  # noqa: E402


@pytest.mark.parametrize(("nodes", "days", "seed"), [(64, 30, 3), (256, 45, 7)])
def test_no_node_ever_holds_more_than_its_gpus_or_starts_a_job_in_repair(tmp_path, nodes,
                                                                          days, seed):
    simulate(SimConfig(nodes=nodes, days=days, seed=seed), tmp_path)
    rows, truth = load(tmp_path)
    assert max_gpus_per_node(intervals(rows, truth)) <= 8
    assert starts_during_repair(rows, truth) == []


def test_the_sweep_line_sees_an_overcommitted_node():
    """The check itself: two 8-GPU jobs overlapping on one node are 16 GPUs (the old
    simulator's random placement reached 112)."""
    truth = {"start": "2024-01-01T00:00:00", "days": 1}
    row = {"NodeList": "node0001", "AllocTRES": "billing=8,cpu=64,gres/gpu=8,node=1"}
    rows = [{**row, "Start": "2024-01-01T01:00:00", "End": "2024-01-01T03:00:00"},
            {**row, "Start": "2024-01-01T02:00:00", "End": "2024-01-01T04:00:00"},
            {**row, "Start": "2024-01-01T04:00:00", "End": "Unknown"}]
    assert max_gpus_per_node(intervals(rows, truth)) == 16


def test_steady_state_utilisation_is_about_85_percent(fleet):
    """Allocated GPU-seconds over capacity after a 10-day warm-up (the queues fill from empty)."""
    from datetime import datetime

    truth = fleet["truth"]
    t0 = datetime.fromisoformat(truth["start"]).timestamp() + 10 * 86400
    t1 = datetime.fromisoformat(truth["start"]).timestamp() + truth["days"] * 86400
    used = sum(max(0.0, min(e, t1) - max(s, t0)) * g
               for spans in intervals(fleet["rows"], truth).values() for s, e, g in spans)
    util = used / (truth["nodes"] * 8 * (t1 - t0))
    assert 0.78 < util < 0.92, util
