"""A PostgreSQL that freezes never holds a command: a lock held elsewhere ends at the server's
statement timeout, a server that stops answering altogether (SIGSTOP: the port still accepts,
nothing answers) ends at the client's bound, and the operator sees one line, exit 1.

A private PostgreSQL cluster (Debian's initdb and pg_ctl, run as the postgres user) is started
for this module, so freezing it disturbs no other test.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import text

from rsc_health.historian import db as hdb
from tests.ports import free_port as _free_port

PG_BIN = sorted(Path("/usr/lib/postgresql").glob("*/bin"))
REPO = Path(__file__).resolve().parents[2]




class PrivatePostgres:
    def __init__(self, base: Path):
        self.bin = PG_BIN[-1]
        self.data = base / "data"
        self.port = _free_port()
        self.url = f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"
        self.frozen: list[int] = []

    def _as_postgres(self, *argv: str) -> None:
        cmd = [str(a) for a in argv]
        if os.geteuid() == 0:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        subprocess.run(cmd, check=True, capture_output=True, timeout=120)

    def start(self) -> None:
        self.data.parent.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            shutil.chown(self.data.parent, "postgres")
        self._as_postgres(self.bin / "initdb", "-D", self.data, "-A", "trust", "-U", "postgres")
        self._as_postgres(self.bin / "pg_ctl", "-D", self.data, "-w", "-l",
                          self.data.parent / "log", "-o",
                          f"-p {self.port} -k {self.data.parent} -c listen_addresses=127.0.0.1",
                          "start")

    def processes(self) -> list[int]:
        postmaster = int((self.data / "postmaster.pid").read_text().split()[0])
        children = subprocess.run(["pgrep", "-P", str(postmaster)], capture_output=True,
                                  text=True).stdout.split()
        return [postmaster, *map(int, children)]

    def freeze(self) -> None:
        self.frozen = self.processes()
        for pid in self.frozen:
            os.kill(pid, signal.SIGSTOP)

    def thaw(self) -> None:
        for pid in self.frozen:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        self.frozen = []

    def stop(self) -> None:
        self.thaw()
        self._as_postgres(self.bin / "pg_ctl", "-D", self.data, "-m", "immediate", "stop")


@pytest.fixture(scope="module")
def private_pg():
    if not PG_BIN or not shutil.which("pgrep"):
        pytest.fail("PostgreSQL server binaries are missing: run scripts/install --test")
    # Not under pytest's tmp dir: the postgres user must be able to reach its data directory.
    base = Path(tempfile.mkdtemp(prefix="rsc-health-pg-"))
    base.chmod(0o755)
    pg = PrivatePostgres(base / "cluster")
    try:
        pg.start()
        yield pg
    finally:
        pg.stop()
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def thawed(private_pg):
    yield private_pg
    private_pg.thaw()


def test_a_server_that_freezes_mid_statement_ends_it_at_the_client_bound(thawed):
    engine = hdb.connect(thawed.url, statement_timeout_s=1, create_missing=True)
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
            thawed.freeze()
            started = time.monotonic()
            with pytest.raises(hdb.HistorianFrozen):
                conn.execute(text("SELECT 2"))
            took = time.monotonic() - started
        assert took < 10  # 1 s on the server's clock, as long again on the client's
    finally:
        thawed.thaw()
        engine.dispose()


def test_a_statement_after_a_frozen_one_runs_on_a_fresh_connection(thawed):
    engine = hdb.connect(thawed.url, statement_timeout_s=1, create_missing=True)
    with engine.connect() as conn:
        thawed.freeze()
        with pytest.raises(hdb.HistorianFrozen):
            conn.execute(text("SELECT 2"))
    thawed.thaw()
    with engine.connect() as conn:
        assert conn.execute(text("SELECT 3")).scalar() == 3
    engine.dispose()


def _healthctl(url: str, tmp_path: Path, *args: str, timeout_s: float = 60):
    cfg = tmp_path / "site.toml"
    cfg.write_text("[historian]\nstatement_timeout_s = 2\n")
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "rsc_health.cli", "--config", str(cfg), "--db", url, *args],
        capture_output=True, text=True, timeout=timeout_s, cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)})
    return proc, time.monotonic() - started


def test_a_lock_held_elsewhere_ends_a_command_at_the_statement_timeout(thawed, tmp_path):
    engine = hdb.connect(thawed.url, create_missing=True)  # creates the schema
    with engine.connect() as holder:
        holder.execute(text("LOCK TABLE jobs IN ACCESS EXCLUSIVE MODE"))
        proc, took = _healthctl(thawed.url, tmp_path, "lemons")
        holder.rollback()
    engine.dispose()

    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "statement timeout" in proc.stderr
    assert took < 30


def _wait_for_a_lock_waiter(conn, within_s: float = 60) -> None:
    deadline = time.monotonic() + within_s
    query = text("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'")
    # The holder's transaction caches its view of pg_stat_activity: clear it on every look.
    while conn.execute(text("SELECT pg_stat_clear_snapshot()")) and \
            conn.execute(query).scalar() == 0:
        assert time.monotonic() < deadline, "the command never reached the locked table"
        time.sleep(0.1)


def test_a_server_frozen_while_a_command_waits_ends_it_with_one_line(thawed, tmp_path):
    """The command's statement waits on a lock; then the whole server freezes, so its own
    timeout cannot fire: the client's bound ends the command."""
    engine = hdb.connect(thawed.url, create_missing=True)
    with engine.connect() as holder:
        holder.execute(text("LOCK TABLE jobs IN ACCESS EXCLUSIVE MODE"))
        cfg = tmp_path / "site.toml"
        cfg.write_text("[historian]\nstatement_timeout_s = 3\n")
        started = time.monotonic()
        proc = subprocess.Popen(
            [sys.executable, "-m", "rsc_health.cli", "--config", str(cfg), "--db", thawed.url,
             "lemons"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)})
        _wait_for_a_lock_waiter(holder)
        thawed.freeze()
        try:
            out, err = proc.communicate(timeout=60)
        finally:
            thawed.thaw()
        took = time.monotonic() - started
        holder.rollback()
    engine.dispose()

    assert proc.returncode == 1
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "stopped answering" in err
    assert took < 60


