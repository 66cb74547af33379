"""Migration 0012 adds gpu_names (the bus id of each node's GPU index, rsc_health.gpuname); a
database at version 8 keeps every row and ends as a new one starts. A heartbeat's `gpus` that
is garbled costs its names, never the heartbeat."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import inspect, select, text

from rsc_health import spool
from rsc_health.historian import db, schema
from rsc_health.historian.ingest.delivery import deliver


def _shape(engine, tables):
    insp = inspect(engine)
    return {t: (sorted((c["name"], c["nullable"]) for c in insp.get_columns(t)),
                sorted(i["name"] for i in insp.get_indexes(t)),
                sorted(insp.get_pk_constraint(t)["constrained_columns"])) for t in tables}


def test_upgrade_from_8_adds_gpu_names_as_a_new_database_has_it(tmp_path):
    old_dir = tmp_path / "old"
    old_dir.mkdir()
    for mig in db.migrations("sqlite"):
        if mig.version <= 8:
            (old_dir / mig.path.name).write_text(mig.path.read_text())
    old = db.engine_for(f"sqlite:///{tmp_path / 'old.db'}")
    new = db.engine_for(f"sqlite:///{tmp_path / 'new.db'}")
    try:
        assert db.migrate(old, 0, old_dir)[-1] == 8
        with old.begin() as conn:
            conn.execute(text("INSERT INTO tickets (node, opened, reason, source) "
                              "VALUES ('gpu001', '2026-01-01 00:00:00', 'PSU', 'manual')"))
        applied = db.migrate(old, 8)
        assert 12 in applied and applied[-1] == schema.SCHEMA_VERSION
        db.create(new)
        assert _shape(old, ("gpu_names",)) == _shape(new, ("gpu_names",))
        with old.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM tickets")).scalar() == 1
    finally:
        old.dispose()
        new.dispose()


def test_a_garbled_gpus_map_costs_its_names_never_the_heartbeat(historian, tmp_path):
    t = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)
    hostile = {"0": "00000000:18:00.0", "1": "'; DROP TABLE jobs; --", "x": "0000:1a:00",
               "2": 7, "99999": "0000:3b:00", "3": "0000:5D:00"}
    spool.append(tmp_path, [
        spool.record("heartbeat", "gpu060", t, source="sweep", level="ok", checker_errors=0,
                     duration_s=0.3, families={}, version="t", gpus=hostile),
        spool.record("heartbeat", "gpu061", t, source="sweep", level="ok", checker_errors=0,
                     duration_s=0.3, families={}, version="t", gpus=["not", "a", "map"]),
    ])
    report = deliver(historian, tmp_path)
    assert report.quarantined_count == 0 and report.delivered.get("heartbeat") == 2
    g = schema.gpu_names
    with historian.connect() as conn:
        rows = sorted(conn.execute(select(g.c.node, g.c.idx, g.c.bus_id)).all())
        runs = conn.execute(select(schema.node_runs.c.node)).scalars().all()
    assert rows == [("gpu060", 0, "0000:18:00.0"), ("gpu060", 3, "0000:5d:00.0")]
    assert sorted(runs) == ["gpu060", "gpu061"]
