"""The nightly report gives SQLite the table statistics its query planner needs at scale."""

from __future__ import annotations

from sqlalchemy import text

from rsc_health.historian.db import connect, refresh_statistics
from rsc_health.report.gather import GatherOptions, gather
from tests.report.test_gather import AS_OF, LEMON_RULES, populate


def _stats(engine) -> dict[str, str]:
    with engine.connect() as conn:
        return dict(conn.execute(text("SELECT idx, stat FROM sqlite_stat1 WHERE tbl IN "
                                      "('jobs', 'job_nodes') AND idx IS NOT NULL")).all())


def test_gather_leaves_sqlite_statistics_for_the_jobs_and_job_nodes_indexes(tmp_path):
    engine = connect(f"sqlite:///{tmp_path / 'h.db'}", create_missing=True)
    populate(engine)
    labels: list[str] = []
    data = gather(engine, AS_OF, GatherOptions(lemon=LEMON_RULES), progress=labels.append)
    stats = _stats(engine)
    with engine.connect() as conn:
        n_jobs = conn.execute(text("SELECT count(*) FROM jobs")).scalar_one()
        n_rows = conn.execute(text("SELECT count(*) FROM job_nodes")).scalar_one()
    # sqlite_stat1's first number is the index's row count.
    assert n_jobs > 40
    assert int(stats["ix_jobs_end"].split()[0]) == n_jobs
    assert int(stats["ix_job_nodes_node"].split()[0]) == n_rows
    assert labels[0] == "planner statistics" and "planner statistics" in data.timings
    assert len(data.features) == 3
    engine.dispose()


def test_a_read_only_historian_still_gets_its_report(tmp_path):
    path = tmp_path / "h.db"
    writer = connect(f"sqlite:///{path}", create_missing=True)
    populate(writer)
    writer.dispose()
    engine = connect(f"sqlite:///file:{path}?mode=ro&uri=true", create_missing=True)
    refresh_statistics(engine)  # logs and carries on: only speed is lost
    data = gather(engine, AS_OF, GatherOptions(lemon=LEMON_RULES))
    assert len(data.features) == 3 and "features" not in data.notes
    with engine.connect() as conn:
        assert not conn.execute(text("SELECT name FROM sqlite_master "
                                     "WHERE name = 'sqlite_stat1'")).all()
    engine.dispose()
