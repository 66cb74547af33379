"""Slurm reuses job ids (a fresh StateSaveLocation starts again at FirstJobId, MaxJobId wraps):
a new job with an old job's id is a new job. Its exclusions were keyed by (job_id, node), so a
reused id that excluded the same node was dropped as the old job's row and never counted in
excl_jobid_count. They are keyed by the job instance now, (job_id, node, time), migration 0017;
a record delivered twice still lands once."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import func, inspect, select, text

from rsc_health import spool
from rsc_health.historian import db, schema
from rsc_health.historian.ingest import exclusions
from rsc_health.historian.ingest.delivery import deliver
from rsc_health.historian.lemons.features import lemon_features
from rsc_health.model import Finding, Severity, Status

FIRST = datetime(2024, 3, 1, 9, 55, tzinfo=UTC)
AGAIN = FIRST + timedelta(days=40)  # the same id, after the controller's state was wiped


def _start(node: str, when: datetime, job_id: str, excluded: list[str]) -> list[dict]:
    seen = spool.check_records([Finding("ecc", "gpu0", Status.OK, Severity.NONE, "clean")],
                               node="gpu005", source="sweep", time=when, job_id=None)
    return [*seen, spool.record("job_start", node, when, job_id=job_id, excluded=excluded)]


def _rows(engine) -> list[tuple]:
    x = schema.job_exclusions
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(
            select(x.c.job_id, x.c.node, x.c.time).order_by(x.c.time))]


def test_a_reused_job_id_that_excludes_the_same_node_is_a_new_jobs_exclusion(historian,
                                                                              tmp_path):
    spool.append(tmp_path, _start("gpu003", FIRST, "1002", ["gpu005"]))
    deliver(historian, tmp_path)
    again = _start("gpu007", AGAIN, "1002", ["gpu005"])
    spool.append(tmp_path, again)
    deliver(historian, tmp_path)
    spool.append(tmp_path, again)  # re-sent after a lost acknowledgement: still once
    deliver(historian, tmp_path)
    assert _rows(historian) == [("1002", "gpu005", FIRST.replace(tzinfo=None)),
                                ("1002", "gpu005", AGAIN.replace(tzinfo=None))]
    # the new job alone in a 28-day window; both jobs in a 60-day one
    recent = lemon_features(historian, AGAIN + timedelta(days=1), 28)
    assert recent.loc["gpu005", "excl_jobid_count"] == 1
    both = lemon_features(historian, AGAIN + timedelta(days=1), 60)
    assert both.loc["gpu005", "excl_jobid_count"] == 2


def test_an_exclusions_file_keeps_a_reused_id_and_merges_only_the_same_instance(historian):
    line = '{"job_id": "1", "node": "n1", "time": "%s"}'
    report = exclusions.ingest_lines(historian, [
        line % "2024-03-01T10:00:00", line % "2024-03-01T10:00:00",
        line % "2024-04-20T08:00:00"])
    assert report.written == 2 and report.merged == {exclusions.MERGED_SAME_KEY: 1}
    assert [r[2] for r in _rows(historian)] == [datetime(2024, 3, 1, 10), datetime(2024, 4, 20, 8)]


def _keys(engine) -> list[str]:
    return inspect(engine).get_pk_constraint("job_exclusions")["constrained_columns"]


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def version_16(request, tmp_path):
    old_dir = tmp_path / "old"
    old_dir.mkdir()
    for mig in db.migrations(request.param):
        if mig.version <= 16:
            (old_dir / mig.path.name).write_text(mig.path.read_text())
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'old.db'}"
    else:
        url = request.getfixturevalue("pg_url")
    engine = db.engine_for(url)
    try:
        assert db.migrate(engine, 0, old_dir)[-1] == 16
        yield engine
    finally:
        engine.dispose()


def test_upgrade_from_16_keeps_every_exclusion_and_keys_them_by_instance(version_16, tmp_path):
    engine = version_16
    with engine.begin() as conn:
        for job, node, when in (("7", "n1", "2024-03-01 10:00:00"),
                                ("7", "n2", "2024-03-01 10:00:00"),
                                ("8", "n1", "2024-03-02 11:00:00")):
            conn.execute(text("INSERT INTO job_exclusions (job_id, node, time) "
                              "VALUES (:j, :n, :t)"), {"j": job, "n": node, "t": when})
    assert _keys(engine) == ["job_id", "node"]
    applied = db.migrate(engine, 16)
    assert applied[0] == 17 and applied[-1] == schema.SCHEMA_VERSION
    assert _keys(engine) == ["job_id", "node", "time"]
    assert [(j, n, t.isoformat(" ")) for j, n, t in _rows(engine)] == [
        ("7", "n1", "2024-03-01 10:00:00"), ("7", "n2", "2024-03-01 10:00:00"),
        ("8", "n1", "2024-03-02 11:00:00")]
    assert "ix_job_exclusions_node_time" in {
        i["name"] for i in inspect(engine).get_indexes("job_exclusions")}
    # job 7 again, a new job with a reused id, through the writer's keyed insert
    report = exclusions.ingest_lines(
        engine, ['{"job_id": "7", "node": "n1", "time": "2024-05-01T10:00:00"}'])
    assert report.written == 1
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(schema.job_exclusions)).scalar() == 4
    new = db.engine_for(f"sqlite:///{tmp_path / 'new.db'}")
    try:
        db.create(new)
        assert _keys(new) == _keys(engine)
    finally:
        new.dispose()
