"""Migration 0007 (the node inventory) adds its table and keeps every row; the table it
builds takes what `ingest inventory` writes, on SQLite and PostgreSQL."""

from __future__ import annotations

import io
import shutil

from sqlalchemy import text

from rsc_health.historian import db, schema
from rsc_health.historian.ingest import inventory


def test_upgrade_from_version_6_adds_the_inventory_and_keeps_every_row(historian_url, tmp_path):
    old = tmp_path / "sql"
    old.mkdir()
    for f in db.MIGRATIONS_DIR.glob("*.sql"):
        if int(f.name[:4]) <= 6:
            shutil.copy(f, old / f.name)
    engine = db.engine_for(historian_url)
    try:
        assert db.migrate(engine, 0, old)[-1] == 6
        with engine.begin() as conn:
            conn.execute(text(
                'INSERT INTO node_events (node, start, "end", state, reason, source, cluster) '
                "VALUES ('n1', '2024-03-01 00:00:00', NULL, 'DOWN', 'x', 'sacctmgr', 'c')"))
        assert db.migrate(engine, 6)[0] == 7
        assert db.current_version(engine) == schema.SCHEMA_VERSION
        report = inventory.import_lines(engine, io.StringIO(
            "node,cluster,partition,from,to\nn1,c,p,2024-01-01T00:00:00,\n"))
        assert report.written == 1
        with engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM node_events")).scalar() == 1
            assert conn.execute(text(
                "SELECT node, cluster, partition FROM node_inventory")).all() == [
                ("n1", "c", "p")]
    finally:
        engine.dispose()
