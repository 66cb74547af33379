"""Periods read from wall-clock exports (node events, tickets) end after they start. In the
hour a DST change repeats (America/Denver, 2024-11-03 01:00-02:00), a period that starts in
the first 01:50 and ends in the second 01:10 is 20 minutes long; read as the first 01:10 both
times it ended 40 minutes before it began, and the reliability figures said a repair took
-0.67 h (p50). A period that ends before it starts whatever the reading (a garbled export, a
ticket closed before it was opened) costs its row, said, never a negative repair time."""

from __future__ import annotations

import io
import json
from datetime import datetime

from click.testing import CliRunner
from sqlalchemy import select

from rsc_health.cli import cli
from rsc_health.historian import schema
from rsc_health.historian.db import connect
from rsc_health.historian.ingest import tickets

EVENTS = ("NodeName|TimeStart|TimeEnd|State|Reason\n"
          "n001|2024-11-03T01:50:00|2024-11-03T01:10:00|DOWN|Not responding\n"
          "n002|2024-11-01T01:50:00|2024-11-01T00:10:00|DOWN|Not responding\n"
          "n003|2024-11-02T01:00:00|2024-11-02T03:00:00|DOWN|Not responding\n")


def test_an_event_ending_in_the_repeated_dst_hour_ends_after_it_starts(tmp_path, historian_url):
    path = tmp_path / "events.txt"
    path.write_text(EVENTS)
    run = CliRunner()
    out = run.invoke(cli, ["--db", historian_url, "ingest", "events", "--file", str(path),
                           "--tz", "America/Denver", "--json"])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.output)
    assert doc["written"] == 2
    assert doc["dropped"] == {"ends before it starts": 1}
    engine = connect(historian_url, create_missing=True)
    with engine.connect() as conn:
        rows = {r.node: (r.start, r.end) for r in conn.execute(select(schema.node_events))}
    engine.dispose()
    # 01:50 MDT (-6) is 07:50 UTC; the second 01:10, MST (-7), is 08:10 UTC.
    assert rows["n001"] == (datetime(2024, 11, 3, 7, 50), datetime(2024, 11, 3, 8, 10))
    assert "n002" not in rows
    rel = run.invoke(cli, ["--db", historian_url, "reliability", "--since", "2024-10-01",
                           "--until", "2024-12-01", "--json"])
    assert rel.exit_code == 0, rel.output
    [row] = json.loads(rel.output)["rows"]
    assert row["failures"] == 2 and row["repair_p50_h"] > 0


def test_a_ticket_closed_before_it_was_opened_costs_its_row(historian):
    report = tickets.import_lines(historian, io.StringIO(
        "node,opened,closed,reason\n"
        "n1,2024-03-05T10:00:00,2024-03-04T10:00:00,psu\n"
        "n2,2024-11-03T01:50:00,2024-11-03T01:10:00,dimm\n"
        "n3,2024-03-05T10:00:00,,gpu\n"), tz=__import__("zoneinfo").ZoneInfo("America/Denver"))
    assert report.dropped == {"ends before it starts": 1}
    assert [b.line for b in report.bad] == [2]
    with historian.connect() as conn:
        rows = {r.node: (r.opened, r.closed) for r in conn.execute(select(schema.tickets))}
    assert set(rows) == {"n2", "n3"}
    assert rows["n2"] == (datetime(2024, 11, 3, 7, 50), datetime(2024, 11, 3, 8, 10))
