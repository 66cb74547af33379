"""A node's onset that falls beside other nodes' short moves (rsc_health/historian/failslow/
core.py, `find_runs`): its first slot and the next may both be the job's (another node's
one-sweep dip sampled within a sweep of both), and a second job-wide slot in a row used to end
the run there. When the node's own displacement began in the slot before, that second slot is
judged like a first one (`_onset_on_an_event`): it counts when, in the next slot, the node
stayed where it went and every node that moved with it is back. A node displaced with its job
for longer (a leaf switch's congestion it shared) still ends its run there."""

from __future__ import annotations

from datetime import datetime, timedelta

import pandas as pd

from rsc_health.config import load_config
from rsc_health.historian.failslow import detect_frame
from rsc_health.historian.failslow.core import Rules, find_runs, judged

T0 = datetime(2026, 11, 26, 10, 0, 0)  # on the 300 s slot grid
CFG = load_config(None)
RULES = Rules.from_config(CFG)


def _job(job: str, nodes: list[str], slots: int) -> pd.DataFrame:
    return pd.DataFrame({"job_id": job, "node": nodes, "start": T0,
                         "end": T0 + timedelta(seconds=300 * slots)})


def _onset_beside_a_dip(dip: float) -> pd.DataFrame:
    """8 nodes' nvlink_data_rate, 12 slots. Node 3 (sampling 65 s into each slot) carries a
    tenth of its peers' bytes from slot 6 on (links down); node 6 samples late (250 s in) and
    dips to `dip` of its bytes for the one sweep of slot 6, so its dip is within a sweep of
    node 3's samples in slots 6 and 7."""
    rows = []
    for i in range(8):
        phase = 250 if i == 6 else 20 + 15 * i
        for s in range(12):
            value = 80e9 * (1 + 0.01 * ((i * 7 + s * 3) % 5 - 2))
            if i == 3 and s >= 6:
                value *= 0.1
            elif i == 6 and s == 6:
                value *= dip
            rows.append({"node": f"n{i}", "time": T0 + timedelta(seconds=300 * s + phase),
                         "metric": "nvlink_data_rate", "value": value,
                         "component": "gpu2" if i == 3 and s >= 6 else f"gpu{(i + s) % 8}"})
    return pd.DataFrame(rows)


def test_an_onset_beside_another_nodes_one_sweep_dip_is_found_a_sweep_sooner():
    # Lab seed 1 job 5099: node 3's first two slots are the job's (slot 6: node 6 dipped with
    # it; slot 7: node 6's dip, sampled 115 s before, is within a sweep). Before, slot 7 ended
    # the run and node 3 was confirmed at slot 9 (its fourth slow sweep); node 6 is back in
    # slot 8 and node 3 stayed: slot 7 counts, confirmed at slot 8
    frame = _onset_beside_a_dip(0.5)
    obs = judged(frame, _job("91", [f"n{i}" for i in range(8)], 12), None, RULES)
    n3 = obs[obs["node"] == "n3"].set_index("slot")["job_wide"]
    first = obs["slot"].min()
    assert n3.loc[first + 6] and n3.loc[first + 7]  # both the job's, as judged per slot
    runs = find_runs(obs, RULES)
    assert sorted(set(runs["node"])) == ["n3"]
    assert pd.Timestamp(runs["confirmed"].min()) == T0 + timedelta(seconds=300 * 8 + 65)
    assert pd.Timestamp(runs["since"].min()) == T0 + timedelta(seconds=300 * 7 + 65)


def test_an_onset_whose_dip_partner_stays_down_waits_for_slots_of_its_own():
    # node 6 stays down with node 3 from slot 6 on: two nodes moved together and stayed (a
    # state, not an event): neither is confirmed beside the other by this rule
    frame = _onset_beside_a_dip(0.5)
    late = (frame["node"] == "n6") & (frame["time"] >= T0 + timedelta(seconds=300 * 6))
    frame.loc[late, "value"] = 80e9 * 0.1
    runs = find_runs(judged(frame, _job("91", [f"n{i}" for i in range(8)], 12), None, RULES),
                     RULES)
    assert runs.empty


# Lab seed 2 job 5041 (a plain 8-node job, a leaf switch congesting three nodes' ports for six
# sweeps), ib_xmit_wait_rate in MB/s per slot as the simulator wrote it, and each node's phase
# (seconds into every slot). fs00689 samples 7 s into each slot, so it sees the congestion one
# slot later than the other two and is the only one still in it in slot 13.
LEAF_PHASE = {"fs00688": 227, "fs00689": 7, "fs00690": 151, "fs00691": 197, "fs00692": 287,
              "fs00693": 270, "fs00694": 224, "fs00695": 288}
LEAF = {
    "fs00688": [1.53, 1.19, 1.45, 1.26, 1.20, 1.66, 1.40, 7.91, 17.21, 5.73, 10.00, 13.44, 10.43,
                2.26, 1.48, 1.15],
    "fs00689": [None, 1.54, 1.68, 1.57, 1.60, 1.66, 1.41, 0.98, 7.94, 10.50, 8.34, 7.59, 7.23,
                7.24, 1.45, 1.59],
    "fs00690": [1.67, 1.57, 1.32, 1.89, 1.49, 1.21, 1.30, 0.99, 1.24, 1.01, 1.14, 1.29, 0.98,
                0.78, 1.40, 1.39],
    "fs00691": [1.78, 1.54, 2.61, 1.65, 2.35, 1.46, 1.75, 9.54, 16.05, 10.26, 6.45, 12.40, 11.62,
                1.86, 1.74, 1.20],
    "fs00692": [1.40, 0.78, 1.24, 1.31, 1.64, 1.59, 1.19, 1.16, 0.99, 1.21, 0.97, 1.11, 1.19,
                1.48, 1.33, 1.52],
    "fs00693": [1.44, 0.95, 1.47, 0.78, 1.42, 0.85, 0.90, 1.05, 1.24, 1.33, 0.77, 1.10, 0.60,
                1.17, 1.15, 1.14],
    "fs00694": [1.04, 1.33, 1.04, 1.15, 1.29, 1.08, 1.31, 1.20, 0.97, 1.91, 2.22, 0.92, 1.38,
                1.19, 1.36, 1.29],
    "fs00695": [1.14, 0.96, 1.03, 1.42, 1.13, 1.16, 1.17, 1.08, 1.05, 1.24, 2.36, 1.36, 1.39,
                1.52, 1.03, 1.13],
}


def _leaf() -> pd.DataFrame:
    return pd.DataFrame([
        {"node": node, "time": T0 + timedelta(seconds=300 * s + LEAF_PHASE[node]),
         "metric": "ib_xmit_wait_rate", "value": v * 1e6, "component": "mlx5_2:1"}
        for node, values in LEAF.items() for s, v in enumerate(values) if v is not None])


def test_the_last_node_to_leave_a_leaf_congestion_it_shared_is_not_a_suspect():
    # fs00689's slots 11 and 12 are the leaf's (the other two congested beside it), slot 13 it
    # is alone (the others left before sampling), slot 14 it is back. Judging slot 12 like an
    # onset (the others are back in slot 13, fs00689 stayed) made it a suspect: it had been
    # displaced with the leaf since slot 8, so slot 12 still ends its run
    frame = _leaf()
    assert detect_frame(frame, _job("92", list(LEAF), 16), None, CFG) == []
