"""A bulk sacct load leaves the planner statistics fresh (PostgreSQL would otherwise plan
goodput's preemption search as if the tables were empty until autovacuum came by)."""

from __future__ import annotations

from sqlalchemy import text

from rsc_health.historian.attribute import attribute
from rsc_health.historian.ingest import checks, sacct
from tests.historian.conftest import FIXTURES


def _statistics(engine) -> dict[str, int]:
    """Per table, how many planner-statistics rows exist (only ANALYZE writes them)."""
    with engine.connect() as conn:
        if engine.dialect.name == "sqlite":
            has = conn.execute(text(
                "SELECT 1 FROM sqlite_master WHERE name = 'sqlite_stat1'")).first()
            if not has:
                return {}
            rows = conn.execute(text("SELECT tbl, COUNT(*) FROM sqlite_stat1 GROUP BY tbl"))
        else:
            rows = conn.execute(text(
                "SELECT tablename, COUNT(*) FROM pg_stats WHERE schemaname = current_schema()"
                " AND tablename IN ('jobs', 'job_nodes', 'check_results') GROUP BY tablename"
            ))
        return {name: int(n) for name, n in rows}


def test_a_big_load_refreshes_the_statistics_and_a_small_one_leaves_them(
    historian, monkeypatch
):
    sample = FIXTURES / "sacct_small.txt"
    monkeypatch.setattr(sacct, "ANALYZE_AFTER_ROWS", 10**9)
    sacct.ingest_text(historian, sample)
    before = _statistics(historian)
    assert before == {}  # never analyzed

    monkeypatch.setattr(sacct, "ANALYZE_AFTER_ROWS", 1)
    with historian.begin() as conn:  # new rows to load: the same file again writes nothing
        conn.execute(text("DELETE FROM job_nodes"))
        conn.execute(text("DELETE FROM jobs"))
    report = sacct.ingest_text(historian, sample)

    assert report.written > 0
    after = _statistics(historian)
    assert after.get("jobs", 0) > 0 and after.get("job_nodes", 0) > 0


def test_attribution_plans_with_statistics_of_what_was_just_loaded(historian, monkeypatch):
    monkeypatch.setattr(sacct, "ANALYZE_AFTER_ROWS", 10**9)  # a small nightly load
    sacct.ingest_text(historian, FIXTURES / "sacct_small.txt")
    checks.ingest_file(historian, FIXTURES / "checks.jsonl")
    assert _statistics(historian) == {}

    attribute(historian)

    assert _statistics(historian).get("check_results", 0) > 0
