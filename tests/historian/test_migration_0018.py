"""Migration 0018 widens jobs.instance_key (a job whose JobIDRaw:Submit:Start another
cluster's job holds is keyed ...@<cluster>, up to 137 characters): a historian at version 17
on PostgreSQL (VARCHAR(96) there) keeps its jobs, ends with the column a new one has, and
takes the two clusters' jobs that share a plain key. SQLite holds no text to a length:
there only the version changes."""

from __future__ import annotations

from datetime import datetime

import pytest
from sqlalchemy import inspect, select

from rsc_health.historian import db, schema
from rsc_health.historian.ingest import sacct

from .test_ingest_adversarial import _parsable, _row

CLUSTER = "c" * 64  # the longest name jobs.cluster holds


def _key_type(engine) -> str:
    return next(str(c["type"]) for c in inspect(engine).get_columns("jobs")
                if c["name"] == "instance_key")


@pytest.mark.parametrize("dialect", ["sqlite", pytest.param("postgresql",
                                                            marks=pytest.mark.postgres)])
def test_upgrade_from_17_takes_a_long_clusters_job_beside_a_stored_one(dialect, tmp_path,
                                                                       request):
    old_dir = tmp_path / "old"
    old_dir.mkdir()
    url = (f"sqlite:///{tmp_path / 'old.db'}" if dialect == "sqlite"
           else request.getfixturevalue("pg_url"))
    for mig in db.migrations(dialect):
        if mig.version <= 17:
            (old_dir / mig.path.name).write_text(mig.path.read_text())
    old = db.engine_for(url)
    try:
        assert db.migrate(old, 0, old_dir)[-1] == 17
        rows = _parsable([_row("4711")])
        with old.begin() as conn:  # a job stored at version 17 (the ingest's own columns)
            conn.execute(schema.jobs.insert().values(
                job_id="4711", job_id_display="4711", state="COMPLETED",
                submit=datetime(2024, 3, 1, 8), start=datetime(2024, 3, 1, 8, 0, 5),
                end=datetime(2024, 3, 1, 9, 0, 5), nnodes=2, gpus=16, nodelist="gpu[001-002]",
                instance_key="4711:2024-03-01T08:00:00:2024-03-01T08:00:05", cluster="alpha"))
        applied = db.migrate(old, 17)
        assert applied[0] == 18 and applied[-1] == db.current_version(old) == schema.SCHEMA_VERSION
        if dialect == "postgresql":
            assert _key_type(old).startswith("VARCHAR(160)")
        sacct.ingest_text(old, rows, cluster=CLUSTER)
        sacct.ingest_text(old, rows, cluster="alpha")  # alpha's own again: no third row
        with old.connect() as conn:
            got = sorted(conn.execute(select(schema.jobs.c.cluster,
                                             schema.jobs.c.instance_key)).all())
        assert got == [
            ("alpha", "4711:2024-03-01T08:00:00:2024-03-01T08:00:05"),
            (CLUSTER, f"4711:2024-03-01T08:00:00:2024-03-01T08:00:05@{CLUSTER}")]
    finally:
        old.dispose()
