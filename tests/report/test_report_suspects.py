"""The nightly report's suspect section: open suspects with their evidence (metric, value
against the peers' median, deviation, jobs) and those ended in the last day with who ended
them and why; summary.txt and report.json carry them too."""

from __future__ import annotations

import json
from datetime import timedelta

from rsc_health.historian import suspects as hs
from rsc_health.historian.failslow.evidence import SuspectEvidence
from rsc_health.report.gather import gather
from rsc_health.report.render import write_report

from .test_morning import AS_OF, FIGURES, _opts, _section, engine  # noqa: F401 - a fixture


def _ev(node, at, dev, jobs):
    return SuspectEvidence(node=node, metric="ib_xmit_wait_rate", value=9.1e6,
                           peer_median=2.0e5, deviation=dev, since=at - timedelta(minutes=15),
                           last=at, job_ids=jobs, source="telemetry", detail="mlx5_2/1")


def test_suspects_open_and_ended_with_their_evidence(engine, tmp_path):  # noqa: F811
    exp = timedelta(hours=24)
    hs.record(engine, [_ev("gpu021", AS_OF - timedelta(hours=3), 6.5, ("501", "502")),
                       _ev("gpu022", AS_OF - timedelta(hours=2), 11.0, ("503",)),
                       _ev("gpu023", AS_OF - timedelta(hours=5), 4.0, ("504",))],
              AS_OF - timedelta(hours=2), expire_after=exp)
    hs.clear(engine, "gpu023", AS_OF - timedelta(hours=1), who="alice",
             why="job imbalance, not the node")
    # Opened after as_of: not in a report of as_of.
    hs.record(engine, [_ev("gpu024", AS_OF + timedelta(hours=1), 20.0, ("505",))],
              AS_OF + timedelta(hours=1), expire_after=exp)
    data = gather(engine, AS_OF, _opts(skip=FIGURES))
    assert list(data.suspects["node"]) == ["gpu022", "gpu021", "gpu023"]
    report = write_report(data, tmp_path / "out")
    section = _section(report.html.read_text(), "suspects")
    assert "(2 open)" in section and "gpu024" not in section
    assert "ib_xmit_wait_rate (telemetry)" in section and "501, 502" in section
    assert "alice: job imbalance, not the node" in section
    summary = report.summary.read_text()
    assert ("Suspect nodes (kept from big jobs): 2 open, 1 ended in the last day (1 cleared)"
            in summary)
    assert "  gpu022: ib_xmit_wait_rate deviation 11 (telemetry) in jobs 503" in summary
    doc = json.loads(report.json.read_text())
    assert [r["node"] for r in doc["suspects"]] == ["gpu022", "gpu021", "gpu023"]


def test_the_summary_says_how_the_days_episodes_ended(engine, tmp_path):  # noqa: F811
    # one cleared by a person, one expired (no evidence for expire_after_h), one open
    exp = timedelta(hours=24)
    hs.record(engine, [_ev("gpu031", AS_OF - timedelta(hours=30), 5.0, ("601",))],
              AS_OF - timedelta(hours=30), expire_after=exp)
    assert hs.expire(engine, AS_OF - timedelta(hours=5)) == ["gpu031"]
    hs.record(engine, [_ev("gpu032", AS_OF - timedelta(hours=3), 6.0, ("602",)),
                       _ev("gpu033", AS_OF - timedelta(hours=2), 7.0, ("603",))],
              AS_OF - timedelta(hours=2), expire_after=exp)
    hs.clear(engine, "gpu032", AS_OF - timedelta(hours=1), who="bob", why="reseated")
    report = write_report(gather(engine, AS_OF, _opts(skip=FIGURES)), tmp_path / "out")
    assert ("Suspect nodes (kept from big jobs): 1 open, 2 ended in the last day "
            "(1 cleared, 1 expired)") in report.summary.read_text()
