"""Issue 23 point 7: importers that account. Rows of one load with the same node, start and
state collapsed into one while the report said every row read was written (Titan: 6,367 read,
6,340 kept; a DBE and an OTB in the same second lost the DBE), and wall-clock times were taken
as UTC without a word. Every importer now says what it read, wrote, merged (by cause, every
reason kept) and dropped (by cause), in its text and --json; the maintenance and fleet-event
filters say what they removed, by pattern."""

from __future__ import annotations

import io
import json
import re
import sys
from datetime import datetime
from pathlib import Path

import pandas as pd
from click.testing import CliRunner
from sqlalchemy import select

from rsc_health.cli import cli
from rsc_health.historian import db, schema
from rsc_health.historian.ingest import (
    REASON_JOINED,
    UNKNOWN_NODE,
    checks,
    events,
    exclusions,
    inventory,
    reservations,
    sacct,
    tickets,
)
from rsc_health.historian.ingest.events import zone
from rsc_health.historian.metrics.reliability import reliability
from rsc_health.historian.outages import MAINT_RESERVATION, OutageRules

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import _lanl  # noqa: E402
import _titan  # noqa: E402

HEADER = "NodeName|TimeStart|TimeEnd|State|Reason\n"


def _rows(engine):
    with engine.connect() as conn:
        return conn.execute(select(schema.node_events.c.node, schema.node_events.c.start,
                                   schema.node_events.c.reason)
                            .order_by(schema.node_events.c.start)).all()


def test_two_failures_in_the_same_second_keep_both_reasons_and_are_counted(historian_url):
    engine = db.connect(historian_url, upgrade=True, create_missing=True)
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
    engine = db.connect(url, create_missing=True)
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
    engine = db.connect(f"sqlite:///{tmp_path / 'h.db'}", upgrade=True, create_missing=True)
    try:
        report = events.ingest_file(engine, paths["events"])
    finally:
        engine.dispose()
    assert (report.read, report.written) == (6367, 6340)
    assert sum(report.merged.values()) == 27


# -- every importer accounts: read == written + merged + dropped, each by its cause ----------

def _accounted(report) -> bool:
    return report.read == (report.written + sum(report.merged.values())
                           + sum(report.dropped.values()))


def test_lanl_imports_account_for_every_row_and_tickets_opened_together_keep_both_reasons(
        tmp_path):
    frame = _lanl.read()
    paths = _lanl.write_imports(frame, tmp_path)
    engine = db.connect(f"sqlite:///{tmp_path / 'h.db'}", upgrade=True, create_missing=True)
    try:
        ev = events.ingest_file(engine, paths["events"], tz=_lanl.TZ)
        tk = tickets.import_csv(engine, paths["tickets"], tz=zone(_lanl.TZ))
        inv = inventory.import_csv(engine, paths["inventory"], tz=zone(_lanl.TZ))
        with engine.connect() as conn:
            stored = conn.execute(select(schema.tickets.c.node, schema.tickets.c.reason)).all()
    finally:
        engine.dispose()
    # the answer from the data itself: outages of one node starting in the same minute
    same = frame.groupby(["node", "start"])["reason"].agg(list)
    twice = same[same.str.len() > 1]
    assert len(twice) > 0
    for report in (ev, tk, inv):
        assert _accounted(report), report.summary()
    assert ev.read == tk.read == len(frame)
    assert sum(ev.merged.values()) == sum(tk.merged.values()) == int((same.str.len() - 1).sum())
    assert tk.merged == {tickets.MERGED_SAME_KEY: int((same.str.len() - 1).sum())}
    reasons = {(n, r) for n, r in stored}
    by_node = {}
    for n, r in stored:
        by_node.setdefault(n, []).append(r)
    for (node, _), joined in twice.items():  # both reasons kept, none lost
        wanted = [str(r).replace(",", ";").replace('"', "'") for r in joined]
        assert any(all(w in r for w in wanted) for r in by_node[node]), (node, wanted)
    assert len(reasons) <= len(stored)


