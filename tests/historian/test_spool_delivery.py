"""The node spool reaches the historian exactly once, keeps waiting while it is down, and
quarantines lines that are not records."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlalchemy import func, select

from rsc_health import spool
from rsc_health.cli import cli
from rsc_health.historian import schema
from rsc_health.historian.db import HistorianUnavailable, connect
from rsc_health.historian.ingest.delivery import deliver, flush
from rsc_health.model import Finding, Severity, Status

T = datetime(2024, 3, 1, 9, 55, tzinfo=UTC)


def _records() -> list[dict]:
    findings = [
        Finding("xid", "gpu2", Status.FAIL, Severity.DRAIN_NOW, "Xid 79", code="xid79"),
        Finding("ecc", "gpu0", Status.OK, Severity.NONE, "clean"),
    ]
    out = spool.check_records(findings, node="gpu003", source="epilog", time=T, job_id="1002")
    out.append(spool.record("job_start", "gpu003", T, job_id="1002", excluded=["gpu005"]))
    out.append(spool.record("job_end", "gpu003", T, job_id="1002"))
    out.append(
        spool.record("action", "gpu003", T, action="drain_now", reason="xid79", job_id="1002")
    )
    return out


def _count(engine, table) -> int:
    with engine.connect() as conn:
        return conn.execute(select(func.count()).select_from(table)).scalar()


def test_every_record_kind_is_delivered_once_even_when_delivered_twice(historian, tmp_path):
    records = _records()
    spool.append(tmp_path, records)
    report = deliver(historian, tmp_path)
    assert report.delivered == {"check": 2, "job_start": 1, "job_end": 1, "action": 1}
    assert list(tmp_path.glob("batch-*")) == [] and not (tmp_path / spool.PENDING).exists()
    # the same records again (a node that re-sent after a lost acknowledgement)
    spool.append(tmp_path, records)
    deliver(historian, tmp_path)
    assert _count(historian, schema.check_results) == 2
    assert _count(historian, schema.job_exclusions) == 1
    assert _count(historian, schema.node_actions) == 1
    with historian.connect() as conn:
        xid = conn.execute(
            select(schema.check_results).where(schema.check_results.c.check == "xid")
        ).one()
    assert (xid.node, xid.source, xid.job_id, xid.severity, xid.code) == (
        "gpu003",
        "epilog",
        "1002",
        "drain_now",
        "xid79",
    )
    assert xid.time == datetime(2024, 3, 1, 9, 55)


def test_bad_lines_are_quarantined_with_line_numbers(historian, tmp_path):
    good = _records()
    spool.append(tmp_path, good[:1])
    with (tmp_path / spool.PENDING).open("a") as fh:
        fh.write('{"kind": "check", "id": "x1", "node": "gpu1", "time": "2024-03-01T00:00:00"\n')
        fh.write('{"kind": "teleport", "id": "x2", "node": "gpu1", "time": "2024-03-01"}\n')
    spool.append(tmp_path, good[1:2])
    report = deliver(historian, tmp_path)
    assert [b.line for _, b in report.quarantined] == [2, 3]
    assert _count(historian, schema.check_results) == 2
    (quarantined,) = (tmp_path / "quarantine").iterdir()
    assert '"line": 3' in quarantined.read_text() and "teleport" in quarantined.read_text()
    assert list(tmp_path.glob("batch-*")) == []


def test_quarantine_stops_growing_at_its_bound_and_says_what_it_did_not_keep(
        historian, tmp_path, monkeypatch):
    """quarantine/ sits outside the spool's cap: a node whose bad lines never stop (a clock
    that stays wrong quarantines every record, every flush) must not fill /var with them
    (found by helper-96). Past QUARANTINE_MAX_BYTES the lines are counted, not kept, and the
    node's good records still land."""
    from rsc_health.historian.ingest import delivery

    monkeypatch.setattr(delivery, "QUARANTINE_MAX_BYTES", 4096)
    kept_sizes = []
    for flush_no in range(6):
        spool.append(tmp_path, _records()[:1])
        with (tmp_path / spool.PENDING).open("a") as fh:
            for k in range(4):
                fh.write(f'{{"kind": "teleport", "id": "q{flush_no}-{k}", "pad": "{"x" * 200}"}}\n')
        report = deliver(historian, tmp_path)
        assert report.quarantined_count == 4
        kept_sizes.append(sum(f.stat().st_size for f in (tmp_path / "quarantine").iterdir()))
    assert kept_sizes[-1] <= 4096 and kept_sizes[-1] == kept_sizes[-2]  # bounded, not growing
    assert report.quarantine_lost == 4 and "not kept" in report.quarantine_error
    assert "could not be kept" in report.summary()
    assert _count(historian, schema.check_results) == 6  # every flush's good record landed


