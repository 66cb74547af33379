"""`healthctl db prune` on a historian with years of rows: bounded like every other command (the
operator's statement timeout, not an hour of its own), in transactions of one day of rows each,
so a prune cut short keeps what it deleted and the next run goes on from there; open intervals
are never pruned; a flush lands while a prune waits.

Before, the prune was one transaction under a 3600 s statement timeout of its own: one row
locked elsewhere held `healthctl db prune` (and its timer) for an hour whatever
[historian] statement_timeout_s said, and then it rolled back every row it had deleted, to start
again from nothing the next week."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import func, select

from rsc_health import spool
from rsc_health.historian import schema
from rsc_health.historian.db import connect
from rsc_health.historian.ingest.delivery import deliver
from rsc_health.historian.retention import Retention, prune
from rsc_health.model import Finding, Severity, Status

REPO = Path(__file__).resolve().parents[2]
NOW = datetime.now(UTC).replace(tzinfo=None, microsecond=0)
T0 = NOW - timedelta(days=800)
WEEKS = range(0, 700, 7)  # a week's sample of closed failure intervals, 800 to 100 days ago


def _interval(day: int, i: int, *, is_open: bool = False) -> dict:
    t = T0 + timedelta(days=day, minutes=i)
    return dict(id=f"r{day}-{i}", time=t, last_seen=t + timedelta(minutes=1), node=f"n{i}",
                source="sweep", check="gpu", component="*", status="fail",
                severity="drain_now", code="xid79", reason="", is_open=is_open)


def _load(engine) -> None:
    rows = [_interval(d, i) for d in WEEKS for i in range(10)]
    rows.append(_interval(0, 99, is_open=True))  # a failure still open since 800 days ago
    with engine.begin() as conn:
        conn.execute(schema.check_results.insert(), rows)


def _ids(engine) -> set[str]:
    with engine.connect() as conn:
        return set(conn.execute(select(schema.check_results.c.id)).scalars())


def _expected_left() -> set[str]:
    cut = NOW - timedelta(days=400)
    return {f"r{d}-{i}" for d in WEEKS for i in range(10)
            if T0 + timedelta(days=d, minutes=i + 1) >= cut} | {"r0-99"}


def test_a_prune_deletes_what_is_past_retention_and_never_an_open_interval(historian):
    _load(historian)
    before = len(_ids(historian))
    counts = prune(historian, NOW, Retention(days=400), dry_run=True)
    assert counts["check_results"] == before - len(_expected_left())
    assert len(_ids(historian)) == before
    assert prune(historian, NOW, Retention(days=400))["check_results"] == counts["check_results"]
    assert _ids(historian) == _expected_left()
    assert prune(historian, NOW, Retention(days=400))["check_results"] == 0


def _config(tmp_path: Path) -> Path:
    cfg = tmp_path / "config.toml"
    cfg.write_text("[historian]\nstatement_timeout_s = 2\nretention_days = 400\n")
    return cfg


@pytest.mark.postgres
def test_a_prune_behind_a_locked_row_ends_at_the_statement_timeout_and_keeps_its_progress(
        pg_url, tmp_path):
    engine = connect(pg_url, create_missing=True)
    _load(engine)
    libpq = pg_url.replace("postgresql+psycopg://", "postgresql://")
    argv = [sys.executable, "-m", "rsc_health.cli", "--config", str(_config(tmp_path)),
            "--db", pg_url, "db", "prune"]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    with psycopg.connect(libpq) as holder:
        # A row in the middle of the years to prune, locked by another transaction.
        holder.execute("SELECT 1 FROM check_results WHERE id = 'r203-0' FOR UPDATE")
        started = time.monotonic()
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True)
        try:
            # While it waits, a node's flush lands (the prune holds only the rows it deletes).
            time.sleep(0.5)
            sdir = tmp_path / "spool"
            spool.append(sdir, spool.check_records(
                [Finding("ecc", "gpu0", Status.OK, Severity.NONE, "clean")], node="n1",
                source="sweep", time=datetime.now(UTC) - timedelta(minutes=1), job_id=None))
            flushed = threading.Event()
            worker = threading.Thread(target=lambda: (deliver(engine, sdir), flushed.set()))
            worker.start()
            worker.join(timeout=20)
            assert flushed.is_set()
            out, _ = proc.communicate(timeout=120)
        finally:
            proc.kill()
            proc.wait()
        took = time.monotonic() - started
        holder.rollback()
    assert proc.returncode == 1, out
    assert took < 40, took
    assert "Traceback" not in out and len(out.strip().splitlines()) == 1, out
    assert "statement timeout" in out or "canceling statement" in out, out
    left = _ids(engine)
    # Everything before the locked row's day is gone; that day and after wait for next time.
    assert not {f"r{d}-{i}" for d in WEEKS if d < 203 for i in range(10)} & left
    assert "r203-0" in left
    # The lock is gone: the next run finishes the job.
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert _ids(engine) == _expected_left() | _flushed_ids(engine)
    engine.dispose()


def _flushed_ids(engine) -> set[str]:
    with engine.connect() as conn:
        c = schema.check_results
        return set(conn.execute(select(c.c.id).where(c.c.check == "ecc")).scalars())


def test_a_prune_of_an_empty_historian_deletes_nothing(historian):
    counts = prune(historian, NOW, Retention(days=400, rollup_days=30, jobs_days=400))
    assert set(counts.values()) == {0}
    with historian.connect() as conn:
        assert conn.execute(select(func.count()).select_from(schema.check_results)).scalar() == 0


def test_events_pruned_by_jobs_retention_are_not_read_again_from_slurm(tmp_path):
    """With jobs_retention_days set, prune deletes node events that ended before the cut; the
    nightly `ingest events` asked sacctmgr for every event since first_start (1970), which put
    them back for the next prune to delete again, every night. It now starts at the cut, which
    still lists an event that began before it and ended after it or is open."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    asked = tmp_path / "asked"
    sacctmgr = bindir / "sacctmgr"
    sacctmgr.write_text(f"#!/bin/sh\necho \"$@\" >> {asked}\n"
                        "echo 'Cluster|NodeName|TimeStart|TimeEnd|State|Reason|User'\n")
    sacctmgr.chmod(0o755)
    cfg = tmp_path / "config.toml"
    cfg.write_text("[historian]\njobs_retention_days = 30\n")
    env = dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}")
    db = f"sqlite:///{tmp_path / 'h.db'}"
    out = subprocess.run([sys.executable, "-m", "rsc_health.cli", "--config", str(cfg), "--db",
                          db, "ingest", "events"], env=env, capture_output=True, text=True,
                         cwd=REPO, timeout=120)
    assert out.returncode == 0, out.stderr
    start = next(a for a in asked.read_text().split() if a.startswith("Start="))
    asked_from = datetime.fromisoformat(start.removeprefix("Start="))
    cut = datetime.now(UTC).replace(tzinfo=None) - timedelta(days=30)
    assert abs((asked_from - cut).total_seconds()) < 120


def test_the_events_start_is_first_start_without_jobs_retention_or_when_later():
    now = datetime(2026, 11, 25, 12, 0, 0)
    assert Retention(jobs_days=0).events_start("1970-01-01T00:00:00", now) == \
        "1970-01-01T00:00:00"
    assert Retention(jobs_days=30).events_start("2026-11-20T00:00:00", now) == \
        "2026-11-20T00:00:00"
    assert Retention(jobs_days=30).events_start("1970-01-01T00:00:00", now) == \
        "2026-10-26T12:00:00"
    assert Retention(jobs_days=30).events_start("now-7days", now) == "now-7days"
