"""Opening, versioning and migrating the historian database."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import insert, select, text

from rsc_health.historian import db, schema
from rsc_health.historian.db import (
    HistorianUnavailable,
    SchemaTooNew,
    connect,
    migrate,
    render_ddl,
)


def test_new_database_gets_the_schema_and_version(historian):
    assert db.current_version(historian) == schema.SCHEMA_VERSION
    assert set(db.table_counts(historian)) == {t.name for t in schema.metadata.sorted_tables}


def test_sqlite_runs_in_wal_with_foreign_keys(tmp_path):
    engine = connect(f"sqlite:///{tmp_path / 'h.db'}", create_missing=True)
    with engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == db.SQLITE_BUSY_TIMEOUT_MS
    engine.dispose()


def test_a_newer_schema_is_refused(historian_url, historian):
    with historian.begin() as conn:
        conn.execute(schema.schema_version.delete())
        conn.execute(insert(schema.schema_version).values(version=schema.SCHEMA_VERSION + 1))
    with pytest.raises(SchemaTooNew, match="newer than this release"):
        connect(historian_url, create_missing=True)


def test_database_down_is_a_clear_error_without_the_password():
    url = "postgresql+psycopg://rsc:s3cret@127.0.0.1:1/history"
    with pytest.raises(HistorianUnavailable) as info:
        connect(url, create_missing=True)
    assert "127.0.0.1:1/history" in str(info.value)
    assert "s3cret" not in str(info.value)


def test_unwritable_sqlite_path_is_unavailable(tmp_path):
    with pytest.raises(HistorianUnavailable, match="no-such-dir"):
        connect(f"sqlite:///{tmp_path / 'no-such-dir' / 'h.db'}", create_missing=True)


def test_upgrade_applies_a_v2_migration_file_and_keeps_rows(historian, tmp_path, monkeypatch):
    with historian.begin() as conn:
        conn.execute(
            insert(schema.tickets).values(
                node="gpu001", opened=text("CURRENT_TIMESTAMP"), reason="xid79"
            )
        )
    migrations = tmp_path / "sql"
    migrations.mkdir()
    for f in db.MIGRATIONS_DIR.glob("*.sql"):
        (migrations / f.name).write_text(f.read_text())
    nxt = schema.SCHEMA_VERSION + 1
    (migrations / f"{nxt:04d}_ticket_owner.sql").write_text(
        "-- who works on the ticket\nALTER TABLE tickets ADD COLUMN owner VARCHAR(64);\n"
    )
    monkeypatch.setattr(schema, "SCHEMA_VERSION", nxt)
    assert migrate(historian, nxt - 1, migrations) == [nxt]
    assert db.current_version(historian) == nxt
    with historian.connect() as conn:
        rows = conn.execute(text("SELECT node, reason, owner FROM tickets")).all()
    assert rows == [("gpu001", "xid79", None)]
    # a second upgrade has nothing left to do
    assert migrate(historian, nxt, migrations) == []


def test_healthctl_db_upgrade_keeps_rows(historian_url, historian):
    from click.testing import CliRunner

    from rsc_health.cli import cli

    with historian.begin() as conn:
        conn.execute(insert(schema.ingest_cursors).values(name="sacct", value="2024-01-01"))
    runner = CliRunner()
    result = runner.invoke(cli, ["--db", historian_url, "db", "upgrade"])
    assert result.exit_code == 0, result.output
    assert "nothing to do" in result.output
    status = runner.invoke(cli, ["--db", historian_url, "db", "status", "--json"])
    assert (
        f'"version": {schema.SCHEMA_VERSION}' in status.output
        and '"ingest_cursors": 1' in status.output
    )
    with historian.connect() as conn:
        assert conn.execute(select(schema.ingest_cursors.c.value)).scalar() == "2024-01-01"


def _statements(ddl: str) -> dict[str, str]:
    """CREATE statements by the table or index they create."""
    out = {}
    for stmt in ddl.split(";"):
        stmt = stmt.strip()
        words = stmt.split()
        if stmt.startswith("CREATE TABLE"):
            out[words[2]] = stmt
        elif stmt.startswith("CREATE INDEX") or stmt.startswith("CREATE UNIQUE INDEX"):
            out[words[words.index("INDEX") + 1]] = stmt
    return out


def test_initial_migration_file_for_postgresql_is_still_the_ddl_of_schema_py():
    """0001 was generated from schema.py (render_ddl). Every table and index a later
    migration did not change is still exactly what schema.py renders; the changed ones are
    guarded by test_migration_0002's check that the migrations build what schema.py creates.
    Changed since: jobs and node_events (version 4: cluster), check_results, node_actions and
    attributions (version 5: intervals, whole record ids), job_nodes (version 6: its node
    compared as bytes), job_exclusions (version 17: keyed by the job instance)."""
    changed = {"jobs", "node_events", "check_results", "node_actions", "attributions",
               "job_nodes", "ix_job_nodes_node", "job_exclusions"}
    initial = _statements((db.MIGRATIONS_DIR / "0001_initial.postgresql.sql").read_text())
    current = _statements(render_ddl("postgresql"))
    kept = {name: stmt for name, stmt in initial.items() if name not in changed}
    assert len(kept) >= 8
    assert {name: current.get(name) for name in kept} == kept


def test_initial_migration_builds_the_same_tables_as_schema_py(tmp_path):
    engine = db.engine_for(f"sqlite:///{tmp_path / 'm.db'}")
    migrate(engine, 0)
    assert db.current_version(engine) == schema.SCHEMA_VERSION
    assert set(db.table_counts(engine)) == {t.name for t in schema.metadata.sorted_tables}
    engine.dispose()


def _upgrade_with_file_limit(url: str, limit: int) -> subprocess.CompletedProcess:
    """`healthctl db upgrade` whose files may not grow past `limit` bytes (RLIMIT_FSIZE, with
    SIGXFSZ ignored: a write past it fails as on a full disk), as the operator runs it."""
    import resource
    import signal

    def cap() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return subprocess.run(
        [sys.executable, "-m", "rsc_health.cli", "--db", url, "db", "upgrade"],
        preexec_fn=cap, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])})


def test_a_create_cut_short_by_a_full_disk_leaves_nothing_the_rerun_trips_on(tmp_path):
    """pysqlite commits each CREATE TABLE on its own (it opens a transaction only before an
    INSERT), so a disk that filled while the schema was written left every table and no
    version row: every later `db upgrade` then failed "table check_results already exists"
    for ever. The schema and its version are now one transaction: a failed create leaves an
    empty database, and the rerun on a disk with room creates it."""
    failed = 0
    for limit in range(40_000, 440_000, 40_000):
        path = tmp_path / f"h{limit}.db"
        url = f"sqlite:///{path}"
        cut = _upgrade_with_file_limit(url, limit)
        if cut.returncode == 0:
            continue
        failed += 1
        assert cut.stderr.count("\n") == 1 and "Traceback" not in cut.stderr, cut.stderr
        engine = db.connect(url, upgrade=True, create_missing=True)  # the rerun, with room
        try:
            assert db.current_version(engine) == schema.SCHEMA_VERSION
        finally:
            engine.dispose()
    assert failed >= 2  # the limits did cut creates short (else this proved nothing)


def _at_19(url):
    from rsc_health.historian import db, schema

    engine = db.connect(url, create_missing=True)
    with engine.begin() as conn:
        conn.exec_driver_sql("DROP TABLE job_starts")
        conn.exec_driver_sql("DROP TABLE job_ends")
        conn.execute(schema.schema_version.update().values(version=19))
    engine.dispose()


def _upgrades_after_both_read(url, monkeypatch, migrate=None) -> dict:
    """Two `db upgrade` in threads A and B that have both read the schema version before
    either migrates (as two processes can); `migrate`, when given, stands in for db.migrate.
    {thread name: what its upgrade returned or raised}."""
    import threading

    from rsc_health.historian import db

    real, real_migrate = db.current_version, db.migrate
    both_read, seen = threading.Barrier(2), threading.local()

    def read_then_wait(engine):
        version = real(engine)
        if not getattr(seen, "once", False):
            seen.once = True
            both_read.wait(30)
        return version

    monkeypatch.setattr(db, "current_version", read_then_wait)
    if migrate is not None:
        monkeypatch.setattr(db, "migrate", migrate)
    out: dict = {}

    def run(name):
        try:
            out[name] = db.upgrade(url)
        except Exception as exc:  # noqa: BLE001 - what the loser says is the point
            out[name] = exc

    threads = [threading.Thread(target=run, args=(n,), name=n) for n in "AB"]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    monkeypatch.setattr(db, "current_version", real)
    monkeypatch.setattr(db, "migrate", real_migrate)
    return out


def test_two_upgrades_at_once_on_sqlite_one_migrates_and_the_other_says_so(tmp_path,
                                                                           monkeypatch):
    """Two `db upgrade` at once (two operators, two config-management runs) both read the old
    version; the second's first migration then failed on the first's tables, said as "is
    unavailable: table job_ends already exists" (helper-125). On SQLite one runs at a time:
    the second, while the first migrates, says another upgrade holds the lock; one started
    after finds nothing to do."""
    import threading

    from rsc_health.historian import db, schema

    url = f"sqlite:///{tmp_path / 'history.db'}"
    _at_19(url)
    real, migrating, done = db.migrate, threading.Event(), threading.Event()

    def slow_migrate(eng, version):
        migrating.set()
        assert done.wait(30)
        return real(eng, version)

    monkeypatch.setattr(db, "migrate", slow_migrate)
    out: dict = {}
    first = threading.Thread(target=lambda: out.setdefault("first", db.upgrade(url)))
    first.start()
    assert migrating.wait(30)
    with pytest.raises(db.RunInProgress, match="another upgrade run holds"):
        db.upgrade(url)
    done.set()
    first.join(60)
    assert out["first"] == (19, schema.SCHEMA_VERSION, [20, 21])
    monkeypatch.setattr(db, "migrate", real)
    assert db.upgrade(url) == (schema.SCHEMA_VERSION, schema.SCHEMA_VERSION, [])


@pytest.mark.postgres
def test_two_upgrades_at_once_on_postgresql_the_loser_says_another_ran(pg_url, monkeypatch):
    """Both read version 19 before either migrates (as two processes can): the loser's first
    migration failed on the winner's table as a raw UniqueViolation (helper-125). It now says
    another upgrade ran at the same time; the historian ends at the release's version."""
    from rsc_health.historian import db, schema

    _at_19(pg_url)
    out = _upgrades_after_both_read(pg_url, monkeypatch)
    errors = [v for v in out.values() if isinstance(v, Exception)]
    wins = [v for v in out.values() if not isinstance(v, Exception)]
    assert len(errors) <= 1 and wins, out
    for err in errors:
        assert isinstance(err, db.RunInProgress), f"{type(err).__name__}: {err}"
        assert "another db upgrade ran" in str(err)
    engine = db.engine_for(pg_url)
    assert db.current_version(engine) == schema.SCHEMA_VERSION
    engine.dispose()


