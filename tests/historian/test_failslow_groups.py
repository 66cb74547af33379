"""Which peers a node's telemetry is judged against: its job's nodes of its GPU model and, when
the job's step files name them, its pipeline stage. The stage is the job's own untrusted word:
a job of small stages (8 stages of 2 nodes), or a file naming one node a stage of its own, left
nodes with too few peers and never judged. A node never qualified (model unknown) was a group
of its own, unjudged, though new nodes are the likeliest to be faulty."""

from __future__ import annotations

import pandas as pd
import pytest

from rsc_health.historian.failslow import detect_frame
from rsc_health.historian.failslow.core import _group_key
from tests.historian.test_failslow_detect import CFG, _job, _noisy, _samples

NODES16 = [f"n{i:02d}" for i in range(16)]
SLOW = 5


def _stuck_in_hw_slowdown() -> pd.DataFrame:
    base = _noisy(3, 0.0, 0.01)
    return _samples(NODES16, "throttle_hw_frac",
                    lambda i, s: max(0.0, base(i % 8, s)) + (0.8 if i == SLOW and s >= 4 else 0),
                    12)


def _found(members: pd.DataFrame) -> list[tuple[str, str]]:
    return [(e.node, e.metric) for e in detect_frame(_stuck_in_hw_slowdown(), members, None, CFG)]


@pytest.mark.parametrize("stages", [
    [str(i // 2) for i in range(16)],                     # pp 8 x dp 2: two nodes a stage
    ["x" if i == SLOW else "0" for i in range(16)],        # the slow node a stage of its own
    ["0"] * 8 + ["1"] * 7 + ["2"],                          # one stage of one node elsewhere
])
def test_a_job_with_a_stage_too_small_to_judge_is_judged_whole(stages):
    members = _job("77", NODES16, gpu_model="H100", stage=stages)
    assert _found(members) == [(NODES16[SLOW], "throttle_hw_frac")]


def test_stages_large_enough_are_still_their_own_peers():
    members = _job("77", NODES16, gpu_model="H100", stage=["0"] * 8 + ["1"] * 8)
    groups = _group_key(members, 4)
    assert set(groups) == {"H100|0", "H100|1"}
    assert _found(members) == [(NODES16[SLOW], "throttle_hw_frac")]


@pytest.mark.parametrize("unknown", [[SLOW], [SLOW, 9, 12]])
def test_a_node_never_qualified_is_judged_with_its_jobs_model(unknown):
    models = ["" if i in unknown else "H100" for i in range(16)]
    members = _job("77", NODES16, gpu_model=models)
    assert set(_group_key(members, 4)) == {"H100|"}
    assert _found(members) == [(NODES16[SLOW], "throttle_hw_frac")]


def test_two_models_in_one_job_stay_apart_and_a_job_of_unknowns_is_one_group():
    mixed = _job("1", NODES16, gpu_model=["H100"] * 8 + ["A100"] * 7 + [""])
    assert _group_key(mixed, 4).tolist() == ["H100|"] * 8 + ["A100|"] * 7 + ["H100|"]
    none = _job("2", NODES16, gpu_model=[""] * 16)
    assert set(_group_key(none, 4)) == {"|"}


@pytest.mark.parametrize("minutes", [0, 1, 1e10])
def test_a_lookback_that_cannot_confirm_or_overflows_is_a_config_error(tmp_path, minutes):
    """0 or 1 minute found nothing and said nothing; 1e10 failed every pass (OverflowError)."""
    from rsc_health import ConfigError
    from rsc_health.config import load_config

    site = tmp_path / "site.toml"
    site.write_text(f"[failslow]\nlookback_min = {minutes}\n")
    with pytest.raises(ConfigError, match="lookback_min"):
        load_config(site)


def test_a_node_two_jobs_share_at_once_is_judged_in_neither_while_shared():
    """Node S in job A and job B at once (OverSubscribe, GPUs split between the jobs): its
    telemetry is one node-level figure, its worst GPU's, whichever job's that GPU is. Job B's
    light workload on S's least busy GPU made S an NVLink suspect in job A, and S's job-A GPU
    in HW slowdown was blamed on job B too. Samples from while it is shared are judged in
    neither job; before job B came, S is judged in A as ever."""
    from datetime import timedelta

    from tests.historian.test_failslow_detect import T0, _noisy

    a = [f"a{i}" for i in range(1, 8)] + ["S"]
    b = [f"b{i}" for i in range(1, 8)] + ["S"]
    nodes = sorted(set(a + b))
    base = _noisy(5, 0.0, 0.01)
    slow = _samples(nodes, "throttle_hw_frac",
                    lambda i, s: max(0.0, base(i % 8, s)) + (0.8 if nodes[i] == "S" and s >= 6
                                                             else 0.0), 12)
    both = pd.concat([_job("A", a), _job("B", b)], ignore_index=True)
    assert detect_frame(slow, both, None, CFG) == []
    later = pd.concat([_job("A", a), _job("B", b, start=T0 + timedelta(hours=2))],
                      ignore_index=True)  # B on S only after the window: S is A's alone
    assert [(e.node, e.job_ids) for e in detect_frame(slow, later, None, CFG)] == [
        ("S", ("A",))]
