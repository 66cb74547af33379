"""Fail-slow detection at the end of a whole-job shift (rsc_health/historian/failslow/core.py,
`_lagging`): nodes sample at their own phase and recover at slightly different times, so the
few that sample before the end show the shift one slot longer than the rest. Such a node is
the job's, not a suspect; a node that really turns slow during the shift is still found, as
soon as the shift ends."""

from __future__ import annotations

from datetime import datetime, timedelta

import numpy as np
import pandas as pd

from rsc_health.config import load_config
from rsc_health.historian.failslow import core, detect_frame
from rsc_health.historian.failslow.core import Rules, find_runs, judged

T0 = datetime(2026, 11, 26, 10, 0, 0)  # on the 300 s slot grid
CFG = load_config(None)
RULES = Rules.from_config(CFG)
N = 32
NODES = [f"ib{i:03d}" for i in range(N)]
SLOTS = 16
BASE = 1.0e6  # a healthy port's xmit_wait per second
EPISODE = (4, 10)  # whole-job congestion from slot 4 until early in slot 10
FACTOR = 4.0


def _job() -> pd.DataFrame:
    return pd.DataFrame({"job_id": "88", "node": NODES, "start": T0,
                         "end": T0 + timedelta(seconds=300 * SLOTS)})


def _offset(i: int) -> int:
    """Node i samples this many seconds into every slot (its sweep's phase)."""
    return 5 + 290 * i // N


def _samples(seed: int, extra=None, episode: bool = True) -> pd.DataFrame:
    """ib_xmit_wait_rate on every node, one sample a slot: healthy log-normal spread, and a
    job-wide congestion episode that each node leaves at its own moment early in slot 10 (40
    to 60 s in: the 4 to 6 nodes that sample before then still see it). `extra(i, s, value)`
    may change a value; `episode=False`: no whole-job episode."""
    rng = np.random.default_rng(seed)
    recover = 300 * EPISODE[1] + rng.uniform(40, 60, N)  # each node's own end, seconds
    rows = []
    for i, node in enumerate(NODES):
        for s in range(SLOTS):
            at = 300 * s + _offset(i)
            value = BASE * float(np.exp(rng.normal(0, 0.25)))
            if episode and 300 * EPISODE[0] <= at < recover[i]:
                value *= FACTOR
            if extra is not None:
                value = extra(i, s, value)
            rows.append({"node": node, "time": T0 + timedelta(seconds=at),
                         "metric": "ib_xmit_wait_rate", "value": value,
                         "component": "mlx5_0:1"})
    return pd.DataFrame(rows)


def _lagging_nodes(frame: pd.DataFrame) -> int:
    obs = judged(frame, _job(), None, RULES)
    last = obs[obs["slot"] == obs["slot"].min() + EPISODE[1]]
    return int((last["value"] > 2 * BASE).sum())


def _spike_then_lag(i: int, s: int, value: float) -> float:
    # node 2 samples before the end (it lags); a healthy burst in the episode's last full
    # slot makes it an outlier there too: two outlying slots in a row on the same port
    return value * 4.0 if i == 2 and s == EPISODE[1] - 1 else value


def test_the_last_nodes_to_leave_a_job_wide_congestion_are_not_suspects():
    for seed in range(10):
        frame = _samples(seed, _spike_then_lag)
        assert 4 <= _lagging_nodes(frame) <= 6  # few: under max_outlier_share of 32
        assert detect_frame(frame, _job(), None, CFG) == [], seed


def test_the_lagging_slot_is_judged_like_a_job_wide_one_not_dropped():
    obs = judged(_samples(0, _spike_then_lag), _job(), None, RULES)
    lag = obs[(obs["node"] == "ib002") & (obs["slot"] == obs["slot"].min() + EPISODE[1])]
    assert lag["job_wide"].tolist() == [True]
    assert lag["outlier"].tolist() == [False]


def _slow_from(node: int, slot: int, factor: float):
    """Node `node`'s port at `factor` x a healthy port's rate from `slot` on (or the job's
    congestion, when that is worse)."""
    def extra(i: int, s: int, value: float) -> float:
        return max(value, factor * BASE) if i == node and s >= slot else value
    return extra


