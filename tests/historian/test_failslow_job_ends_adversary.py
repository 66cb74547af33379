"""job_ends (migration 0020) against retention and requeues (helper-111): a runaway job's
epilogs outlive the telemetry prune, and a requeued job's new run is not ended by the old
run's epilog stamped by a clock ahead."""

from __future__ import annotations

from datetime import datetime, timedelta

import numpy as np
from sqlalchemy import insert

from rsc_health import spool
from rsc_health.config import load_config
from rsc_health.historian import schema
from rsc_health.historian.failslow import detect
from rsc_health.historian.failslow.load import membership
from rsc_health.historian.ingest.delivery import deliver
from rsc_health.historian.retention import Retention, prune
from tests.historian.job_rows import add_job

CFG = load_config(None)
NODES = [f"gpu{i:03d}" for i in range(1, 9)]
T0 = datetime(2026, 11, 20, 10, 0, 0)  # days before today: delivery believes the stamps


def _job(engine, job_id: str, start: datetime, end=None, nodes=NODES, state="RUNNING"):
    add_job(engine, job_id, start, nodes, end=end, state=state)


def _epilog(node: str, when: datetime, job_id: str) -> dict:
    return spool.record("job_end", node, when, source="epilog", job_id=job_id)


def _stuck_telemetry(start: datetime, slow: str = "gpu005", sweeps: int = 12) -> list[dict]:
    """Every node's sweeps of an hour; `slow` stuck in HW slowdown from sweep 6."""
    rng = np.random.default_rng(1)
    out = []
    for node in NODES:
        phase = int(rng.integers(5, 290))
        for s in range(sweeps):
            value = max(0.0, float(rng.normal(0, 0.01))) + (0.8 if node == slow and s >= 6
                                                            else 0.0)
            out.append(spool.record(
                "telemetry", node, start + timedelta(seconds=60 + 300 * s + phase),
                source="sweep", job_id=None, interval_s=300.0,
                metrics={"throttle_hw_frac": {"value": round(value, 6),
                                              "component": "gpu3"}}))
    return out


def test_a_job_slurmdbd_holds_running_stays_ended_on_its_nodes_after_telemetry_retention(
        historian, tmp_path):
    # 7001 ended at 10:24 on every node (each ran its epilog), but slurmdbd still says
    # RUNNING (a runaway job: slurmctld lost it; `sacctmgr show runawayjobs` lists it until
    # an operator fixes it), so `ingest sacct` keeps reading it RUNNING, no end
    _job(historian, "7001", T0)
    sdir = tmp_path / "spool"
    sdir.mkdir()
    spool.append(sdir, [_epilog(n, T0 + timedelta(minutes=24), "7001") for n in NODES])
    # four days later job 8001 runs on the same eight nodes; gpu005 gets stuck in HW slowdown
    later = T0 + timedelta(days=4)
    _job(historian, "8001", later)
    spool.append(sdir, _stuck_telemetry(later))
    assert deliver(historian, sdir).quarantined_count == 0
    now = later + timedelta(minutes=61)
    found = detect(historian, now, CFG)
    assert [(e.node, e.metric) for e in found] == [("gpu005", "throttle_hw_frac")]
    # the nightly prune at the same moment: telemetry_retention_days (3) takes 7001's
    # job_ends (four days old) with the samples of its time
    prune(historian, now, Retention.from_config(CFG))
    # 8001's slow node is still found: with 7001 running again on its nodes (no end, its
    # epilogs pruned), every node is shared by two judged jobs and judged in neither
    found = detect(historian, now, CFG)
    assert [(e.node, e.metric) for e in found] == [("gpu005", "throttle_hw_frac")]
    ends = {(r.job_id, r.node): r.end for r in membership(historian, later, now).itertuples()}
    assert ends.get(("7001", "gpu005")) == T0 + timedelta(minutes=24)


def test_a_requeued_jobs_new_run_is_not_ended_by_the_old_runs_epilog_from_a_clock_ahead(
        historian, tmp_path):
    # 9001 ran from 10:00 and was requeued at 10:20 (a node failure); Slurm started it again
    # at 10:22 on the same eight nodes. gpu005's clock runs 4 minutes ahead, which delivery
    # believes (CLOCK_AHEAD_S, 300 s): its epilog for the first run is stamped 10:24
    ahead = timedelta(minutes=4)
    first_end = T0 + timedelta(minutes=20)
    again = T0 + timedelta(minutes=22)
    _job(historian, "9001", T0, end=first_end, state="REQUEUED")
    with historian.begin() as conn:  # the second run: its own instance key
        pk = conn.execute(insert(schema.jobs).values(
            job_id="9001", job_id_display="9001", state="RUNNING", submit=first_end,
            start=again, end=None, nnodes=8, instance_key=f"9001:{first_end}:{again}")
            .returning(schema.jobs.c.id)).scalar_one()
        conn.execute(insert(schema.job_nodes), [{"job_pk": pk, "node": n} for n in NODES])
    sdir = tmp_path / "spool"
    sdir.mkdir()
    spool.append(sdir, [_epilog(n, first_end + (ahead if n == "gpu005" else timedelta(0)),
                                "9001") for n in NODES])
    tel = _stuck_telemetry(again)
    for rec in tel:  # gpu005's sweeps carry its clock too
        if rec["node"] == "gpu005":
            rec["time"] = (datetime.fromisoformat(rec["time"]) + ahead).isoformat()
    spool.append(sdir, tel)
    assert deliver(historian, sdir).quarantined_count == 0
    now = again + timedelta(minutes=66)
    # gpu005 stuck in HW slowdown in the second run is its suspect ...
    found = detect(historian, now, CFG)
    assert [(e.node, e.metric) for e in found] == [("gpu005", "throttle_hw_frac")]
    # ... because the second run is still running there: the first run's epilog, stamped
    # after the second run's start by a clock delivery believes, is not its end
    ends = {(r.job_id, r.start, r.node): r.end
            for r in membership(historian, again, now).itertuples()}
    assert str(ends[("9001", again, "gpu005")]) in ("NaT", "None")
