"""core.delivered (a slot judged once its job's samples are in) on every path that judges
(helper-111): `healthctl suspects job` reads the job's span, so a member silent for hours held
back slots the pass judged, and a slot waiting for a flush was explained as a peer group
under min_nodes."""

from __future__ import annotations

from datetime import datetime, timedelta

import numpy as np
import pandas as pd

from rsc_health import spool
from rsc_health.config import load_config
from rsc_health.historian.failslow import detect
from rsc_health.historian.failslow.core import Rules
from rsc_health.historian.failslow.explain import explain_frame, explain_job
from rsc_health.historian.ingest.delivery import deliver
from tests.historian.job_rows import add_job

CFG = load_config(None)
NODES = [f"gpu{i:03d}" for i in range(1, 9)]
T0 = datetime(2026, 11, 20, 10, 0, 0)


def _running(engine, job_id: str, start: datetime, nodes=NODES) -> None:
    add_job(engine, job_id, start, nodes)


def test_suspects_job_finds_the_slow_node_the_detector_flags_beside_a_silent_member(
        historian, tmp_path):
    # job 4242 has run 3 hours on eight nodes; gpu008's telemetry stopped after its first
    # hour (its sweeps go on, NVML's telemetry answers do not: it is still in the job);
    # gpu005 is stuck in HW slowdown from 12:25. Every node flushed everything it has.
    _running(historian, "4242", T0)
    rng = np.random.default_rng(5)
    records = []
    for node in NODES:
        phase = int(rng.integers(5, 290))
        for s in range(36):
            t = T0 + timedelta(seconds=60 + 300 * s + phase)
            if node == "gpu008" and s >= 12:
                continue
            value = max(0.0, float(rng.normal(0, 0.01))) + (0.8 if node == "gpu005" and s >= 29
                                                            else 0.0)
            records.append(spool.record(
                "telemetry", node, t, source="sweep", job_id=None, interval_s=300.0,
                metrics={"throttle_hw_frac": {"value": round(value, 6), "component": "gpu3"}}))
    sdir = tmp_path / "spool"
    sdir.mkdir()
    spool.append(sdir, records)
    assert deliver(historian, sdir).quarantined_count == 0
    now = T0 + timedelta(hours=3, minutes=2)
    # the pass flags gpu005 (gpu008 has no sample in its hour: it holds nothing back) ...
    assert [(e.node, e.metric) for e in detect(historian, now, CFG)] == [
        ("gpu005", "throttle_hw_frac")]
    # ... and the operator's `healthctl suspects job 4242` at the same moment says why
    out = explain_job(historian, "4242", now, CFG)
    row = next(r for r in out.rows if (r.node, r.metric) == ("gpu005", "throttle_hw_frac"))
    assert row.suspect, row.why


def test_suspects_job_says_a_slot_waits_for_its_nodes_flush_not_a_peer_group_too_small():
    # job 77, eight nodes, started 25 minutes ago; gpu008 last flushed just before it began
    # (its sample of 10:00 is in; its sweeps since are on its disk until its flush minute)
    start = datetime(2026, 11, 26, 10, 0, 0)
    rng = np.random.default_rng(2)
    rows = [{"node": "gpu008", "time": start - timedelta(minutes=3),
             "metric": "throttle_hw_frac", "value": 0.0, "component": "gpu3"}]
    for node in NODES[:7]:
        phase = int(rng.integers(5, 290))
        for s in range(5):
            rows.append({"node": node, "time": start + timedelta(seconds=60 + 300 * s + phase),
                         "metric": "throttle_hw_frac",
                         "value": max(0.0, float(rng.normal(0, 0.01))), "component": "gpu3"})
    samples = pd.DataFrame(rows)
    members = pd.DataFrame({"job_id": "77", "node": NODES, "start": start, "end": pd.NaT})
    now = start + timedelta(minutes=26)
    out = explain_frame("77", samples, members, None, Rules.from_config(CFG), now)
    why = {r.node: r.why for r in out.rows}
    # seven nodes with a value is no peer group under min_nodes (4): the slots wait for
    # gpu008's flush, and the operator must be told that, not to lower min_nodes
    assert all("under [failslow] min_nodes" not in w for w in why.values()), why
