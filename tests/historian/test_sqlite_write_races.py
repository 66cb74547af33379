"""Two processes that read and then write one SQLite file serialize: the second reads what the
first committed, never the state from before it.

pysqlite (the legacy transaction control of Python's sqlite3) sends no BEGIN before a SELECT,
so a transaction's reads ran outside it and its writes landed on top of whatever another
process had committed in between. A third connection holds SQLite's write lock so that, in the
old code, both processes have read before either writes: the race is made certain, not hoped for.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import select

from rsc_health import spool
from rsc_health.historian import schema
from rsc_health.historian.db import connect
from rsc_health.model import Finding, Severity, Status

REPO = Path(__file__).parents[2]
T0 = datetime(2024, 3, 1, 9, 0, tzinfo=UTC)
OK = Finding("ecc", "*", Status.OK, Severity.NONE, "clean")


def _fail(gpu: str) -> Finding:
    return Finding("ecc", gpu, Status.FAIL, Severity.DRAIN_NOW, "DBE", code="ecc_dbe")


# The child flushes its spool like `healthctl spool flush`, and leaves a mark once it has read
# the node's open intervals (so the parent knows both have read, in the old code).
_CHILD = """
import sys
from pathlib import Path
from rsc_health import cli
from rsc_health.historian import intervals
mark = Path(sys.argv[1])
real = intervals._load_open
def load_open(conn, nodes):
    out = real(conn, nodes)
    mark.touch()
    return out
intervals._load_open = load_open
sys.argv = ["healthctl", "--db", sys.argv[2], "spool", "flush", "--dir", sys.argv[3]]
cli.main()
"""


def _flush(url: str, spool_dir: Path, mark: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(mark), url, str(spool_dir)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)})


def _wait_for(paths: list[Path], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not all(p.exists() for p in paths) and time.monotonic() < deadline:
        time.sleep(0.05)


def _two_racing_spools(url: str, tmp_path: Path) -> tuple[Path, Path, list[Path]]:
    """gpu003's all-clear delivered; then two spools of its later runs (gpu0 failing at +5
    min, gpu1 failing at +10 min) to flush at once, and the marks each flush leaves once it
    has read."""
    first = tmp_path / "first"
    spool.append(first, spool.check_records([OK], node="gpu003", source="sweep", time=T0,
                                            job_id=None))
    assert _flush(url, first, tmp_path / "m0").wait(timeout=120) == 0
    older, newer = tmp_path / "older", tmp_path / "newer"
    spool.append(older, spool.check_records([_fail("gpu0")], node="gpu003", source="sweep",
                                            time=T0 + timedelta(minutes=5), job_id=None))
    spool.append(newer, spool.check_records([_fail("gpu1")], node="gpu003", source="sweep",
                                            time=T0 + timedelta(minutes=10), job_id=None))
    return older, newer, [tmp_path / "m1", tmp_path / "m2"]


def _open_ecc(url: str) -> list[tuple]:
    """gpu003's open ecc intervals: (component, status)."""
    engine = connect(url, create_missing=True)
    C = schema.check_results
    with engine.connect() as conn:
        open_ = conn.execute(select(C.c.component, C.c.status).where(
            C.c.node == "gpu003", C.c.check == "ecc", C.c.is_open.is_(True))).all()
    engine.dispose()
    return [tuple(r) for r in open_]


