"""Migration 0015 adds node_inventory.gpu_model (a node's GPU model, '' unknown: the lemon peer
group splits a partition by model when the inventory names more than one); a database at
version 13 keeps every inventory row, with '' for the model, and ends as a new one starts."""

from __future__ import annotations

import io

from sqlalchemy import inspect, select, text

from rsc_health.historian import db, schema
from rsc_health.historian.ingest import inventory


def _columns(engine):
    return sorted((c["name"], c["nullable"]) for c in inspect(engine).get_columns(
        "node_inventory"))


def test_upgrade_from_13_adds_the_gpu_model_and_keeps_the_rows(tmp_path):
    old_dir = tmp_path / "old"
    old_dir.mkdir()
    for mig in db.migrations("sqlite"):
        if mig.version <= 13:
            (old_dir / mig.path.name).write_text(mig.path.read_text())
    old = db.engine_for(f"sqlite:///{tmp_path / 'old.db'}")
    new = db.engine_for(f"sqlite:///{tmp_path / 'new.db'}")
    try:
        assert db.migrate(old, 0, old_dir)[-1] == 13
        with old.begin() as conn:
            conn.execute(text("INSERT INTO node_inventory (node, cluster, partition, start, "
                              "source) VALUES ('gpu001', 'c', 'p', '2026-01-01 00:00:00.000000', "
                              "'csv')"))
        applied = db.migrate(old, 13)
        assert 15 in applied and applied[-1] == schema.SCHEMA_VERSION
        db.create(new)
        assert _columns(old) == _columns(new)
        with old.connect() as conn:
            assert conn.execute(select(schema.node_inventory.c.node,
                                       schema.node_inventory.c.gpu_model)).all() == [
                ("gpu001", "")]
        # a CSV with the model fills it in; one without it again does not unname it
        csv = "node,cluster,partition,from,to{}\ngpu001,c,p,2026-01-01T00:00:00,{}\n"
        inventory.import_lines(old, io.StringIO(csv.format(",gpu_model", ",H100")))
        inventory.import_lines(old, io.StringIO(csv.format("", "")))
        with old.connect() as conn:
            assert conn.execute(select(schema.node_inventory.c.gpu_model)).scalar_one() == "H100"
    finally:
        old.dispose()
        new.dispose()