def test_a_spooled_severity_the_historian_does_not_know_is_quarantined_as_the_file_import_does(
        historian, tmp_path):
    """The file import refuses a severity outside none|warn|drain_after_job|drain_now; the
    spool's delivery cut it to 16 characters and stored it, a finding the attribution and
    the report then counted as nothing."""
    records = _records()[:2]
    records[0]["severity"] = "drain_now_please_at_once"
    records[1]["severity"] = "Drain-After-Job"  # the file import's spelling rule: kept
    spool.append(tmp_path, records)
    report = deliver(historian, tmp_path)
    assert [b.line for _, b in report.quarantined] == [1]
    assert "is not one of" in report.quarantined[0][1].message
    with historian.connect() as conn:
        kept = conn.execute(select(schema.check_results.c.severity)).scalars().all()
    assert kept == ["drain_after_job"]


def test_database_down_keeps_the_spool_for_the_next_flush(tmp_path, historian_url, historian):
    spool.append(tmp_path, _records())
    down = "postgresql+psycopg://rsc:pw@127.0.0.1:1/history"
    with pytest.raises(HistorianUnavailable):
        flush(down, tmp_path)
    waiting = list(tmp_path.glob("batch-*.jsonl"))
    assert len(waiting) == 1 and len(waiting[0].read_text().splitlines()) == 5
    # later results keep arriving while the database is down
    spool.append(tmp_path, _records())
    result = CliRunner().invoke(cli, ["--db", down, "spool", "flush", "--dir", str(tmp_path)])
    assert result.exit_code == 1 and "kept" in result.output
    assert len(list(tmp_path.glob("batch-*.jsonl"))) == 2
    # the database is back
    result = CliRunner().invoke(
        cli, ["--db", historian_url, "spool", "flush", "--dir", str(tmp_path)]
    )
    assert result.exit_code == 0, result.output
    assert list(tmp_path.glob("batch-*.jsonl")) == []
    # Two runs stamped with the same time are one run to the intervals: the all-clear ecc
    # state is stored once; each XID record is its own event (3 rows, not 4 per-run rows).
    assert _count(historian, schema.check_results) == 3


def test_a_failed_write_leaves_the_batch(tmp_path):
    """The database goes away between claim and write: the batch stays to be retried."""
    engine = connect(f"sqlite:///{tmp_path / 'h.db'}", create_missing=True)
    spool.append(tmp_path / "spool", _records())
    with engine.begin() as conn:
        conn.exec_driver_sql("DROP TABLE node_actions")
    with pytest.raises(Exception):  # noqa: B017 -- any failure must keep the batch
        deliver(engine, tmp_path / "spool")
    assert len(list((tmp_path / "spool").glob("batch-*.jsonl"))) == 1
    engine.dispose()


def test_bytes_that_were_not_utf8_on_the_node_never_stop_a_flush(historian, tmp_path):
    """A mount path or log text with Latin-1 bytes reaches the spool as escaped lone surrogates;
    no driver can encode them, and one such record used to fail every later flush of the node."""
    when = datetime(2026, 11, 24, 10, tzinfo=UTC)
    bad_path = Finding("mount", "/scr\udce9tch", Status.FAIL, Severity.DRAIN_AFTER_JOB,
                       "missing \udce9", code="mount_missing")
    records = spool.check_records([bad_path], node="n1", source="sweep", time=when, job_id=None)
    records.append(spool.record("job_start", "n1", when, job_id="5", excluded=[],
                                user="caf\udce9", partition="gpu"))
    spool.append(tmp_path, records)

    report = deliver(historian, tmp_path)

    assert report.delivered == {"check": 1, "job_start": 1}
    with historian.connect() as conn:
        comp = conn.execute(select(schema.check_results.c.component)).scalar_one()
    assert comp == "/scr\ufffdtch"
    assert not list(tmp_path.glob("batch-*"))  # delivered, nothing left behind


