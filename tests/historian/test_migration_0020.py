"""Migration 0020 adds job_ends (when each node's epilog ran for a job, the spool's job_end
records): a historian at version 19 keeps every row and ends with the table a new one has."""

from __future__ import annotations

import pytest
from sqlalchemy import inspect, text

from rsc_health.historian import db, schema


def _shape(engine):
    insp = inspect(engine)
    return (sorted((c["name"], c["nullable"]) for c in insp.get_columns("job_ends")),
            sorted(i["name"] for i in insp.get_indexes("job_ends")),
            insp.get_pk_constraint("job_ends")["constrained_columns"])


@pytest.mark.parametrize("dialect", ["sqlite", pytest.param("postgresql",
                                                            marks=pytest.mark.postgres)])
def test_upgrade_from_19_adds_job_ends_as_a_new_historian_has_it(dialect, tmp_path, request):
    url = (f"sqlite:///{tmp_path / 'old.db'}" if dialect == "sqlite"
           else request.getfixturevalue("pg_url"))
    old = db.connect(url, create_missing=True)
    new = (db.connect(f"sqlite:///{tmp_path / 'new.db'}", create_missing=True)
           if dialect == "sqlite" else None)
    try:
        expected = _shape(new if new is not None else old)
        with old.begin() as conn:
            conn.exec_driver_sql("DROP TABLE job_ends")
            conn.exec_driver_sql("DROP TABLE job_starts")  # what 0021 adds
            conn.execute(schema.schema_version.update().values(version=19))
            conn.execute(text("INSERT INTO tickets (node, opened, reason, source) "
                              "VALUES ('gpu001', '2026-01-01 00:00:00', 'PSU', 'manual')"))
        assert db.migrate(old, 19) == [20, 21]
        assert db.current_version(old) == schema.SCHEMA_VERSION
        assert _shape(old) == expected
        with old.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM tickets")).scalar() == 1
    finally:
        old.dispose()
        if new is not None:
            new.dispose()
