"""The fleet metrics say how many nodes are suspect and flag each, hostile names included,
read back by prometheus_client's own text parser."""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import create_engine

from rsc_health.historian import db
from rsc_health.historian import suspects as hs
from rsc_health.historian.failslow.evidence import SuspectEvidence

from .test_exporter_trust import HOSTILE, export, samples


def test_suspect_nodes_and_their_flags_are_exported(tmp_path):
    url = f"sqlite:///{tmp_path / 'historian.db'}"
    eng = create_engine(url)
    db.create(eng)
    now = datetime.utcnow()
    hs.record(eng, [SuspectEvidence(node=n, metric="sm_clock_ratio", value=0.6,
                                    peer_median=0.99, deviation=9.0, since=now, last=now,
                                    job_ids=("1",), source="telemetry", detail="")
                    for n in [*HOSTILE, "gpu001", "gpu002"]], now,
              expire_after=timedelta(hours=24))
    hs.clear(eng, "gpu002", now + timedelta(seconds=1), who="alice", why="ok")
    eng.dispose()
    out = tmp_path / "fleet.prom"
    proc = export(url, out)
    assert proc.returncode == 0, proc.stderr
    got = samples(out.read_text())
    [total] = got["rsc_health_suspect_nodes"]
    assert total.value == len(HOSTILE) + 1
    flagged = sorted(s.labels["node"] for s in got["rsc_health_node_suspect"])
    assert flagged == sorted([*HOSTILE, "gpu001"])
    assert {s.labels["metric"] for s in got["rsc_health_node_suspect"]} == {"sm_clock_ratio"}