def test_a_port_that_congests_during_the_job_wide_episode_is_found_when_it_ends(monkeypatch):
    # node 20 samples late in the slot (after the end); its port at 6x from slot 8 on is hidden
    # by the episode (1.5x the congested median), then past its line from slot 10: a suspect
    # two sweeps later (three when the laggards outnumber the job-wide share: the job-wide
    # count's own cost), and never later than with the lagging rule switched off
    for seed in range(10):
        frame = _samples(seed, _slow_from(20, 8, 6.0))
        runs = find_runs(judged(frame, _job(), None, RULES), RULES)
        assert sorted(set(runs["node"])) == ["ib020"], seed
        confirmed = pd.Timestamp(runs["confirmed"].min())
        assert confirmed <= T0 + timedelta(seconds=300 * (EPISODE[1] + 2) + _offset(20)), seed
        with monkeypatch.context() as m:
            m.setattr(core, "_lagging", lambda obs, *a: np.zeros(len(obs), dtype=bool))
            without = find_runs(judged(frame, _job(), None, RULES), RULES)
        assert confirmed == pd.Timestamp(without["confirmed"].min()), seed


def test_a_port_far_worse_than_the_episode_ever_was_is_not_excused_as_lagging():
    # node 1 samples before the end, like the laggards, but at 20x: not the job's old level
    for seed in range(10):
        frame = _samples(seed, _slow_from(1, EPISODE[1], 20.0))
        runs = find_runs(judged(frame, _job(), None, RULES), RULES)
        assert sorted(set(runs["node"])) == ["ib001"], seed
        assert pd.Timestamp(runs["confirmed"].min()) == T0 + timedelta(
            seconds=300 * (EPISODE[1] + 1) + _offset(1)), seed


def test_an_early_sampler_alone_at_the_old_level_is_not_excused():
    # no other node sampled before node 0 in the slot: nothing says the shift was still on
    # when it sampled, so its outlier counts
    obs = judged(_samples(0, _slow_from(0, EPISODE[1], FACTOR)), _job(), None, RULES)
    first = obs[(obs["node"] == "ib000") & (obs["slot"] == obs["slot"].min() + EPISODE[1])]
    assert first["outlier"].tolist() == [True]


def _pcie(link_down_from: int | None, checkpoint: int, idled: int) -> pd.DataFrame:
    """16 nodes' pcie_link_ratio: node 5's link x8 (0.5) from slot `link_down_from`; a
    one-sweep checkpoint in slot `checkpoint` idles `idled` nodes' links to Gen1 (0.25)."""
    rows = []
    for i in range(16):
        for s in range(14):
            value = 1.0
            if link_down_from is not None and i == 5 and s >= link_down_from:
                value = 0.5
            elif s == checkpoint and i >= 16 - idled:
                value = 0.25
            rows.append({"node": f"p{i:02d}", "time": T0 + timedelta(seconds=300 * s + 20 + 15 * i),
                         "metric": "pcie_link_ratio", "value": value, "component": "gpu3"})
    return pd.DataFrame(rows)


def _pcie_job() -> pd.DataFrame:
    return pd.DataFrame({"job_id": "89", "node": [f"p{i:02d}" for i in range(16)],
                         "start": T0, "end": T0 + timedelta(seconds=300 * 14)})


def test_a_checkpoint_the_sweep_after_a_link_downtrains_does_not_hide_the_link():
    # the checkpoint's idled links (0.75 below the median) are a one-sweep event far bigger
    # than the x8 link (0.5 below): the slot before and after it are the node's own. Before,
    # they counted as the job's move too: three job-wide slots, the run restarted after them;
    # then the checkpoint's own slot stayed the job's, and the link was confirmed a sweep
    # late. The idled nodes' move began after the link was seen at x8 on its own: another
    # event, so the link is confirmed at its second sweep, the checkpoint's
    frame = _pcie(6, checkpoint=7, idled=6)
    runs = find_runs(judged(frame, _pcie_job(), None, RULES), RULES)
    assert sorted(set(runs["node"])) == ["p05"]
    assert pd.Timestamp(runs["confirmed"].min()) == T0 + timedelta(seconds=300 * 7 + 20 + 75)


