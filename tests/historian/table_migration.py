"""A migration that adds a table: a historian at the version before keeps every row and ends
with the table a new historian has (test_migration_0020, test_migration_0021)."""

from __future__ import annotations

from sqlalchemy import inspect, text

from rsc_health.historian import db, schema


def shape(engine, table: str) -> tuple:
    insp = inspect(engine)
    return (sorted((c["name"], c["nullable"]) for c in insp.get_columns(table)),
            sorted(i["name"] for i in insp.get_indexes(table)),
            insp.get_pk_constraint(table)["constrained_columns"])


def check_upgrade_adds(request, tmp_path, dialect: str, table: str, *, drop: list[str],
                       version: int, steps: list[int]) -> None:
    """Drop `drop` (the table and what later versions add), stamp `version`, keep a row of
    another table; db.migrate runs `steps` and the table comes back as a new historian's."""
    url = (f"sqlite:///{tmp_path / 'old.db'}" if dialect == "sqlite"
           else request.getfixturevalue("pg_url"))
    old = db.connect(url, create_missing=True)
    new = (db.connect(f"sqlite:///{tmp_path / 'new.db'}", create_missing=True)
           if dialect == "sqlite" else None)
    try:
        expected = shape(new if new is not None else old, table)
        with old.begin() as conn:
            for name in drop:
                conn.exec_driver_sql(f"DROP TABLE {name}")
            conn.execute(schema.schema_version.update().values(version=version))
            conn.execute(text("INSERT INTO tickets (node, opened, reason, source) "
                              "VALUES ('gpu001', '2026-01-01 00:00:00', 'PSU', 'manual')"))
        assert db.migrate(old, version) == steps
        assert db.current_version(old) == schema.SCHEMA_VERSION
        assert shape(old, table) == expected
        with old.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM tickets")).scalar() == 1
    finally:
        old.dispose()
        if new is not None:
            new.dispose()