def test_titan_checks_and_inventories_account_for_every_row(tmp_path):
    paths = _titan.write_imports(_titan.read(), tmp_path)
    engine = db.connect(f"sqlite:///{tmp_path / 'h.db'}", upgrade=True, create_missing=True)
    try:
        reports = [checks.ingest_file(engine, paths["checks"]),
                   inventory.import_csv(engine, paths["inventory"]),
                   inventory.import_gpus_csv(engine, paths["gpus"])]
        counts = db.table_counts(engine)
    finally:
        engine.dispose()
    for report in reports:
        assert _accounted(report), report.summary()
    # the checks' merged rows are identical lines (the id is their content): what was
    # written is what the table holds
    assert reports[0].written == counts["check_results"]
    lines = [ln for ln in paths["checks"].read_text().splitlines() if ln.strip()]
    assert sum(reports[0].merged.values()) == len(lines) - len(set(lines))


def test_rows_left_out_are_counted_by_cause_in_text_and_json(tmp_path):
    url = f"sqlite:///{tmp_path / 'h.db'}"
    ev = tmp_path / "events.txt"
    ev.write_text(HEADER
                  + "n1|2016-04-05T10:00:00|Unknown|DOWN|ok\n"
                  + "|2016-04-05T10:00:00|Unknown|DOWN|the whole cluster\n"
                  + "n2|2016-04-31T10:00:00|Unknown|DOWN|no such day\n"
                  + "n3|Unknown|Unknown|DOWN|no start\n"
                  + "n4\x00|2016-04-05T10:00:00|Unknown|DOWN|a NUL in the name\n"
                  + "n" * 200 + "|2016-04-05T10:00:00|Unknown|DOWN|too long\n"
                  + "n5|2016-04-05T10:00:00|DOWN\n")
    runner = CliRunner()
    out = runner.invoke(cli, ["--db", url, "ingest", "events", "--file", str(ev), "--json"])
    assert out.exit_code == 0, out.output
    got = json.loads(out.output)
    assert (got["read"], got["written"]) == (7, 1)
    assert got["dropped"] == {events.CLUSTER_EVENT: 1, "unparsable time": 1, "no time": 1,
                              "a name the historian cannot keep (too long, or a NUL byte)": 2,
                              "wrong number of fields": 1}
    assert got["merged"] == {}
    text = runner.invoke(cli, ["--db", url, "ingest", "events", "--file", str(ev)])
    assert "2 dropped (a name the historian cannot keep" in text.output
    assert "1 dropped (unparsable time)" in text.output

    tk = tmp_path / "tickets.csv"
    tk.write_text("node,opened,closed,reason\n"
                  "n1,2016-04-05T10:00:00,,GPU DBE\n"
                  "n1,2016-04-05T10:00:00,2016-04-06T10:00:00,GPU off the bus\n"
                  ",2016-04-05T10:00:00,,no node\n"
                  "n2,,,no time\n"
                  "n3,yesterday,,garbled time\n"
                  'n4,2016-04-05T10:00:00,,"' + "x" * 200_000 + '"\n')
    out = runner.invoke(cli, ["--db", url, "ticket", "import", "--file", str(tk), "--json"])
    got = json.loads(out.output)
    assert (got["read"], got["written"]) == (6, 1)
    assert got["merged"] == {tickets.MERGED_SAME_KEY: 1}
    assert got["dropped"] == {"no node": 1, "no time": 1, "unparsable time": 1,
                              "not a CSV row (the csv module refused it)": 1}
    listed = json.loads(runner.invoke(cli, ["--db", url, "ticket", "list", "--json"]).output)
    # one ticket, both reasons, open while either of the two is
    assert [(t["node"], t["reason"], t["closed"]) for t in listed] == [
        ("n1", "GPU DBE; GPU off the bus", None)]

    inv = tmp_path / "inventory.csv"
    inv.write_text("node,cluster,partition,from,to\n"
                   "n1,c,p,2016-01-01T00:00:00,\n"
                   "n1,c,q,2016-01-01T00:00:00,\n"
                   "n2,c,p,2016-02-01T00:00:00,2016-01-01T00:00:00\n"
                   "n3,c,p,,\n")
    got = json.loads(runner.invoke(cli, ["--db", url, "ingest", "inventory", "--file",
                                         str(inv), "--json"]).output)
    assert (got["read"], got["written"]) == (4, 1)
    assert got["merged"] == {inventory.MERGED_SAME_KEY: 1}
    assert got["dropped"] == {inventory.TO_BEFORE_FROM: 1, "no time": 1}