def test_a_checkpoint_alone_makes_no_suspect():
    for idled in (2, 3, 6, 10, 16):
        frame = _pcie(None, checkpoint=7, idled=idled)
        assert detect_frame(frame, _pcie_job(), None, CFG) == [], idled


def test_a_leaf_switch_congesting_inside_a_slot_is_still_the_job_s_move():
    # 12 of 32 nodes (a leaf switch) congest 5x from 150 s into slot 6: in slot 6 only those
    # that sample later show it (too few alone); the slot after, all 12 move alike, so the
    # early ones are the job's move, as before
    leaf = set(range(0, 32, 8)) | set(range(3, 32, 8)) | set(range(5, 32, 8))

    def extra(i: int, s: int, value: float) -> float:
        at = 300 * s + _offset(i)
        return value * 5.0 if i in leaf and at >= 300 * 6 + 150 else value

    for seed in range(5):
        frame = _samples(seed, extra, episode=False)
        assert detect_frame(frame, _job(), None, CFG) == [], seed



def _nvlink_onset(dipper: int) -> pd.DataFrame:
    """8 nodes' nvlink_data_rate; node i samples 20 + 15 i s into every slot. Node 3 carries 40%
    of its peers' bytes from slot 6 on; node `dipper` dips to 55% for the one sweep of slot 5
    (a checkpoint idling one GPU for part of its interval)."""
    rows = []
    for i in range(8):
        for s in range(12):
            value = 80e9 * (1 + 0.01 * ((i * 7 + s * 3) % 5 - 2))
            if i == 3 and s >= 6:
                value *= 0.4
            elif i == dipper and s == 5:
                value *= 0.55
            rows.append({"node": f"n{i}", "time": T0 + timedelta(seconds=300 * s + 20 + 15 * i),
                         "metric": "nvlink_data_rate", "value": value,
                         "component": "gpu2" if i == 3 and s >= 6 else f"gpu{(i + s) % 8}"})
    return pd.DataFrame(rows)


def _nvlink_job() -> pd.DataFrame:
    return pd.DataFrame({"job_id": "90", "node": [f"n{i}" for i in range(8)], "start": T0,
                         "end": T0 + timedelta(seconds=300 * 12)})


def test_another_nodes_one_sweep_dip_a_whole_sweep_before_an_onset_does_not_hide_it():
    # node 0's dip (slot 5, 1520 s) was sampled 345 s before node 3's first slow sample (slot
    # 6, 1865 s), more than a sweep: another moment, and node 0 is back in line in slot 6.
    # Before, it counted as "moved with" node 3 (2 of 8 nodes: job-wide) and node 3 was
    # confirmed a sweep late (slot 8, not 7)
    runs = find_runs(judged(_nvlink_onset(dipper=0), _nvlink_job(), None, RULES), RULES)
    assert sorted(set(runs["node"])) == ["n3"]
    assert pd.Timestamp(runs["confirmed"].min()) == T0 + timedelta(seconds=300 * 7 + 65)


def test_a_dip_on_another_node_within_a_sweep_of_an_onset_is_still_the_same_move():
    # node 6's dip (slot 5, 1610 s) is 255 s before node 3's first slow sample: within one
    # sweep, so it may be the same event caught at another phase (a checkpoint's sweep spans
    # two slots): slot 6 stays the job's. The event is over in slot 7 (node 6 back in line)
    # and node 3 stayed where it went: its onset fell on the event, and slot 6 counts as its
    # run's first (_onset_on_an_event): confirmed at slot 7, not 8 as before that rule
    obs = judged(_nvlink_onset(dipper=6), _nvlink_job(), None, RULES)
    six = obs[(obs["node"] == "n3") & (obs["slot"] == obs["slot"].min() + 6)]
    assert six["job_wide"].all() and not six["outlier"].any()
    runs = find_runs(obs, RULES)
    assert sorted(set(runs["node"])) == ["n3"]
    assert pd.Timestamp(runs["confirmed"].min()) == T0 + timedelta(seconds=300 * 7 + 65)



