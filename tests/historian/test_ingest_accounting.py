"""Issue 23 point 7: importers that account. Rows of one load with the same node, start and
state collapsed into one while the report said every row read was written (Titan: 6,367 read,
6,340 kept; a DBE and an OTB in the same second lost the DBE), and wall-clock times were taken
as UTC without a word."""

from __future__ import annotations

import json
import sys
from datetime import datetime
from pathlib import Path

from click.testing import CliRunner
from sqlalchemy import select

from rsc_health.cli import cli
from rsc_health.historian import db, schema
from rsc_health.historian.ingest import events

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import _titan  # noqa: E402

HEADER = "NodeName|TimeStart|TimeEnd|State|Reason\n"


def _rows(engine):
    with engine.connect() as conn:
        return conn.execute(select(schema.node_events.c.node, schema.node_events.c.start,
                                   schema.node_events.c.reason)
                            .order_by(schema.node_events.c.start)).all()


def test_two_failures_in_the_same_second_keep_both_reasons_and_are_counted(historian_url):
    engine = db.connect(historian_url, upgrade=True)
    try:
        report = events.ingest_text(engine, HEADER
                                    + "n1|2016-04-05T10:00:00|Unknown|DOWN|GPU DBE\n"
                                    + "n1|2016-04-05T10:00:00|Unknown|DOWN|GPU OTB\n"
                                    + "n2|2016-04-05T10:00:00|Unknown|DOWN|GPU OTB\n")
        assert (report.read, report.written) == (3, 2)
        assert report.merged == {events.MERGED_SAME_KEY: 1}
        assert "1 merged (same node, start and state" in report.summary()
        assert "times read as UTC" in report.summary()
        assert _rows(engine) == [("n1", datetime(2016, 4, 5, 10), "GPU DBE; GPU OTB"),
                                 ("n2", datetime(2016, 4, 5, 10), "GPU OTB")]
    finally:
        engine.dispose()


def test_tz_reads_wall_clock_times_and_stores_utc(tmp_path):
    url = f"sqlite:///{tmp_path / 'h.db'}"
    path = tmp_path / "events.txt"
    path.write_text(HEADER + "n1|2026-01-15T10:00:00|2026-07-15T10:00:00|DOWN|x\n")
    runner = CliRunner()
    out = runner.invoke(cli, ["--db", url, "ingest", "events", "--file", str(path),
                              "--tz", "America/New_York", "--json"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.output)["times"] == "America/New_York"
    engine = db.connect(url)
    try:
        with engine.connect() as conn:
            start, end = conn.execute(select(schema.node_events.c.start,
                                             schema.node_events.c.end)).one()
    finally:
        engine.dispose()
    assert (start, end) == (datetime(2026, 1, 15, 15), datetime(2026, 7, 15, 14))  # EST, EDT
    bad = runner.invoke(cli, ["--db", url, "ingest", "events", "--file", str(path),
                              "--tz", "Mars/Olympus"])
    assert bad.exit_code != 0 and "not a time zone" in bad.output
    assert bad.output.count("\n") == 1


def test_titan_events_account_for_every_row(tmp_path):
    paths = _titan.write_imports(_titan.read(), tmp_path)
    engine = db.connect(f"sqlite:///{tmp_path / 'h.db'}", upgrade=True)
    try:
        report = events.ingest_file(engine, paths["events"])
    finally:
        engine.dispose()
    assert (report.read, report.written) == (6367, 6340)
    assert sum(report.merged.values()) == 27
