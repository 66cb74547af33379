"""Issue 23 item 2's report section and item 6's labels in the nightly report: event-based
reliability per month (failures, MTBF, repair time, reason mix, what the filters left out) and
the failed jobs by triage label, gathered from a real (SQLite) historian loaded through the
importers' own formats."""

from __future__ import annotations

import json
from datetime import datetime

from rsc_health.historian.db import connect
from rsc_health.historian.ingest import checks, events, sacct
from rsc_health.report.gather import GatherOptions, gather
from rsc_health.report.render import write_report

AS_OF = datetime(2024, 6, 30)
SACCT = ("JobIDRaw|JobID|JobName|User|Partition|State|ExitCode|Submit|Eligible|Start|End|"
         "NNodes|NodeList|AllocTRES\n")


def _sacct(jid, state, code, node, end):
    return (f"{jid}|{jid}|train|alice|gpu|{state}|{code}|2024-06-01T00:00:00|"
            f"2024-06-01T00:00:00|2024-06-01T00:00:05|{end}|1|{node}|"
            "billing=8,cpu=96,gres/gpu=8,mem=1000G,node=1\n")


def _load(engine):
    events.ingest_text(engine, "NodeName|TimeStart|TimeEnd|State|Reason\n"
                       "n1|2024-05-03T10:00:00|2024-05-03T14:00:00|DOWN|GPU fell off the bus\n"
                       "n1|2024-06-10T10:00:00|2024-06-11T10:00:00|DOWN|GPU fell off the bus\n"
                       "n2|2024-06-20T12:00:00|2024-06-20T13:00:00|DOWN|Not responding\n"
                       "n3|2024-06-21T08:00:00|2024-06-21T20:00:00|DOWN|scheduled maint\n")
    sacct.ingest_text(engine, SACCT
                      + _sacct(1, "NODE_FAIL", "0:0", "n1", "2024-06-10T10:00:30")
                      + _sacct(2, "FAILED", "1:0", "n2", "2024-06-22T10:00:00")
                      + _sacct(3, "OUT_OF_MEMORY", "0:125", "n2", "2024-06-23T10:00:00"))
    checks.ingest_lines(engine, [json.dumps({
        "time": "2024-06-22T09:59:00Z", "node": "n2", "check": "xid", "status": "fail",
        "code": "xid13", "component": "gpu1"})])


def test_the_report_shows_reliability_per_month_and_failed_jobs_by_label(tmp_path):
    engine = connect(f"sqlite:///{tmp_path / 'h.db'}", create_missing=True)
    try:
        _load(engine)
        data = gather(engine, AS_OF, GatherOptions(metrics_days=90))
    finally:
        engine.dispose()
    data.validate()
    rel = data.reliability.set_index("period")
    assert rel.loc["2024-05", "failures"] == 1
    # June: n1 and n2 DOWN; n3's maintenance left out; the XID 13 is the job's, not a failure
    assert rel.loc["2024-06", "failures"] == 2
    assert rel.loc["2024-06", "reasons"] == {"GPU fell off the bus": 1, "Not responding": 1}
    assert rel.loc["2024-06", "repair_p50_h"] == 12.5  # 24 h and 1 h
    left = data.reliability.attrs["left_out"]
    assert left["maintenance"] == {"(?i)maint": 1} and left["application_xids"] == 1
    labels = dict(zip(data.triage["label"], data.triage["jobs"], strict=True))
    assert labels == {"host": 1, "user": 2, "unknown": 0}
    assert data.triage.set_index("label").loc["host", "nodes"] == ["n1 (1)"]
    # the lemon features take the host labels from the triage section (one read)
    hosts = data.features.set_index("node")["host_failed_jobs"]
    assert hosts.get("n1") == 1 and hosts.get("n2", 0) == 0

    written = write_report(data, tmp_path / "out")
    summary = written.summary.read_text()
    assert "Node failures in 2024-06: 2 (2 episodes, 2 nodes), repair p50 12.5 h" in summary
    assert "by triage: host 1, user 2, unknown 0" in summary
    html = written.html.read_text()
    assert "Node reliability per month" in html
    assert "left out: 1 maintenance outages (&#39;(?i)maint&#39;: 1); 1 application-class" in html
    doc = json.loads(written.json.read_text())
    assert doc["reliability_left_out"]["maintenance"] == {"(?i)maint": 1}
    assert [r["label"] for r in doc["triage"]] == ["host", "user", "unknown"]
    fig = {f.section: f for f in written.figures}["reliability"]
    assert fig.has_data and (tmp_path / "out" / fig.file).stat().st_size > 0