def test_a_node_still_displaced_in_the_outliers_slot_moves_with_it_from_a_sweep_away():
    # node 0 moves a quarter less over NVLink from slot 5 on (inside the 30% line; level with
    # its peers before: a node lighter all along is judged at its own level, LEVELLED), after
    # a deeper dip in slot 5 (to 0.6) sampled more than a sweep before node 3's two dips
    # (slots 6 and 7); node 0 is still displaced in slot 6 by more than half that dip: a
    # state on at node 3's moment, as a leaf switch's congestion is, so slot 6 is the job's and
    # node 3's two dips are no run. With "past its own line" as the test of a state still on
    # (the first cut of the timing rule), node 0 did not count and node 3 was a suspect
    f = _nvlink_onset(dipper=0)
    slot = (f["time"] - T0).dt.total_seconds().floordiv(300).astype(int)
    n0, n3 = f["node"] == "n0", f["node"] == "n3"
    f.loc[n0, "value"] = 80e9 * np.where(slot[n0] == 5, 0.6, np.where(slot[n0] < 5, 1.0, 0.75))
    f.loc[n3 & (slot >= 8), "value"] = 80e9
    f.loc[n3 & (slot >= 8), "component"] = "gpu5"
    assert find_runs(judged(f, _nvlink_job(), None, RULES), RULES).empty
    # the same two dips with node 0 level with its peers but for its dip: node 3's run
    f.loc[n0 & (slot != 5), "value"] = 80e9
    runs = find_runs(judged(f, _nvlink_job(), None, RULES), RULES)
    assert sorted(set(runs["node"])) == ["n3"]


def _onset_on_a_checkpoint(others_stay: bool) -> pd.DataFrame:
    """Node 3 carries 40% of its peers' NVLink bytes from slot 6 on; in slot 6 a checkpoint
    idles nodes 0 and 1 to about 45% for that sweep, so slot 6 is the job's move (3 of 8
    nodes). With others_stay, those two stay there from slot 6 on (a state, not an event)."""
    f = _nvlink_onset(dipper=-1)
    slot = (f["time"] - T0).dt.total_seconds().floordiv(300).astype(int)
    moved = f["node"].isin(["n0", "n1"]) & ((slot >= 6) if others_stay else (slot == 6))
    f.loc[moved, "value"] *= 0.45
    return f


def test_an_onset_on_a_one_sweep_checkpoint_counts_its_first_slot():
    # Lab seeds 3000-3019: a third of the detections past 10 minutes had the node's first
    # faulty slot (or its second) called the job's: a checkpoint or a phase moved other nodes
    # at least half as far in the same slot. Before, slot 6 neither counted nor broke the run
    # and node 3 was confirmed at slot 8 (three of its sweeps); the checkpoint is over in slot
    # 7 (no other node past its line) and node 3 stayed where it went: confirmed at slot 7
    runs = find_runs(judged(_onset_on_a_checkpoint(False), _nvlink_job(), None, RULES), RULES)
    assert sorted(set(runs["node"])) == ["n3"]
    assert pd.Timestamp(runs["confirmed"].min()) == T0 + timedelta(seconds=300 * 7 + 65)
    assert pd.Timestamp(runs["since"].min()) == T0 + timedelta(seconds=300 * 6 + 65)


def test_an_onset_beside_a_move_that_stays_waits_for_its_own_slots():
    # the other two stay displaced in slot 7 (a leaf's congestion, a phase): slot 6 is still
    # the job's, and node 3 needs two outlying slots of its own
    runs = find_runs(judged(_onset_on_a_checkpoint(True), _nvlink_job(), None, RULES), RULES)
    assert "n3" not in set(runs["node"]) or pd.Timestamp(
        runs.loc[runs["node"] == "n3", "confirmed"].min()) > T0 + timedelta(seconds=300 * 7 + 65)
