"""Migration 0019 adds ix_check_results_check_status_time (check deployments by one index
probe a family) to a historian at version 18 that already holds check intervals: the rows
stay, the index is the one a new historian gets, and the deployments read through it are the
ones the old GROUP BY gave. On PostgreSQL it is built CONCURRENTLY, outside a transaction
(writers go on while it builds), and a run cut short after the index and before the version
row runs again cleanly."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from sqlalchemy import func, insert, inspect, select

from rsc_health.historian import db, schema
from rsc_health.historian.metrics.deployments import check_deployments

INDEX = "ix_check_results_check_status_time"
T0 = datetime(2025, 1, 1)


def _at_version_18(url: str):
    """A historian as version 18 left it: today's schema less the index and what later
    versions add (job_ends, 0020; job_starts, 0021), at version 18 (that the migrations build
    what schema.py creates is test_db's and test_migration_0002's)."""
    engine = db.connect(url, create_missing=True)
    with engine.begin() as conn:
        conn.exec_driver_sql(f"DROP INDEX {INDEX}")
        conn.exec_driver_sql("DROP TABLE job_ends")
        conn.exec_driver_sql("DROP TABLE job_starts")
        conn.execute(schema.schema_version.update().values(version=18))
    return engine


def _intervals() -> list[dict]:
    rows = []
    for k, (check, status, day) in enumerate(
        [(c, "ok", 0) for c in ("gpu", "xid", "ecc")]
        + [("nvlink", "fail", 3), ("nvlink", "ok", 5), ("mount", "warn", 6),
           ("ib_port", "ok", 9), ("ib_rate", "ok", 9)]  # two families deployed in one second
    ):
        for n in range(20):
            t = T0 + timedelta(days=day, minutes=n)
            rows.append(dict(id=f"r{k}-{n}", time=t if n else T0 + timedelta(days=day),
                             node=f"gpu{n:03d}", source="sweep", check=check, component="*",
                             status=status, severity="none", code="", reason="", last_seen=t,
                             is_open=False))
    return rows


def _group_by_first_ok(engine) -> list[tuple[str, datetime]]:
    """What check_deployments read before version 19: a GROUP BY over every ok row."""
    t = schema.check_results
    with engine.connect() as conn:
        start = conn.execute(select(func.min(t.c.time))).scalar()
        first = (select(t.c.check, func.min(t.c.time).label("time"))
                 .where(t.c.status == "ok").group_by(t.c.check).subquery())
        return [tuple(r) for r in conn.execute(
            select(first.c.check, first.c.time)
            .where(first.c.time >= start + timedelta(days=1))
            .order_by(first.c.time, first.c.check)).all()]


@pytest.mark.parametrize("dialect", ["sqlite", pytest.param("postgresql",
                                                            marks=pytest.mark.postgres)])
def test_upgrade_from_18_indexes_the_stored_intervals_and_deployments_read_the_same(
        dialect, tmp_path, request):
    url = (f"sqlite:///{tmp_path / 'old.db'}" if dialect == "sqlite"
           else request.getfixturevalue("pg_url"))
    old = _at_version_18(url)
    try:
        with old.begin() as conn:
            conn.execute(insert(schema.check_results), _intervals())
        before = _group_by_first_ok(old)
        assert [c for c, _ in before] == ["nvlink", "ib_port", "ib_rate"]

        assert db.migrate(old, 18) == [19, 20, 21]
        assert db.current_version(old) == schema.SCHEMA_VERSION == 21
        indexes = {ix["name"]: ix["column_names"]
                   for ix in inspect(old).get_indexes("check_results")}
        assert indexes[INDEX] == ["check", "status", "time"]
        with old.connect() as conn:
            assert conn.execute(select(func.count()).select_from(
                schema.check_results)).scalar() == len(_intervals())
        got = check_deployments(old)
        assert list(zip(got["check"], got["time"], strict=True)) == before

        if dialect == "postgresql":
            with old.connect() as conn:
                assert conn.exec_driver_sql(
                    "SELECT indisvalid FROM pg_index WHERE indexrelid = "
                    f"'{INDEX}'::regclass").scalar() is True
            # Cut short after the index, before the version row: the next upgrade runs the
            # file again, over the index it finds, and ends at 19 with one valid index.
            with old.begin() as conn:
                conn.execute(schema.schema_version.update().values(version=18))
                conn.exec_driver_sql("DROP TABLE job_ends")
                conn.exec_driver_sql("DROP TABLE job_starts")
            assert db.migrate(old, 18) == [19, 20, 21]
            with old.connect() as conn:
                assert conn.exec_driver_sql(
                    "SELECT count(*) FROM pg_index WHERE indisvalid AND indexrelid = "
                    f"'{INDEX}'::regclass").scalar() == 1
    finally:
        old.dispose()


def test_a_new_historian_has_the_index_too(tmp_path):
    engine = db.connect(f"sqlite:///{tmp_path / 'new.db'}", create_missing=True)
    try:
        names = {ix["name"] for ix in inspect(engine).get_indexes("check_results")}
        assert INDEX in names
    finally:
        engine.dispose()
