"""A first sacct backfill on SQLite runs under the rollback journal and hands the file back in
WAL; when another connection holds the file it stays in WAL and still loads everything."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from sqlalchemy import inspect

from rsc_health.historian.db import connect, table_counts
from rsc_health.historian.ingest import sacct

SACCT = Path(__file__).parent / "fixtures" / "sacct_small.txt"


def _journal_mode(path: Path) -> str:
    with sqlite3.connect(path) as raw:
        return raw.execute("PRAGMA journal_mode").fetchone()[0]


def test_first_backfill_returns_the_database_to_wal_with_every_row(tmp_path):
    db = tmp_path / "h.db"
    engine = connect(f"sqlite:///{db}", create_missing=True)
    first = sacct.ingest_text(engine, SACCT)
    assert first.written > 0
    assert _journal_mode(db) == "wal"
    jobs = table_counts(engine)["jobs"]
    again = sacct.ingest_text(engine, SACCT)  # not empty now: the ordinary WAL path
    assert table_counts(engine)["jobs"] == jobs
    assert again.bad == first.bad


def test_first_backfill_while_another_connection_reads_stays_in_wal(tmp_path):
    db = tmp_path / "h.db"
    engine = connect(f"sqlite:///{db}", create_missing=True)
    reader = sqlite3.connect(db)
    reader.execute("BEGIN")
    reader.execute("SELECT count(*) FROM jobs").fetchone()  # holds a WAL read snapshot
    try:
        report = sacct.ingest_text(engine, SACCT)
    finally:
        reader.rollback()
        reader.close()
    assert report.written > 0
    assert table_counts(engine)["jobs"] > 0
    assert _journal_mode(db) == "wal"


def test_a_failed_first_load_keeps_the_indexes(tmp_path):
    db = tmp_path / "h.db"
    engine = connect(f"sqlite:///{db}", create_missing=True)
    before = {i["name"] for t in ("jobs", "job_nodes") for i in inspect(engine).get_indexes(t)}
    assert set(sacct.DEFERRABLE_INDEXES) <= before
    with pytest.raises(sacct.SacctError):
        sacct.ingest_text(engine, "JobIDRaw|JobID\n1|1\n")
    after = {i["name"] for t in ("jobs", "job_nodes") for i in inspect(engine).get_indexes(t)}
    assert after == before
    assert _journal_mode(db) == "wal"


def test_foreign_keys_are_enforced_again_after_a_load_and_after_a_failed_one(tmp_path):
    engine = connect(f"sqlite:///{tmp_path / 'h.db'}", create_missing=True)
    sacct.ingest_text(engine, SACCT)
    with pytest.raises(sacct.SacctError):
        sacct.ingest_text(engine, "JobIDRaw|JobID\n1|1\n")
    with engine.connect() as conn:  # the pool's one connection, which the loads used
        assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
        orphans = conn.exec_driver_sql("PRAGMA foreign_key_check(job_nodes)").all()
    assert orphans == []
