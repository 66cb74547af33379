"""Nodes whose clocks are wrong: the historian judges a record's time against the database's
own clock, never trusts a stamp from the future (or from a reset clock) blindly.

A node a year ahead used to deliver a heartbeat that kept it fresh for a year (dead or not),
and check runs that pushed its open intervals a year ahead, so every later, correct run was
'older' and dropped: a failure the node reported after its clock was fixed never reached the
historian. Times are real (the database's clock is the reference), on SQLite and PostgreSQL.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from click.testing import CliRunner
from sqlalchemy import func, insert, select

from rsc_health import spool
from rsc_health.cli import cli
from rsc_health.historian import schema
from rsc_health.historian.freshness import node_freshness
from rsc_health.historian.ingest.delivery import deliver
from rsc_health.historian.intervals import open_failures
from rsc_health.model import Finding, Severity, Status, new_record_id

OK_IB = Finding("infiniband", "mlx5_0/1", Status.OK, Severity.NONE, "ACTIVE")
IB_DOWN = Finding("infiniband", "mlx5_0/1", Status.FAIL, Severity.DRAIN_NOW, "port DOWN",
                  code="ib_down")


def _now() -> datetime:
    return datetime.now(UTC)


def _run(node: str, t: datetime, findings: list[Finding], level: str = "ok") -> list[dict]:
    recs = spool.check_records(findings, node=node, source="sweep", time=t, job_id=None)
    recs.append({"kind": "heartbeat", "id": new_record_id(), "time": t.isoformat(),
                 "node": node, "source": "sweep", "level": level, "checker_errors": 0,
                 "duration_s": 0.2, "families": {}, "version": "test"})
    return recs


def _deliver(engine, spool_dir, records):
    spool.append(spool_dir, records)
    return deliver(engine, spool_dir)


def _naive(t: datetime) -> datetime:
    return t.astimezone(UTC).replace(tzinfo=None)


def test_a_heartbeat_from_a_year_ahead_does_not_keep_a_dead_node_fresh(historian, tmp_path):
    now = _now()
    _deliver(historian, tmp_path, _run("gpu-ahead", now + timedelta(days=365), [OK_IB]))
    # The node dies right after that flush; two hours later it must be named as stale.
    later = _naive(now + timedelta(hours=2))
    (fresh,) = node_freshness(historian, later, stale_after_s=2700)
    assert fresh.node == "gpu-ahead" and fresh.stale
    assert fresh.last_seen is not None and fresh.last_seen <= later


def test_a_node_with_a_wrong_clock_is_flagged_while_it_keeps_delivering(historian, tmp_path):
    """Alive (it delivers) but untrustworthy: fresh by the database's clock, and flagged, so
    `healthctl status` and the exporter name it instead of hiding or calling it dead."""
    now = _now()
    report = _deliver(historian, tmp_path, _run("gpu-ahead", now + timedelta(days=365), [OK_IB])
                      + _run("gpu-1970", datetime(1970, 1, 1, tzinfo=UTC), [OK_IB]))
    assert report.skewed == 4
    assert "clock" in report.summary()
    fresh = {f.node: f for f in node_freshness(historian, _naive(now), stale_after_s=2700)}
    for node in ("gpu-ahead", "gpu-1970"):
        assert not fresh[node].stale and fresh[node].broken
        assert fresh[node].last_level == "clock_skew"


def test_a_run_from_the_future_does_not_hide_failures_reported_after_the_clock_is_fixed(
        historian, tmp_path):
    now = _now()
    _deliver(historian, tmp_path, _run("gpu-ahead", now - timedelta(minutes=20), [OK_IB]))
    _deliver(historian, tmp_path, _run("gpu-ahead", now + timedelta(days=365), [OK_IB]))
    # The clock is fixed; the next sweep sees the InfiniBand port down.
    _deliver(historian, tmp_path, _run("gpu-ahead", now - timedelta(minutes=1), [IB_DOWN]))
    with historian.connect() as conn:
        failing = open_failures(conn, "gpu-ahead")
        c = schema.check_results
        newest = conn.execute(select(func.max(c.c.last_seen))).scalar()
    assert [(f["check"], f["code"]) for f in failing] == [("infiniband", "ib_down")]
    assert newest <= _naive(now)
    (fresh,) = node_freshness(historian, _naive(now), stale_after_s=2700)
    assert fresh.last_level == "ok" and not fresh.stale


def test_records_from_a_wrong_clock_are_quarantined_with_their_reason(historian, tmp_path):
    now = _now()
    ahead = now + timedelta(days=365)
    records = _run("gpu-ahead", ahead, [IB_DOWN])
    records.append(spool.record("action", "gpu-ahead", ahead, action="drain_now",
                                reason="ib_down"))
    records.append(spool.record("job_start", "gpu-ahead", ahead, job_id="77",
                                excluded=["gpu-x"]))
    records += _run("gpu-ok", now - timedelta(minutes=3), [OK_IB])
    report = _deliver(historian, tmp_path, records)

    assert report.skewed == 4 and report.quarantined_count == 4
    lines = [json.loads(x) for x in (tmp_path / "quarantine").glob("*").__next__()
             .read_text().splitlines()]
    assert [q["line"] for q in lines] == [1, 2, 3, 4]
    assert all("ahead of the historian's clock" in q["error"] for q in lines)
    with historian.connect() as conn:
        for table in (schema.node_actions, schema.job_exclusions, schema.heartbeat_days):
            n = conn.execute(select(func.count()).select_from(table)
                             .where(table.c.node == "gpu-ahead")).scalar()
            assert n == 0, table.name
        nodes = conn.execute(select(schema.check_results.c.node)).scalars().all()
    assert nodes == ["gpu-ok"]


def test_a_node_a_few_seconds_ahead_is_not_skewed(historian, tmp_path):
    now = _now()
    report = _deliver(historian, tmp_path, _run("gpu-fast", now + timedelta(seconds=20), [OK_IB]))
    assert report.skewed == 0 and report.delivered == {"check": 1, "heartbeat": 1}


def test_status_names_a_node_whose_clock_is_wrong(historian_url, historian, tmp_path):
    _deliver(historian, tmp_path, _run("gpu-ahead", _now() + timedelta(days=365), [OK_IB]))
    result = CliRunner().invoke(cli, ["--db", historian_url, "node", "gpu-ahead"])
    assert "Traceback" not in result.output, result.output
    assert "clock" in result.output, result.output


XID79 = Finding("xid", "gpu3", Status.FAIL, Severity.DRAIN_NOW, "XID 79 fell off the bus",
                code="xid79")


def _check_nodes(engine) -> list[tuple[str, str]]:
    c = schema.check_results
    with engine.connect() as conn:
        return sorted(conn.execute(select(c.c.node, c.c.code)).all())


def test_a_clock_reset_to_a_bios_date_after_2020_is_not_believed(historian, tmp_path):
    """An RTC battery dies and the node boots at its BIOS's date, 2022-06-01: after the floor,
    so its XID 79 was stored in 2022 and attributed to the job the node ran that day. Years
    behind the node's own heartbeat of minutes before, it is quarantined as a wrong clock, and
    the node flagged."""
    now = _now()
    _deliver(historian, tmp_path, _run("gpu-rtc", now - timedelta(minutes=10), [OK_IB]))
    report = _deliver(historian, tmp_path,
                      _run("gpu-rtc", datetime(2022, 6, 1, 0, 5, tzinfo=UTC), [XID79]))
    assert report.skewed == 2 and report.quarantined_count == 2
    lines = [json.loads(x) for x in next((tmp_path / "quarantine").glob("*"))
             .read_text().splitlines()]
    assert all("before the node's own newest heartbeat on record" in q["error"]
               for q in lines)
    assert "xid79" not in [code for _, code in _check_nodes(historian)]
    (fresh,) = node_freshness(historian, _naive(now), stale_after_s=2700)
    assert fresh.last_level == "clock_skew" and fresh.broken


def test_a_replay_of_a_past_fleet_lands_beside_a_live_one(historian, tmp_path):
    """The simulator's fleet (2024) or a capture, replayed into a historian that holds today's
    fleet: its nodes have no history of their own there, so nothing is a clock gone back."""
    now = _now()
    _deliver(historian, tmp_path / "live", _run("gpu-live", now - timedelta(minutes=2),
                                                 [OK_IB]))
    t = datetime(2024, 3, 1, 9, 55, tzinfo=UTC)
    report = _deliver(historian, tmp_path, _run("sim-1", t, [OK_IB]) + _run(
        "sim-1", t + timedelta(days=30), [XID79]))
    assert report.skewed == 0
    assert ("sim-1", "xid79") in _check_nodes(historian)


def test_a_node_back_after_five_months_delivers_the_xid_that_took_it_down(historian,
                                                                         tmp_path):
    """Its spool kept the XID (a full spool drops all-clear rows, never news) and it comes
    back months later: in order, each record newer than the node's last delivered one."""
    now = _now()
    _deliver(historian, tmp_path, _run("gpu-rma", now - timedelta(days=151), [OK_IB]))
    report = _deliver(historian, tmp_path, _run("gpu-rma", now - timedelta(days=150), [XID79])
                      + _run("gpu-rma", now - timedelta(minutes=1), [OK_IB]))
    assert report.skewed == 0
    assert ("gpu-rma", "xid79") in _check_nodes(historian)


