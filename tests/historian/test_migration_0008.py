"""Migration 0008 adds the qualification tables; a database at version 6 keeps every row and
ends where a new one starts (same tables, columns and indexes as schema.py creates)."""

from __future__ import annotations

from sqlalchemy import inspect, text

from rsc_health.historian import db, schema


def _shape(engine, tables):
    insp = inspect(engine)
    return {t: (sorted((c["name"], c["nullable"]) for c in insp.get_columns(t)),
                sorted(i["name"] for i in insp.get_indexes(t)),
                sorted(insp.get_pk_constraint(t)["constrained_columns"])) for t in tables}


def test_upgrade_to_8_adds_the_qualification_tables_as_a_new_database_has_them(tmp_path):
    old_dir = tmp_path / "old"
    old_dir.mkdir()
    for mig in db.migrations("sqlite"):
        if mig.version <= 6:
            (old_dir / mig.path.name).write_text(mig.path.read_text())
    old = db.engine_for(f"sqlite:///{tmp_path / 'old.db'}")
    new = db.engine_for(f"sqlite:///{tmp_path / 'new.db'}")
    try:
        assert db.migrate(old, 0, old_dir)[-1] == 6
        with old.begin() as conn:
            conn.execute(text("INSERT INTO tickets (node, opened, reason, source) "
                              "VALUES ('gpu001', '2026-01-01 00:00:00', 'PSU', 'manual')"))
        applied = db.migrate(old, 6)
        assert 8 in applied and applied[-1] == schema.SCHEMA_VERSION
        db.create(new)
        tables = ("qualify_runs", "qualify_results")
        assert _shape(old, tables) == _shape(new, tables)
        with old.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM tickets")).scalar() == 1
    finally:
        old.dispose()
        new.dispose()
