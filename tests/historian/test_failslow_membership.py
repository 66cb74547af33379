"""Which job a node's samples are judged in (failslow/load.py membership): a job the historian
last saw running (the hourly `ingest sacct` read it RUNNING, its end not yet known) ends on
each node at the epilog that node ran for it (the spool's job_end, kept in job_ends), so what
the node did after it (another job, idle) is not judged against the job's other nodes."""

from __future__ import annotations

from datetime import datetime, timedelta

import numpy as np
import pandas as pd
from sqlalchemy import select

from rsc_health import spool
from rsc_health.config import load_config
from rsc_health.historian import schema
from rsc_health.historian.failslow import detect
from rsc_health.historian.failslow.load import membership
from rsc_health.historian.ingest.delivery import deliver
from tests.historian.job_rows import add_job

CFG = load_config(None)
T0 = datetime(2026, 11, 26, 10, 0, 0)
NODES = [f"gpu{i:03d}" for i in range(1, 9)]
ENDED = T0 + timedelta(minutes=24)  # job 7001 ended here; sacct last read it at 10:07


def _running(engine, job_id: str = "7001", start: datetime = T0, nodes=NODES) -> None:
    """What an `ingest sacct` that read the job RUNNING leaves: no end."""
    add_job(engine, job_id, start, nodes)


def _epilog(node: str, when: datetime, job_id: str = "7001") -> list[dict]:
    """The epilog's records: its checks carry the job id, and job_end."""
    return [spool.record("check", node, when, source="epilog", job_id=job_id, check="gpu",
                         component="*", status="ok", severity="none", code="",
                         reason="all clear"),
            spool.record("job_end", node, when, source="epilog", job_id=job_id)]


def test_samples_after_a_nodes_epilog_for_a_job_are_not_judged_in_that_job(historian, tmp_path):
    _running(historian)
    rng = np.random.default_rng(3)
    sdir = tmp_path / "spool"
    sdir.mkdir()
    for i, node in enumerate(NODES):
        phase = 20 + 30 * i
        records = _epilog(node, ENDED + timedelta(seconds=i))
        for s in range(12):
            t = T0 + timedelta(seconds=300 * s + phase)
            clock = 0.97 + rng.normal(0, 0.004)
            if node == "gpu001" and t > ENDED:
                # after 7001: a one-node job at its power cap (the real H200 under gpu-burn
                # held its SM clock at 1,395 of 1,980 MHz, healthy)
                clock = 0.70
            records.append(spool.record("telemetry", node, t, source="sweep", job_id=None,
                                        interval_s=300.0, metrics={
                                            "sm_clock_ratio": {"value": clock,
                                                               "component": "gpu3"}}))
        spool.append(sdir, records)
    report = deliver(historian, sdir)
    assert report.quarantined_count == 0
    assert report.delivered == {"check": 8, "job_end": 8, "telemetry": 96}
    found = detect(historian, T0 + timedelta(hours=1), CFG)
    # gpu001's clock after 7001 ended is another job's, not an onset in 7001
    assert [(e.node, e.metric, e.job_ids) for e in found] == []


def test_a_running_job_ends_on_each_node_at_its_own_epilog_and_runs_on_where_none_came(
        historian, tmp_path):
    _running(historian)
    _running(historian, "7002", T0 - timedelta(days=2), ["gpu007", "gpu008"])
    sdir = tmp_path / "spool"
    sdir.mkdir()
    # gpu001's epilog for an older job of the same id (Slurm reuses ids) counts for nothing;
    # gpu002's came twice (a batch delivered again); gpu003 has not flushed its epilog yet
    spool.append(sdir, [*_epilog("gpu001", T0 - timedelta(days=1)),
                        *_epilog("gpu001", ENDED), *_epilog("gpu002", ENDED),
                        *_epilog("gpu002", ENDED + timedelta(minutes=1))[1:],
                        *_epilog("gpu007", ENDED, "7002")])
    deliver(historian, sdir)
    deliver(historian, sdir)
    with historian.connect() as conn:
        assert conn.execute(select(schema.job_ends.c.node)
                            .where(schema.job_ends.c.node == "gpu001")).all() == [
            ("gpu001",), ("gpu001",)]
    m = membership(historian, T0, T0 + timedelta(hours=1))
    ends = {(r.job_id, r.node): r.end for r in m.itertuples()}
    assert ends[("7001", "gpu001")] == ENDED and ends[("7001", "gpu002")] == ENDED
    assert ends[("7002", "gpu007")] == ENDED
    # no epilog yet: still running there
    assert all(pd.isna(ends[("7001", n)]) for n in NODES[2:])
    assert pd.isna(ends[("7002", "gpu008")])