def test_a_heartbeat_on_record_from_the_future_does_not_refuse_the_nodes_right_stamps(
        historian, tmp_path):
    """A row a year ahead (an earlier release believed such a node; a SQLite historian's host
    whose own clock was ahead for one flush): the node's reference is capped at the
    historian's clock, so its right stamps of today are not taken for a clock gone back."""
    now = _now()
    with historian.begin() as conn:
        conn.execute(insert(schema.node_runs).values(
            node="gpu-was-ahead", source="sweep", last_seen=_naive(now + timedelta(days=365)),
            level="ok", checker_errors=0, version="0.9"))
    report = _deliver(historian, tmp_path, _run("gpu-was-ahead", now - timedelta(minutes=1),
                                                [XID79]))
    assert report.skewed == 0
    assert ("gpu-was-ahead", "xid79") in _check_nodes(historian)


def test_a_backlog_weeks_old_and_an_ntp_step_back_land_whole(historian, tmp_path):
    """What a wrong clock is not: a spool kept while the historian was away for seven weeks,
    delivered in order, and an NTP step of 20 minutes back at boot."""
    now = _now()
    records = []
    for day in range(49, 0, -7):
        records += _run("gpu-late", now - timedelta(days=day), [OK_IB])
    records += _run("gpu-late", now - timedelta(minutes=30), [OK_IB])
    records += _run("gpu-late", now - timedelta(minutes=50), [XID79])  # NTP stepped back
    report = _deliver(historian, tmp_path, records)
    assert report.skewed == 0 and report.quarantined_count == 0
    assert ("gpu-late", "xid79") in _check_nodes(historian)


def test_a_batch_delivered_again_is_not_taken_for_a_clock_going_back(historian, tmp_path):
    """A delivery cut after its first chunks is delivered again from the batch's start: its
    stamps go back to the batch's first, which is no wrong clock (each delivery judges the
    node's stamps in its own order)."""
    now = _now()
    records = []
    for day in range(30, 0, -3):
        records += _run("gpu-again", now - timedelta(days=day), [OK_IB])
    spool.append(tmp_path, records)
    first = deliver(historian, tmp_path, chunk_lines=4)
    spool.append(tmp_path, records)  # the same records once more, as a redelivery reads them
    again = deliver(historian, tmp_path, chunk_lines=4)
    assert first.skewed == again.skewed == 0