# The child flushes a spool like `healthctl spool flush`, with the flush's statement timeout at
# 2 s (the shipped 60 s would make the test wait minutes), and SIGSTOPs the one backend that
# serves its connection as its first COMMIT goes out: storage that hangs at COMMIT (a full or
# frozen disk under the WAL's fsync) looks the same from the client.
_FREEZE_AT_COMMIT = """
import os, signal, sys
from pathlib import Path
from sqlalchemy import event
from sqlalchemy.engine import Engine
from rsc_health import cli
from rsc_health.historian.ingest import delivery
delivery.FLUSH_STATEMENT_TIMEOUT_S = 2
pid_file = Path(sys.argv[1])

@event.listens_for(Engine, "commit")
def freeze(conn):
    if not pid_file.exists():
        pid = conn.connection.driver_connection.info.backend_pid
        pid_file.write_text(str(pid))
        os.kill(pid, signal.SIGSTOP)

sys.argv = ["healthctl", "--db", sys.argv[2], "spool", "flush", "--dir", sys.argv[3]]
cli.main()
"""


def _spooled_checks(spool_dir: Path) -> int:
    from datetime import UTC, datetime, timedelta

    from rsc_health import spool
    from rsc_health.model import Finding, Severity, Status

    t0 = datetime(2024, 3, 1, 9, 0, tzinfo=UTC)
    records = []
    for i in range(6):
        gpu = Finding("ecc", f"gpu{i % 2}", Status.FAIL, Severity.DRAIN_NOW, "DBE", code="dbe")
        records += spool.check_records([gpu], node=f"n{i:03d}", source="sweep",
                                       time=t0 + timedelta(minutes=i), job_id=None)
    spool.append(spool_dir, records)
    return len(records)


def test_a_database_frozen_at_commit_ends_the_flush_in_bounded_time(private_pg, tmp_path):
    """SQLAlchemy fires no cursor event for COMMIT, so the client's bound never covered it: a
    backend that stopped answering at COMMIT held `spool flush` (a node's timer) until systemd
    gave up. Now it ends at the bound with one line, the batch stays in the spool (whether the
    COMMIT landed is unknown until the server answers), and the next flush lands every record
    once either way."""
    from sqlalchemy import func, select

    from rsc_health.historian import schema

    url = private_pg.url.rsplit("/", 1)[0] + "/ht_commit"
    admin = hdb.engine_for(private_pg.url).execution_options(isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text("DROP DATABASE IF EXISTS ht_commit"))
        conn.execute(text("CREATE DATABASE ht_commit"))
    # the schema, so the flush's first COMMIT is its chunk's
    hdb.connect(url, create_missing=True).dispose()
    spool_dir = tmp_path / "spool"
    written = _spooled_checks(spool_dir)
    pid_file = tmp_path / "backend.pid"
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-c", _FREEZE_AT_COMMIT, str(pid_file), url,
                             str(spool_dir)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        out, err = proc.communicate(timeout=45)
        took = time.monotonic() - started
    finally:
        proc.kill()
        if pid_file.exists():
            os.kill(int(pid_file.read_text()), signal.SIGCONT)
    assert pid_file.exists(), err
    assert proc.returncode == 1, (out, err)
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "COMMIT" in err and "stay in" in err, err
    assert took < 30
    assert list(spool_dir.glob("batch-*")), "the batch must wait for the next flush"

    flushed = subprocess.run(
        [sys.executable, "-m", "rsc_health.cli", "--db", url, "spool", "flush", "--dir",
         str(spool_dir)], capture_output=True, text=True, timeout=120, cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)})
    assert flushed.returncode == 0, flushed.stderr
    engine = hdb.connect(url, create_missing=True)
    with engine.connect() as conn:
        rows = conn.execute(select(func.count()).select_from(schema.check_results)).scalar()
    engine.dispose()
    assert rows == written
    with admin.connect() as conn:
        conn.execute(text("DROP DATABASE ht_commit WITH (FORCE)"))
    admin.dispose()


def test_a_rollback_that_meets_a_frozen_backend_ends_at_the_client_bound(private_pg):
    engine = hdb.connect(private_pg.url, statement_timeout_s=1, create_missing=True)
    pid = None
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
            pid = conn.connection.driver_connection.info.backend_pid
            os.kill(pid, signal.SIGSTOP)
            # Without a bound the ROLLBACK waits for ever: thaw it after 20 s, so that the
            # test fails on the time it took instead of hanging.
            watchdog = threading.Timer(20, os.kill, (pid, signal.SIGCONT))
            watchdog.start()
            started = time.monotonic()
            try:
                with pytest.raises(hdb.HistorianFrozen):
                    conn.rollback()
            finally:
                watchdog.cancel()
            assert time.monotonic() - started < 10
    finally:
        if pid is not None:
            os.kill(pid, signal.SIGCONT)
        engine.dispose()