def test_two_flushes_of_one_node_at_once_leave_one_open_interval(tmp_path):
    """Two spool flushes carrying runs of the same node (the node's timer and an operator's
    `spool flush --dir` of a copied spool) at once: both read the node's open all-clear
    interval, both closed it, and each opened its own failure, so the node had two open
    failures (gpu0 from the older run, gpu1 from the newer) where its latest run said only
    gpu1 fails. Now the second waits for the first at BEGIN IMMEDIATE and folds on top of it."""
    url = f"sqlite:///{tmp_path / 'h.db'}"
    older, newer, marks = _two_racing_spools(url, tmp_path)
    holder = sqlite3.connect(tmp_path / "h.db", isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        procs = [_flush(url, older, marks[0]), _flush(url, newer, marks[1])]
        # The old code: both have read within seconds. The new: neither reads while the
        # holder has the write lock, so this waits the whole time and proves nothing either way.
        _wait_for(marks, 8)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert _open_ecc(url) == [("gpu1", "fail")]
    engine = connect(url, create_missing=True)
    with engine.connect() as conn:
        days = conn.execute(select(schema.check_days.c.fail)).scalars().all()
    engine.dispose()
    # Each failure that began is counted once, whichever flush went first.
    assert sum(days) in (1, 2)


@pytest.mark.postgres
def test_two_flushes_of_one_node_at_once_on_postgresql_leave_one_open_interval(pg_url, tmp_path):
    """The same race on PostgreSQL, whose READ COMMITTED lets both flushes read the node's
    open intervals before either writes (a holder's SHARE lock on check_results lets reads
    through and stops writes, to make it certain). A transaction-level advisory lock per node,
    taken before the read, now makes the second wait for the first."""
    import psycopg

    connect(pg_url, create_missing=True).dispose()
    older, newer, marks = _two_racing_spools(pg_url, tmp_path)
    libpq = pg_url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(libpq) as holder:
        holder.execute("LOCK TABLE check_results IN SHARE MODE")
        procs = [_flush(pg_url, older, marks[0]), _flush(pg_url, newer, marks[1])]
        _wait_for(marks, 8)
        holder.rollback()
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert _open_ecc(pg_url) == [("gpu1", "fail")]


def test_a_reader_is_not_held_by_a_writer_and_a_savepoint_nests(tmp_path):
    """Reads still begin deferred (WAL: a report never waits for a load), and a savepoint
    (begin_nested) is part of the transaction it is in: rolling the outer one back drops what
    the released savepoint wrote (pysqlite's own transaction control sent no BEGIN before
    SAVEPOINT, so the savepoint stood alone)."""
    from rsc_health.historian.db import writer

    url = f"sqlite:///{tmp_path / 'h.db'}"
    engine = connect(url, create_missing=True)
    holder = sqlite3.connect(tmp_path / "h.db", isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        started = time.monotonic()
        with engine.connect() as conn:
            assert conn.execute(select(schema.schema_version.c.version)).scalar()
        assert time.monotonic() - started < 5
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    T = schema.tickets
    with writer(engine).connect() as conn:
        outer = conn.begin()
        conn.execute(T.insert().values(node="n1", opened=T0.replace(tzinfo=None), reason="a"))
        with conn.begin_nested():
            conn.execute(T.insert().values(node="n2", opened=T0.replace(tzinfo=None), reason="b"))
        inner = conn.begin_nested()
        conn.execute(T.insert().values(node="n3", opened=T0.replace(tzinfo=None), reason="c"))
        inner.rollback()
        assert sorted(conn.execute(select(T.c.node)).scalars()) == ["n1", "n2"]
        outer.rollback()
    with engine.connect() as conn:
        assert conn.execute(select(T.c.node)).scalars().all() == []
    engine.dispose()


def test_two_lemon_runs_recording_one_node_at_once_on_postgresql_open_one_ticket(pg_url):
    """`lemons --apply` from the timer and an operator's at the same moment, on one node: both
    read "no open lemon ticket" before either wrote (a holder's SHARE lock on tickets makes it
    certain); one then failed on the action's key with a traceback. A per-node advisory lock
    taken before the read makes the second find the first's ticket and write nothing."""
    import threading

    import psycopg

    from rsc_health.historian.lemons.apply import _record
    from rsc_health.historian.lemons.verdicts import LemonVerdict

    engine = connect(pg_url, create_missing=True)
    verdict = LemonVerdict("gpu007", crossings=[], repeat_offender=True)
    reason = "rsc_health:lemon:repeat_offender:repeat offender"
    now = T0.replace(tzinfo=None)
    results: list = []

    def record():
        try:
            results.append(_record(engine, verdict, reason, now))
        except Exception as exc:  # noqa: BLE001 - the test reports what the run raised
            results.append(exc)

    libpq = pg_url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(libpq) as holder, psycopg.connect(libpq, autocommit=True) as watch:
        holder.execute("LOCK TABLE tickets IN SHARE MODE")
        threads = [threading.Thread(target=record) for _ in range(2)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and watch.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND datname = current_database()").fetchone()[0] < 2:
            time.sleep(0.05)
        holder.rollback()
        for t in threads:
            t.join(timeout=60)
    T = schema.tickets
    with engine.connect() as conn:
        opened = conn.execute(select(T.c.id).where(
            T.c.node == "gpu007", T.c.source == "lemon", T.c.closed.is_(None))).all()
    engine.dispose()
    assert sorted(map(repr, results)) == ["False", "True"], results
    assert len(opened) == 1


def test_a_historian_locked_past_the_busy_timeout_says_who_holds_it(monkeypatch, capsys):
    """`ticket open` (or any writer) that waited out SQLite's busy timeout behind a long load
    ends with one line that says what to do, not a bare OperationalError."""
    import sqlite3

    import pytest
    from sqlalchemy.exc import OperationalError

    from rsc_health import cli as cli_module

    def locked(**_):
        raise OperationalError("INSERT INTO tickets ...", {},
                               sqlite3.OperationalError("database is locked"))

    monkeypatch.setattr(cli_module, "cli", locked)
    monkeypatch.delenv("RSC_HEALTH_DEBUG", raising=False)
    with pytest.raises(SystemExit) as done:
        cli_module.main()
    err = capsys.readouterr().err
    assert done.value.code == 1 and len(err.strip().splitlines()) == 1
    assert "database is locked" in err and "run this again once it has finished" in err
