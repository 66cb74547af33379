"""Issue 23 item 2's fleet metrics: event-based failures, episodes, system MTBF and repair time
per peer group, what the maintenance filter left out, and failed jobs by triage label, read back
by prometheus_client's own text parser."""

from __future__ import annotations

from datetime import datetime, timedelta

from rsc_health.historian import db
from rsc_health.historian.ingest import events, sacct

from .test_exporter_trust import export, samples

SACCT = ("JobIDRaw|JobID|JobName|User|Partition|State|ExitCode|Submit|Eligible|Start|End|"
         "NNodes|NodeList|AllocTRES\n")


def _t(when: datetime) -> str:
    return f"{when:%Y-%m-%dT%H:%M:%S}"


def test_reliability_and_triage_are_exported(tmp_path):
    url = f"sqlite:///{tmp_path / 'historian.db'}"
    now = datetime.utcnow().replace(microsecond=0)
    d2, d5, d6 = (now - timedelta(days=k) for k in (2, 5, 6))
    engine = db.connect(url, upgrade=True, create_missing=True)
    try:
        events.ingest_text(engine, "NodeName|TimeStart|TimeEnd|State|Reason|Cluster\n"
                           f"n1|{_t(d5)}|{_t(d5 + timedelta(hours=2))}|DOWN|GPU lost|c1\n"
                           f"n2|{_t(d2)}|{_t(d2 + timedelta(hours=4))}|DOWN|ECC|c1\n"
                           f"n3|{_t(d6)}|{_t(d6 + timedelta(hours=9))}|DOWN|maintenance|c1\n")
        sacct.ingest_text(engine, SACCT + "".join(
            f"{j}|{j}|x|alice|gpu|{state}|{code}|{_t(end - timedelta(hours=3))}|"
            f"{_t(end - timedelta(hours=3))}|{_t(end - timedelta(hours=2))}|{_t(end)}|1|{n}|"
            "billing=8,cpu=96,gres/gpu=8,mem=1000G,node=1\n"
            for j, state, code, n, end in ((1, "NODE_FAIL", "0:0", "n1", d5),
                                           (2, "OUT_OF_MEMORY", "0:125", "n2",
                                            d2 + timedelta(days=1)),
                                           (3, "FAILED", "0:9", "n2", d2 - timedelta(days=1)))))
    finally:
        engine.dispose()
    out = tmp_path / "fleet.prom"
    proc = export(url, out)
    assert proc.returncode == 0, proc.stderr
    got = samples(out.read_text())
    assert [(s.labels, s.value) for s in got["rsc_health_node_failures"]] == [
        ({"group": "c1"}, 2.0)]
    assert [s.value for s in got["rsc_health_system_mtbf_hours"]] == [72.0]
    repair = {s.labels["quantile"]: s.value for s in got["rsc_health_repair_hours"]}
    assert repair["0.5"] == 3.0
    assert [(s.labels, s.value) for s in got["rsc_health_node_outages_left_out"]] == [
        ({"kind": "maintenance", "cause": "(?i)maint"}, 1.0)]
    labels = {s.labels["label"]: s.value for s in got["rsc_health_failed_jobs"]}
    assert labels == {"host": 1.0, "user": 1.0, "unknown": 1.0}