def _flush_proc(url: str, spool_dir) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "rsc_health.cli", "--db", url, "spool", "flush", "--dir",
         str(spool_dir)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])})


def test_two_flushes_of_one_spool_at_once_count_each_failure_once(tmp_path):
    """Two `spool flush` of one directory at once (an overlapping timer, an operator's manual
    run) both claimed the same batch and both read the historian before either wrote: every
    failure and XID of the batch was counted twice in check_days. The second flush now finds
    the first holding the spool and leaves it to it. (A third connection holds SQLite's write
    lock so that both have read before either writes: the race made certain.)"""
    import sqlite3
    import time

    xid = Finding("xid", "gpu2", Status.FAIL, Severity.DRAIN_NOW, "Xid 79", code="xid79")
    ecc = Finding("ecc", "gpu0", Status.FAIL, Severity.DRAIN_NOW, "DBE", code="ecc_dbe")
    ok = Finding("ecc", "gpu0", Status.OK, Severity.NONE, "clean")
    records = []
    for i in range(40):
        when = T.replace(hour=0) + timedelta(minutes=5 * i)
        findings = [xid, ecc] if i % 4 == 0 else [ok]
        records += spool.check_records(findings, node="gpu003", source="sweep", time=when,
                                       job_id=None)
    spool_dir = tmp_path / "spool"
    spool.append(spool_dir, records)
    url = f"sqlite:///{tmp_path / 'h.db'}"
    connect(url, create_missing=True).dispose()
    holder = sqlite3.connect(tmp_path / "h.db", isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        first = _flush_proc(url, spool_dir)
        deadline = time.monotonic() + 60
        while (spool_dir / spool.PENDING).exists() and time.monotonic() < deadline:
            time.sleep(0.1)  # the first has claimed the batch
        second = _flush_proc(url, spool_dir)
        try:
            second.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass  # still waiting on the write lock, having read
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    outs = [p.communicate(timeout=120) for p in (first, second)]
    assert [p.returncode for p in (first, second)] == [0, 0], outs
    days = schema.check_days
    engine = connect(url, create_missing=True)
    with engine.connect() as conn:
        counts = dict(conn.execute(select(days.c.check, days.c.fail)).all())
    engine.dispose()
    assert counts == {"xid": 10, "ecc": 10}
    assert "another spool flush" in outs[1][0] + outs[1][1]
    assert list(spool_dir.glob("batch-*")) == []


@pytest.mark.parametrize("stored", [schema.SCHEMA_VERSION - 1, schema.SCHEMA_VERSION + 1])
def test_a_flush_into_a_historian_of_another_version_keeps_the_batch_and_says_why(
        historian, historian_url, tmp_path, stored):
    """The flush reads the version inside its first transaction (not a transaction of its
    own): a database of another release still gets nothing, and the batch waits."""
    from rsc_health.historian.db import SchemaTooNew, SchemaTooOld

    with historian.begin() as conn:
        conn.execute(schema.schema_version.update().values(version=stored))
    spool.append(tmp_path, _records())
    with pytest.raises(SchemaTooOld if stored < schema.SCHEMA_VERSION else SchemaTooNew):
        flush(historian_url, tmp_path)
    assert len(list(tmp_path.glob("batch-*.jsonl"))) == 1
    assert _count(historian, schema.check_results) == 0


def test_a_flush_into_an_empty_database_creates_the_schema_and_delivers(historian_url,
                                                                         tmp_path):
    spool.append(tmp_path, _records())
    report = flush(historian_url, tmp_path)
    assert report.delivered["check"] == 2 and report.batches == 1
    engine = connect(historian_url, create_missing=True)
    try:
        assert _count(engine, schema.node_actions) == 1
    finally:
        engine.dispose()
