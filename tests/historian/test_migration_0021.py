"""Migration 0021 adds job_starts (when each node's prolog ran for a job of two or more nodes,
the spool's job_start records): a historian at version 20 keeps every row and ends with the
table a new one has."""

from __future__ import annotations

import pytest
from sqlalchemy import inspect, text

from rsc_health.historian import db, schema


def _shape(engine):
    insp = inspect(engine)
    return (sorted((c["name"], c["nullable"]) for c in insp.get_columns("job_starts")),
            sorted(i["name"] for i in insp.get_indexes("job_starts")),
            insp.get_pk_constraint("job_starts")["constrained_columns"])


@pytest.mark.parametrize("dialect", ["sqlite", pytest.param("postgresql",
                                                            marks=pytest.mark.postgres)])
def test_upgrade_from_20_adds_job_starts_as_a_new_historian_has_it(dialect, tmp_path, request):
    url = (f"sqlite:///{tmp_path / 'old.db'}" if dialect == "sqlite"
           else request.getfixturevalue("pg_url"))
    old = db.connect(url, create_missing=True)
    new = (db.connect(f"sqlite:///{tmp_path / 'new.db'}", create_missing=True)
           if dialect == "sqlite" else None)
    try:
        expected = _shape(new if new is not None else old)
        with old.begin() as conn:
            conn.exec_driver_sql("DROP TABLE job_starts")
            conn.execute(schema.schema_version.update().values(version=20))
            conn.execute(text("INSERT INTO tickets (node, opened, reason, source) "
                              "VALUES ('gpu001', '2026-01-01 00:00:00', 'PSU', 'manual')"))
        assert db.migrate(old, 20) == [21]
        assert db.current_version(old) == schema.SCHEMA_VERSION
        assert _shape(old) == expected
        with old.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM tickets")).scalar() == 1
    finally:
        old.dispose()
        if new is not None:
            new.dispose()
