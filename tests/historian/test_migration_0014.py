"""Migration 0014 adds the columns of four telemetry metrics (nvlink_data_rate, remapped_rows,
remap_low_banks, ib_error_rate) to the samples and both rollup tables: a database at version
13 keeps its samples and rollups and ends as a new one starts, on SQLite and PostgreSQL; the
new metrics flow from a node's spool record to samples, rollups and the node view."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from sqlalchemy import inspect, text

from rsc_health import spool
from rsc_health.config import load_config
from rsc_health.historian import db, schema
from rsc_health.historian.ingest.delivery import deliver
from rsc_health.historian.telemetry import latest_rollups, load_samples, rollup
from rsc_health.model import ROLLED_UP, Metric

TABLES = ("telemetry_samples", "telemetry_job_rollups", "telemetry_day_rollups")
NEW = (Metric.NVLINK_DATA_RATE, Metric.REMAPPED_ROWS, Metric.REMAP_LOW_BANKS,
       Metric.IB_ERROR_RATE)
CFG = load_config(None)


def _shape(engine):
    insp = inspect(engine)
    return {t: (sorted((c["name"], c["nullable"], str(c["type"])) for c in insp.get_columns(t)),
                sorted(i["name"] for i in insp.get_indexes(t)),
                sorted(insp.get_pk_constraint(t)["constrained_columns"])) for t in TABLES}


def _old_dir(tmp_path, dialect):
    old_dir = tmp_path / "old"
    old_dir.mkdir()
    for mig in db.migrations(dialect):
        if mig.version <= 13:
            (old_dir / mig.path.name).write_text(mig.path.read_text())
    return old_dir


def _keep_a_sample(engine):
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO telemetry_samples (time, node, gpu_temp_c, gpu_temp_c_c) "
                          "VALUES ('2026-11-20 00:00:00', 'gpu001', 61.5, 'gpu2')"))


def _kept(engine):
    with engine.connect() as conn:
        return conn.execute(text("SELECT node, gpu_temp_c, gpu_temp_c_c, ib_error_rate "
                                 "FROM telemetry_samples")).all()


def test_upgrade_from_13_adds_the_columns_as_a_new_database_has_them(tmp_path):
    old = db.engine_for(f"sqlite:///{tmp_path / 'old.db'}")
    new = db.engine_for(f"sqlite:///{tmp_path / 'new.db'}")
    try:
        assert db.migrate(old, 0, _old_dir(tmp_path, "sqlite"))[-1] == 13
        _keep_a_sample(old)
        assert db.migrate(old, 13)[0] == 14
        db.create(new)
        assert _shape(old) == _shape(new)
        assert _kept(old) == [("gpu001", 61.5, "gpu2", None)]
    finally:
        old.dispose()
        new.dispose()


@pytest.mark.postgres
def test_upgrade_from_13_on_postgresql_matches_a_new_database(pg_url, tmp_path):
    from sqlalchemy import create_engine

    old = db.engine_for(pg_url)
    admin = create_engine(pg_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{old.url.database}_new"')
    new = db.engine_for(old.url.set(database=f"{old.url.database}_new")
                        .render_as_string(hide_password=False))
    try:
        db.migrate(old, 0, _old_dir(tmp_path, "postgresql"))
        _keep_a_sample(old)
        assert db.migrate(old, 13)[0] == 14
        db.create(new)
        assert _shape(old) == _shape(new)
        assert ("nvlink_data_rate", True, "REAL") in _shape(old)["telemetry_samples"][0]
        assert _kept(old) == [("gpu001", 61.5, "gpu2", None)]
    finally:
        old.dispose()
        new.dispose()
        with admin.connect() as conn:
            conn.exec_driver_sql(
                f'DROP DATABASE IF EXISTS "{old.url.database}_new" WITH (FORCE)')
        admin.dispose()


def test_the_new_metrics_land_roll_up_and_show_in_the_node_view(historian, tmp_path):
    """A day of a node's sweeps outside jobs with the four metrics: the samples keep all four,
    the day's rollup holds the two rates (the levels are not rolled up: model.LEVELS) and
    counts the IB error sweeps past warn_above (0.07/s: the link's own physical errors), and
    the node view reads them back."""
    day = datetime(2026, 11, 20)
    records = []
    for i in range(288):
        low = 2.0 if i >= 276 else 0.0  # the last hour: two banks low on spare rows
        ib = 4.0 if i >= 276 else 0.01  # and a port's errors at 4/s
        records.append(spool.record(
            "telemetry", "gpu007", day + timedelta(minutes=5 * i), source="sweep",
            job_id=None, interval_s=300.0, metrics={
                "nvlink_data_rate": {"value": 4.0e10 + i, "component": "gpu1"},
                "remapped_rows": {"value": 11.0, "component": "gpu4"},
                "remap_low_banks": {"value": low, "component": "gpu4"},
                "ib_error_rate": {"value": ib, "component": "mlx5_6/1"}}))
    sdir = tmp_path / "spool"
    spool.append(sdir, records)
    assert deliver(historian, sdir).delivered.get("telemetry") == 288
    frame = load_samples(historian, day, day + timedelta(days=1), nodes=["gpu007"])
    assert set(frame["metric"]) == {m.value for m in NEW}
    report = rollup(historian, day + timedelta(days=1, hours=2), CFG)
    assert report.day_rows == 1
    got = latest_rollups(historian, "gpu007", CFG)["day"]["metrics"]
    assert set(got) == {m.value for m in NEW if m in ROLLED_UP} == {
        "nvlink_data_rate", "ib_error_rate"}
    assert Metric.REMAP_LOW_BANKS.value not in got and Metric.REMAPPED_ROWS.value not in got
    ib = got[Metric.IB_ERROR_RATE.value]
    assert (ib["n"], ib["past"], ib["max"], ib["worst"], ib["limit"]) == (
        288, 12, 4.0, "mlx5_6/1", 0.07)
    assert load_samples(historian, day, day + timedelta(days=1), nodes=["gpu007"]).query(
        "metric == 'remap_low_banks'")["value"].max() == 2.0
    unlined = got[Metric.NVLINK_DATA_RATE.value]  # no line: peers judge it, nothing counted
    assert (unlined["limit"], unlined["past"], unlined["past_frac"]) == (None, None, None)
    assert got[Metric.NVLINK_DATA_RATE.value]["min"] == pytest.approx(4.0e10, rel=1e-6)
    with historian.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM telemetry_day_rollups")).scalar() == 1
    assert schema.SCHEMA_VERSION >= 14