@pytest.mark.postgres
@pytest.mark.parametrize("through", ["direct", "pgbouncer"])
def test_db_upgrade_from_18_on_postgresql_finishes(pg_url, through):
    """`db upgrade`, not `migrate`, from version 18: 0019's CREATE INDEX CONCURRENTLY waits for
    every older snapshot, and a lock the upgrade held in an open transaction made it wait on
    itself for ever, directly and through PgBouncer (helper-130, on the first fix for two
    upgrades at once)."""
    import threading

    from rsc_health.historian import db, schema
    from tests.historian import pgbouncer
    from tests.historian.test_migration_0019 import _at_version_18

    _at_version_18(pg_url).dispose()

    def run(url):
        out: dict = {}

        def go():
            try:
                out["r"] = db.upgrade(url)
            except Exception as exc:  # noqa: BLE001
                out["e"] = exc

        t = threading.Thread(target=go, daemon=True)
        t.start()
        t.join(45)
        assert not t.is_alive(), "db upgrade from 18 still running after 45 s"
        assert "e" not in out, repr(out.get("e"))
        assert out["r"] == (18, schema.SCHEMA_VERSION, [19, 20, 21])

    if through == "direct":
        run(pg_url)
    else:
        if not pgbouncer.available():
            pytest.skip("no pgbouncer")
        with pgbouncer.pgbouncer(pg_url) as bounced:
            run(bounced)


