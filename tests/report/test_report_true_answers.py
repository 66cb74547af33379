"""The nightly report tells the truth (issue 26, true answers 3), on a historian filled as
the operator fills it (node spools flushed, sacct and sacctmgr ingested) and written by
`healthctl report`:
- every sweep's "would drain" for one node and reason is one row (first, last, count);
- a candidate listed for days is never also "new" (no previous report.json to diff against);
- a young fleet (no job over 128 GPUs has ended) shows its open findings, node events and
  XIDs instead of "-" only;
- each node links to its `healthctl node NODE` story and to [report] node_url/dashboard_url.
"""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta

import pytest

from rsc_health.model import ActionKind, Finding, Severity, Status
from tests.historian.conftest import historian_url, pg_url  # noqa: F401 - fixtures
from tests.historian.operator_history import (
    action_record,
    flush,
    healthctl,
    ingest_events,
    ingest_sacct,
    iso,
    run_records,
    sacct_row,
    xid_findings,
    xid_line,
)

# Everything here but the figures: they are drawn and checked in test_plots/test_render.
pytestmark = pytest.mark.usefixtures("figures_not_drawn")

AS_OF = datetime(2026, 11, 20, 12, 0, 0)
GPUS = {"00000000:1A:00.0": 1, "00000000:5D:00.0": 3}
SHADOW = ("gpu031", "gpu032", "gpu033", "gpu034")


def _history(url: str, tmp_path) -> None:
    spool_dir = tmp_path / "spool"
    # Shadow mode for the last hour on 4 nodes: XID 79 once, then the pending verdict's
    # would_drain at every 5-minute sweep (13 records per node, 52 in all).
    x79 = xid_findings([xid_line("0000:5d:00", 79, "GPU has fallen off the bus.")], GPUS)
    for node in SHADOW:
        first = AS_OF - timedelta(minutes=61)
        recs = run_records(node, first, "sweep", x79, shadow=True)
        reason = next(r["reason"] for r in recs if r["kind"] == "action")
        recs += [action_record(node, first + timedelta(minutes=5 * k), ActionKind.WOULD_DRAIN,
                               reason) for k in range(1, 13)]
        flush(url, spool_dir, recs)
    # gpu020, a lemon for 10 days: an XID 92 (high single-bit ECC rate) a day from 20 days
    # ago on, one XID episode each (in shadow mode: a would_drain each, long before the day).
    for day in range(20, 10, -1):
        flush(url, spool_dir, run_records("gpu020", AS_OF - timedelta(days=day), "sweep",
                                          xid_findings([xid_line(
                                              "0000:1a:00", 92, "High single-bit ECC error rate",
                                              pid=1000 + day)], GPUS), shadow=True))
    # gpu035's IB port went down 40 minutes ago and stays down (a state, open until it clears).
    port_down = [Finding("infiniband", "mlx5_0/1", Status.FAIL, Severity.DRAIN_NOW,
                         "mlx5_0/1 port state DOWN (expected ACTIVE)", "ib_down")]
    for minutes in (40, 35, 30, 25, 20, 15, 10, 5):
        flush(url, spool_dir, run_records("gpu035", AS_OF - timedelta(minutes=minutes),
                                          "sweep", port_down, shadow=True))
    # A young fleet: only single-node jobs, none over 128 GPUs.
    ingest_sacct(url, tmp_path, [
        sacct_row(str(7000 + i), "COMPLETED", AS_OF - timedelta(hours=5 + i),
                  AS_OF - timedelta(hours=1 + i), f"gpu0{40 + i}", 1, 8) for i in range(5)])
    ingest_events(url, tmp_path, [
        f"rsc|gpu041|{iso(AS_OF - timedelta(days=3))}|{iso(AS_OF - timedelta(days=2))}|DOWN|"
        "Not responding|slurm(64030)",
        f"rsc|gpu041|{iso(AS_OF - timedelta(hours=5))}|Unknown|DOWN|Not responding|"
        "slurm(64030)",
    ])


def test_the_report_folds_agrees_with_itself_shows_a_young_fleet_and_links_nodes(
        historian_url, tmp_path):  # noqa: F811
    _history(historian_url, tmp_path)
    config = tmp_path / "site.toml"
    config.write_text('[report]\nnode_url = "https://grafana.example/d/node?var-node={node}"\n'
                      'dashboard_url = "https://grafana.example/d/fleet"\n')
    out = tmp_path / "report"
    summary = healthctl(historian_url, "report", "--out", str(out), "--as-of", iso(AS_OF),
                        "-q", config=config)
    doc = json.loads((out / "report.json").read_text())
    html = (out / "report.html").read_text()

    # 1. Folded: one row per node for its 13 would_drain records. The four XID 79s of one
    # sweep in a fleet of this size are past the live guard's limit: the report shows the
    # first as would_drain and the rest as what the live guard would have held.
    kinds = ("would_drain", "would_be_held")
    shadow = {a["node"]: a for a in doc["actions"] if a["action"] in kinds}
    assert sorted(shadow) == [*SHADOW, "gpu035"]  # one row each
    assert [shadow[n]["count"] for n in sorted(shadow)] == [13, 13, 13, 13, 8]
    assert [shadow[n]["action"] for n in sorted(shadow)] == [
        "would_drain", "would_be_held", "would_be_held", "would_be_held", "would_drain"]
    assert all(a["last_seen"] > a["time"] for a in shadow.values())
    assert "3 would_be_held (39 records), 2 would_drain (21 records)" in summary
    section = re.search(r'<section id="actions">(.*?)</section>', html, re.S).group(1)
    assert section.count("would_drain</td>") + section.count("would_be_held</td>") == 5

    # 2. Never "new" and "listed 7+ d" at once: no previous report, listed for a week.
    lemon = {r["node"]: r for r in doc["lemons"]}["gpu020"]
    assert lemon["days_listed"] == 7 and lemon["listed_capped"]
    assert "gpu020" not in doc["changes"]["new"] and "gpu020" in doc["changes"]["still"]
    line = next(ln for ln in summary.splitlines() if ln.startswith("  gpu020"))
    assert "NEW" not in line and "listed 7+ d" in line
    row = re.search(r"<tr>\s*<td><span class=\"node\"[^>]*><code>gpu020</code>.*?</tr>", html,
                    re.S).group(0)
    assert "tag-new" not in row and "7+ d" in row

    # 3. A young fleet: no r_f, and what there is instead.
    assert doc["headline"]["r_f"] is None and "no job over 128 GPUs" in doc["notes"]["rates"]
    assert "Meanwhile: " in summary and "open finding(s)" in summary
    assert [(r["node"], r["code"], r["since"]) for r in doc["open_findings"]] == [
        ("gpu035", "ib_down", iso(AS_OF - timedelta(minutes=40)).replace("T", " "))]
    assert "XIDs on 5 GPU(s)" in summary  # gpu3 of each shadow node, gpu1 of gpu020
    events = {r["node"]: r for r in doc["node_events"]}
    assert events["gpu041"]["events"] == 2 and events["gpu041"]["down"] == 2
    assert 'id="meanwhile"' in html

    # 4. Links: every node named has its story and its pages.
    assert doc["links"]["gpu031"] == {
        "story": "healthctl node gpu031",
        "node_url": "https://grafana.example/d/node?var-node=gpu031",
        "dashboard_url": "https://grafana.example/d/fleet"}
    assert 'title="healthctl node gpu020"' in html
    assert 'href="https://grafana.example/d/node?var-node=gpu020"' in html
    assert 'href="https://grafana.example/d/fleet"' in html