def test_checks_exclusions_and_reservations_count_repeats_and_garbage_by_cause(historian):
    row = {"time": "2024-03-01T10:00:00Z", "node": "n1", "check": "xid", "status": "fail",
           "code": "xid79"}
    lines = [json.dumps(row), json.dumps(row), "[[[[", json.dumps([1]),
             json.dumps({**row, "time": "soon"}), json.dumps({**row, "node": ""}),
             json.dumps({**row, "node": "n" * 500})]
    report = checks.ingest_lines(historian, lines)
    assert _accounted(report)
    assert (report.read, report.written) == (7, 1)
    assert report.merged == {checks.MERGED_SAME_ID: 1}
    assert report.dropped == {"not a JSON object": 2, "unparsable time": 1, "no node": 1,
                              "a name the historian cannot keep (too long, or a NUL byte)": 1}
    ex = exclusions.ingest_lines(historian, [
        '{"job_id": "1", "node": "n1", "time": "2024-03-01T10:00:00"}',
        '{"job_id": "1", "node": "n1", "time": "2024-03-01T10:00:00"}',
        '{"job_id": "2", "node": "n1", "time": "then"}'])
    assert _accounted(ex) and ex.merged == {exclusions.MERGED_SAME_KEY: 1}
    assert ex.dropped == {"unparsable time": 1}
    res = reservations.ingest_text(historian, "Name|TimeStart|TimeEnd|Flags|Nodes\n"
                                   "m1|2024-03-01T10:00:00|2024-03-01T12:00:00|MAINT|n[1-2]\n"
                                   "m1|2024-03-01T10:00:00|2024-03-01T14:00:00|MAINT|n[1-2]\n"
                                   "m2|garbled|Unknown|MAINT|n3\n")
    assert _accounted(res) and res.merged == {reservations.MERGED_SAME_KEY: 1}
    assert res.dropped == {"unparsable time": 1}


