"""Migration 0016 adds the telemetry rollups' `sweeps` (a row's sample count, kept once): a
database at version 15 keeps its rollup rows (every `_n`, no `sweeps`) and reads them as before,
and ends as a new one starts."""

from __future__ import annotations

from datetime import date

from sqlalchemy import inspect, text

from rsc_health.historian import db, schema
from rsc_health.historian.telemetry import load_rollups


def _columns(engine, table):
    return sorted((c["name"], c["nullable"]) for c in inspect(engine).get_columns(table))


def test_upgrade_from_15_adds_sweeps_and_old_rows_read_as_before(tmp_path):
    old_dir = tmp_path / "old"
    old_dir.mkdir()
    for mig in db.migrations("sqlite"):
        if mig.version <= 15:
            (old_dir / mig.path.name).write_text(mig.path.read_text())
    old = db.engine_for(f"sqlite:///{tmp_path / 'old.db'}")
    new = db.engine_for(f"sqlite:///{tmp_path / 'new.db'}")
    try:
        assert db.migrate(old, 0, old_dir)[-1] == 15
        with old.begin() as conn:
            conn.execute(text(
                "INSERT INTO telemetry_day_rollups (day, node, gpu_temp_c_n, gpu_temp_c_mean, "
                "gpu_temp_c_min, gpu_temp_c_max, gpu_temp_c_past, gpu_temp_c_worst) "
                "VALUES ('2026-11-20', 'e1', 288, 41.5, 40.0, 44.0, 0, 'gpu2')"))
        applied = db.migrate(old, 15)
        assert 16 in applied and applied[-1] == schema.SCHEMA_VERSION
        db.create(new)
        for table in ("telemetry_job_rollups", "telemetry_day_rollups"):
            assert _columns(old, table) == _columns(new, table)
        got = load_rollups(old, "day", date(2026, 11, 20), date(2026, 11, 21))
        assert [tuple(r) for r in got[["node", "metric", "n", "mean", "min", "max", "past",
                                       "worst"]].itertuples(index=False)] == [
            ("e1", "gpu_temp_c", 288, 41.5, 40.0, 44.0, 0, "gpu2")]
    finally:
        old.dispose()
        new.dispose()
