"""Migration 0006: the keys of jobs and job_nodes compared as bytes on PostgreSQL, every row
and every lookup kept; a database migrated from version 5 has the columns a new one gets."""

from __future__ import annotations

import shutil

import pytest
from sqlalchemy import text
from sqlalchemy.dialects import postgresql

from rsc_health.historian import db, schema

KEYS = {("jobs", "job_id"), ("jobs", "instance_key"), ("job_nodes", "node")}


def _collations(engine) -> dict[tuple[str, str], str | None]:
    with engine.connect() as conn:
        rows = conn.execute(text(
            "SELECT table_name, column_name, collation_name FROM information_schema.columns "
            "WHERE table_schema = 'public'")).all()
    return {(t, c): coll for t, c, coll in rows}


def _version_5(engine, tmp_path) -> None:
    old = tmp_path / "sql"
    old.mkdir()
    for f in db.MIGRATIONS_DIR.glob("*.sql"):
        if int(f.name[:4]) <= 5:
            shutil.copy(f, old / f.name)
    assert db.migrate(engine, 0, old)[-1] == 5


def _fill(engine) -> None:
    with engine.begin() as conn:
        for i, node in enumerate(["gpu-B1", "gpu-a1", "gpu-é"]):
            conn.execute(text(
                "INSERT INTO jobs (job_id, job_id_display, name, \"user\", partition, state, "
                "exit_code, submit, nnodes, gpus, nodelist, instance_key) VALUES "
                f"('{100 + i}', '{100 + i}', 'train|lr=3e-4', 'u', 'p', 'COMPLETED', '0:0', "
                f"'2024-03-01 00:00:00', 1, 8, '{node}', '{100 + i}:2024-03-01T00:00:00:')"))
            conn.execute(text(
                "INSERT INTO job_nodes (job_pk, node) SELECT id, :node FROM jobs "
                "WHERE job_id = :job"), {"node": node, "job": str(100 + i)})


@pytest.mark.postgres
def test_upgrade_from_version_5_makes_the_job_keys_bytewise_and_keeps_every_row(
        pg_url, tmp_path):
    engine = db.engine_for(pg_url)
    try:
        _version_5(engine, tmp_path)
        assert {k for k, c in _collations(engine).items() if c == "C"} == set()
        _fill(engine)
        assert db.migrate(engine, 5)[0] == 6
        assert db.current_version(engine) == schema.SCHEMA_VERSION
        assert {k for k, c in _collations(engine).items()
                if c == "C" and k[0] in ("jobs", "job_nodes")} == KEYS
        with engine.connect() as conn:
            nodes = conn.execute(text("SELECT node FROM job_nodes ORDER BY node")).scalars()
            # bytes: upper case before lower case, UTF-8's é after every ASCII letter
            assert list(nodes) == ["gpu-B1", "gpu-a1", "gpu-é"]
            joined = conn.execute(text(
                "SELECT j.job_id FROM jobs AS j JOIN job_nodes AS n ON n.job_pk = j.id "
                "WHERE n.node = 'gpu-é'")).scalars().all()
            assert joined == ["102"]
            # an equality join with a column of the database's own collation still works
            assert conn.execute(text(
                "SELECT count(*) FROM job_nodes AS n JOIN (VALUES ('gpu-a1'::text)) AS v(node) "
                "ON v.node = n.node")).scalar() == 1
    finally:
        engine.dispose()


@pytest.mark.postgres
def test_a_migrated_database_has_the_key_collations_of_a_new_one(pg_url, tmp_path):
    engine = db.engine_for(pg_url)
    try:
        _version_5(engine, tmp_path)
        db.migrate(engine, 5)
        migrated = {k for k, c in _collations(engine).items() if c == "C"}
    finally:
        engine.dispose()
    dialect = postgresql.dialect()
    declared = {
        (table.name, column.name)
        for table in schema.metadata.sorted_tables
        for column in table.columns
        if getattr(column.type.dialect_impl(dialect), "collation", None) == "C"
    }
    # Every key column a new database declares bytewise, the migrated one has too: the keys
    # 0006 changed and those of every later table (telemetry, step times, ...).
    assert migrated == declared and KEYS <= declared


def test_sqlite_only_moves_the_version(tmp_path):
    engine = db.engine_for(f"sqlite:///{tmp_path / 'h.db'}")
    try:
        _version_5(engine, tmp_path)
        assert db.migrate(engine, 5)[0] == 6
        assert db.current_version(engine) == schema.SCHEMA_VERSION
    finally:
        engine.dispose()