def test_the_maintenance_and_fleet_filters_say_what_they_removed(tmp_path):
    """LANL's outages under the packaged maintenance patterns: each row counted under the
    first pattern its reason matches, the counts computed here from the data itself."""
    frame = _lanl.read()
    paths = _lanl.write_imports(frame, tmp_path)
    url = f"sqlite:///{tmp_path / 'h.db'}"
    engine = db.connect(url, upgrade=True, create_missing=True)
    try:
        events.ingest_file(engine, paths["events"], tz=_lanl.TZ)
        df = reliability(engine, datetime(1990, 1, 1), datetime(2010, 1, 1), period="year")
    finally:
        engine.dispose()
    left = df.attrs["left_out"]["maintenance"]
    # one row per node and start once imported (same-second rows are one period)
    reasons = frame.groupby(["node", "start"])["reason"].agg("; ".join)
    expected: dict[str, int] = {}
    rest = reasons
    for pattern in OutageRules().maintenance_reason_patterns:
        hit = rest.str.contains(pattern, regex=True)
        if hit.any():
            expected[pattern] = int(hit.sum())
        rest = rest[~hit]
    assert left == expected and MAINT_RESERVATION not in left
    assert sum(left.values()) > 800  # most of them "Hardware: Maintenance"
    hardware = reasons[reasons.str.startswith("Hardware") & reasons.str.contains(
        re.compile("maint", re.I))]
    assert len(hardware) > 0.75 * sum(left.values())
    assert sum(df.attrs["left_out"]["fleet"].values()) > 0
    out = CliRunner().invoke(cli, ["--db", url, "reliability", "--since", "1990-01-01",
                                   "--until", "2010-01-01", "--period", "year", "--json"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.output)["left_out"]["maintenance"] == expected
    text = CliRunner().invoke(cli, ["--db", url, "reliability", "--since", "1990-01-01",
                                    "--until", "2010-01-01", "--period", "year"]).output
    assert f"{sum(expected.values())} maintenance outages ('(?i)maint': " in text


def test_a_maint_reservation_is_named_as_the_cause():
    from rsc_health.historian.outages import classify_outages, removed_by_cause

    ev = pd.DataFrame({"node": ["n1", "n2", "n3"],
                       "start": pd.to_datetime(["2024-03-01 10:30", "2024-03-01 10:30",
                                                "2024-03-02 00:00"]),
                       "reason": ["GPU", "firmware update", "GPU"]})
    rules = OutageRules()
    kind = classify_outages(ev, rules, 3, [({"n1", "n2"}, datetime(2024, 3, 1, 10),
                                            datetime(2024, 3, 1, 12))])
    assert list(kind) == ["maintenance", "maintenance", "node"]
    assert removed_by_cause(ev, kind, rules, 3) == {
        "maintenance": {"(?i)firmware": 1, MAINT_RESERVATION: 1}, "fleet": {}}


# -- issue 23, what was left: a sacct duplicate, unknown nodes, a reason replaced by a re-import

SACCT_SMALL = Path(__file__).parent / "fixtures" / "sacct_small.txt"


def test_a_job_instance_read_twice_in_one_sacct_load_is_merged_not_written_twice(historian):
    lines = SACCT_SMALL.read_text().splitlines(keepends=True)
    # the first job again (two exports that overlap), and again with a later state
    again = lines[1].replace("|COMPLETED|", "|FAILED|")
    report = sacct_ingest(historian, "".join([*lines, lines[1], again]))
    alone = sacct_ingest(historian.url, "".join(lines), fresh=True)
    assert report.read == alone.read + 2
    assert report.written == alone.written
    assert report.merged == {sacct.MERGED_SAME_INSTANCE: 2}
    assert "2 merged (same job instance twice in one load" in report.summary()
    with historian.connect() as conn:
        states = conn.execute(select(schema.jobs.c.state).where(
            schema.jobs.c.job_id == "1001")).scalars().all()
    assert states == ["FAILED"]  # one row, the later one


def sacct_ingest(engine_or_url, text: str, fresh: bool = False):
    if not fresh:
        return sacct.ingest_text(engine_or_url, text)
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        other = db.connect(f"sqlite:///{tmp}/fresh.db", upgrade=True, create_missing=True)
        try:
            return sacct.ingest_text(other, text)
        finally:
            other.dispose()


def test_rows_for_nodes_the_inventory_does_not_list_are_kept_and_noted(historian):
    inventory.import_lines(historian, io.StringIO(
        "node,cluster,partition,from,to\nn1,c,p,2016-01-01T00:00:00,\n"))
    report = events.ingest_text(historian, HEADER
                                + "n1|2016-04-05T10:00:00|Unknown|DOWN|GPU DBE\n"
                                + "ghost|2016-04-05T11:00:00|Unknown|DOWN|GPU DBE\n"
                                + "ghost|2016-04-06T11:00:00|Unknown|DOWN|GPU OTB\n")
    assert (report.read, report.written) == (3, 3)
    assert report.noted == {UNKNOWN_NODE: 2}
    assert "2 written for a node the inventory does not list" in report.summary()
    assert report.as_dict()["noted"] == {UNKNOWN_NODE: 2}
    got = tickets.import_lines(historian, io.StringIO(
        "node,opened,closed,reason\nghost,2016-04-05T12:00:00,,GPU DBE\n"
        "n1,2016-04-05T12:00:00,,GPU DBE\n"))
    assert (got.written, got.noted) == (2, {UNKNOWN_NODE: 1})


def test_no_inventory_no_unknown_nodes(historian):
    report = events.ingest_text(historian, HEADER + "n9|2016-04-05T10:00:00|Unknown|DOWN|x\n")
    assert report.noted == {}


def test_a_re_import_with_another_reason_keeps_both_and_says_so(historian):
    first = HEADER + "n1|2016-04-05T10:00:00|Unknown|DOWN|GPU DBE\n"
    events.ingest_text(historian, first)
    report = events.ingest_text(historian, HEADER
                                + "n1|2016-04-05T10:00:00|2016-04-05T12:00:00|DOWN|GPU OTB\n")
    assert report.noted == {REASON_JOINED: 1}
    with historian.connect() as conn:
        row = conn.execute(select(schema.node_events.c.reason, schema.node_events.c.end)).one()
    assert row == ("GPU DBE; GPU OTB", datetime(2016, 4, 5, 12))  # both, and the end filled
    # the same files again change nothing and note nothing
    assert events.ingest_text(historian, first).noted == {}
    assert _rows(historian)[0][2] == "GPU DBE; GPU OTB"
    tk = "node,opened,closed,reason\nn1,2016-04-05T10:00:00,,{}\n"
    tickets.import_lines(historian, io.StringIO(tk.format("GPU DBE")))
    again = tickets.import_lines(historian, io.StringIO(tk.format("GPU off the bus")))
    assert again.noted == {REASON_JOINED: 1}
    assert tickets.import_lines(historian, io.StringIO(tk.format("GPU DBE"))).noted == {}
    with historian.connect() as conn:
        assert conn.execute(select(schema.tickets.c.reason)).scalar_one() == (
            "GPU DBE; GPU off the bus")
