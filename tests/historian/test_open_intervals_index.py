"""Every node's flush asks for its open check intervals (intervals._OPEN_Q), the report and
the export for the fleet's open findings: the partial index ix_check_results_open (node,
check) WHERE is_open exists for them. They asked `is_open IS true` (SQLAlchemy's
.is_(True)), which PostgreSQL's planner cannot prove implies `is_open`, and SQLite's
`is_open IS 1` neither: the index was never used. A flush read every interval its node ever
had through (node, time) (a year: thousands of rows a node, 16,000 nodes, every half hour)
and the report scanned all of check_results (measured: 0.5 s of a 5M-row table, twice a
report). Now they ask the bare column the index is made on; EXPLAIN on a historian of 200
nodes with 100 closed intervals and 2 open ones each shows the index."""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import event

from rsc_health.historian.intervals import _load_open, open_failures
from rsc_health.historian.schema import check_results as C
from rsc_health.report.fleet import open_findings

T0 = datetime(2026, 1, 1)


def _fill(engine) -> None:
    rows = []
    for n in range(200):
        node = f"gpu{n:03d}"
        for k in range(102):
            t = T0 + timedelta(hours=k * 80 + n)
            rows.append({"id": f"{node}-{k}", "time": t, "node": node, "source": "sweep",
                         "job_id": None, "check": f"family{k % 8}", "component": "gpu0",
                         "status": "fail" if k % 2 else "ok", "severity": "repair",
                         "code": "x", "reason": "", "last_seen": t + timedelta(minutes=5),
                         "is_open": k >= 100})
    with engine.begin() as conn:
        conn.execute(C.insert(), rows)
        if engine.dialect.name == "postgresql":
            conn.exec_driver_sql("ANALYZE check_results")
        else:
            conn.exec_driver_sql("ANALYZE")


def _plans(engine, run) -> list[tuple[str, str]]:
    """(statement, plan) of every statement `run(conn)` sends that reads check_results'
    open intervals, each EXPLAINed with the parameters it was sent with."""
    sent = []

    def seen(conn, cursor, statement, parameters, context, executemany):
        if "is_open" in statement and statement.lstrip().upper().startswith("SELECT"):
            sent.append((statement, parameters))

    event.listen(engine, "before_cursor_execute", seen)
    try:
        with engine.connect() as conn:
            run(conn)
    finally:
        event.remove(engine, "before_cursor_execute", seen)
    word = "EXPLAIN" if engine.dialect.name == "postgresql" else "EXPLAIN QUERY PLAN"
    out = []
    with engine.connect() as conn:
        for statement, parameters in sent:
            rows = conn.exec_driver_sql(f"{word} {statement}", parameters).all()
            out.append((statement, "\n".join(str(r[-1]) for r in rows)))
    return out


def test_a_flush_and_the_report_find_open_intervals_by_their_partial_index(historian):
    _fill(historian)
    flush = _plans(historian, lambda conn: _load_open(conn, ["gpu007"]))
    report = _plans(historian, lambda conn: open_findings(historian, T0 + timedelta(days=400),
                                                          50))
    listed = _plans(historian, open_failures)
    # The statements still answer what they did: the node's two open intervals, 200 nodes'
    # open failures.
    with historian.connect() as conn:
        assert sorted(o.id for v in _load_open(conn, ["gpu007"]).values() for o in v) == [
            "gpu007-100", "gpu007-101"]
        assert len(open_failures(conn)) == 200
    assert len(flush) == 1 and len(report) == 2 and len(listed) == 1
    # SQLite's planner (no histograms) took ix_check_results_time for the report's
    # `time <= as_of`, which holds for nearly every row (3.5 s at a year of sweeps of 3,000
    # nodes, 1M intervals); the report now keeps that bound off the index there.
    for statement, plan in [*flush, *listed, *report]:
        assert "ix_check_results_open" in plan, (statement, plan)