@pytest.mark.postgres
def test_two_upgrades_from_18_on_postgresql_end_at_the_release_version(pg_url, monkeypatch):
    """Both read 18; the second starts its migrations after the first has finished them. 0019
    runs outside a transaction and may be run again, so the second did not fail there: it
    rebuilt the first's index and wrote version 19 over its 21, and every later upgrade then
    failed on "relation job_ends already exists" (helper-134). A migration now starts only
    from the version it read; the second says another upgrade ran, and the historian stays
    at the release's version, a later upgrade finding nothing to do."""
    import threading

    from rsc_health.historian import db, schema
    from tests.historian.test_migration_0019 import _at_version_18

    _at_version_18(pg_url).dispose()
    real_migrate, first_done = db.migrate, threading.Event()

    def migrate_in_turn(engine, version, *args, **kwargs):
        if threading.current_thread().name == "B":
            assert first_done.wait(60)
        try:
            return real_migrate(engine, version, *args, **kwargs)
        finally:
            if threading.current_thread().name == "A":
                first_done.set()

    out = _upgrades_after_both_read(pg_url, monkeypatch, migrate_in_turn)
    assert out["A"] == (18, schema.SCHEMA_VERSION, [19, 20, 21]), out
    assert isinstance(out["B"], db.RunInProgress), out
    engine = db.engine_for(pg_url)
    assert db.current_version(engine) == schema.SCHEMA_VERSION
    engine.dispose()
    assert db.upgrade(pg_url) == (schema.SCHEMA_VERSION, schema.SCHEMA_VERSION, [])
