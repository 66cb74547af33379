"""Node freshness at a year of check intervals: `healthctl node`, `healthctl status`, the
exporter and the morning report ask which nodes stopped checking.

    python3 benchmarks/bench_freshness.py [--rows 2000000] [--nodes 16000] [--pg URL | --no-pg]

Fills check_results with `--rows` intervals over `--nodes` nodes (a year at 16,000 nodes is
of that order: docs/performance.md) and node_runs with a heartbeat per node but one in a
hundred (nodes from before heartbeats, which fall back to their newest check). Then times, in
the same run: the full pass over check_results the fallback used to make (one GROUP BY),
`node_freshness` for the whole fleet, and for one node by name. SQLite always; PostgreSQL too
when --pg or $RSC_HEALTH_TEST_PG names a server (a scratch database, dropped after).
RSC_BENCH_QUICK=1: 200,000 rows over 2,000 nodes.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

from sqlalchemy import text

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _synth import create_postgres, drop_postgres  # noqa: E402 - same directory: shared loaders

from rsc_health.historian.db import connect  # noqa: E402
from rsc_health.historian.freshness import node_freshness  # noqa: E402

NOW = datetime(2026, 11, 25)
# check_results rows: a year of interval starts spread over the nodes.
_FILL_PG = """
INSERT INTO check_results (id, time, node, source, "check", component, status, severity, code,
                           reason, last_seen, is_open)
SELECT 'r' || g, timestamp '2025-11-25' + (g % 31536000) * interval '1 second',
       'gpu' || lpad((g % :nodes)::text, 5, '0'), 'sweep', 'xid', '*', 'ok', 'none', '', '',
       timestamp '2025-11-25' + (g % 31536000) * interval '1 second', false
FROM generate_series(1, :rows) AS g
"""
_FILL_SQLITE = """
WITH RECURSIVE g(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM g WHERE i < :rows)
INSERT INTO check_results (id, time, node, source, "check", component, status, severity, code,
                           reason, last_seen, is_open)
SELECT 'r' || i, datetime('2025-11-25', '+' || (i % 31536000) || ' seconds'),
       'gpu' || substr('00000' || (i % :nodes), -5), 'sweep', 'xid', '*', 'ok', 'none', '', '',
       datetime('2025-11-25', '+' || (i % 31536000) || ' seconds'), 0
FROM g
"""
# a heartbeat for every node but one in a hundred
_RUNS = """
INSERT INTO node_runs (node, source, last_seen, level, checker_errors, duration_s, version)
SELECT DISTINCT node, 'sweep', :now, 'ok', 0, 1.0, 'bench' FROM check_results
WHERE substr(node, 7, 2) <> '00'
"""
_FULL_PASS = "SELECT node, MAX(last_seen) FROM check_results GROUP BY node"


def _timed(fn, repeat: int = 3) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def bench(url: str, rows: int, nodes: int, label: str) -> list[tuple[str, float, str]]:
    engine = connect(url, create_missing=True)
    t = time.perf_counter()
    fill = _FILL_PG if engine.dialect.name == "postgresql" else _FILL_SQLITE
    with engine.begin() as conn:
        conn.execute(text(fill), {"rows": rows, "nodes": nodes})
        conn.execute(text(_RUNS), {"now": NOW})
    with engine.connect() as conn:
        conn.execute(text("ANALYZE"))
        conn.commit()
    print(f"{label}: {rows:,} check_results over {nodes:,} nodes filled in "
          f"{time.perf_counter() - t:.1f} s")

    def full_pass():
        with engine.connect() as conn:
            conn.execute(text(_FULL_PASS)).all()

    fleet = len(node_freshness(engine, NOW, 2700))
    full = _timed(full_pass)
    every = _timed(lambda: node_freshness(engine, NOW, 2700))
    one = _timed(lambda: node_freshness(engine, NOW, 2700, nodes=["gpu00100"]), repeat=7)
    engine.dispose()
    print(f"  full pass over check_results (the old fallback): {full:7.3f} s")
    print(f"  node_freshness, whole fleet ({fleet:,} nodes):   {every:7.3f} s "
          f"({full / every:.1f}x less than the full pass alone)")
    print(f"  node_freshness, one node:                       {one:7.4f} s "
          f"({full / one:.0f}x less)")
    return [(f"{label}_full_pass", full, "s"), (f"{label}_fleet", every, "s"),
            (f"{label}_one_node", one, "s"), (f"{label}_fleet_ratio", full / every, "x"),
            (f"{label}_one_node_ratio", full / one, "x")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    quick = bool(os.environ.get("RSC_BENCH_QUICK"))
    ap.add_argument("--rows", type=int, default=200_000 if quick else 2_000_000)
    ap.add_argument("--nodes", type=int, default=2_000 if quick else 16_000)
    ap.add_argument("--pg", default=os.environ.get("RSC_HEALTH_TEST_PG"))
    ap.add_argument("--no-pg", action="store_true")
    args = ap.parse_args()
    figures = []
    with tempfile.TemporaryDirectory() as tmp:
        figures += bench(f"sqlite:///{tmp}/fresh.db", args.rows, args.nodes, "sqlite")
    if args.pg and not args.no_pg:
        url, name = create_postgres(args.pg)
        try:
            figures += bench(url, args.rows, args.nodes, "postgresql")
        finally:
            drop_postgres(args.pg, name)
    for name, value, unit in figures:
        print(f"BENCH\tfreshness\t{name}\t{value:.4f}\t{unit}")


if __name__ == "__main__":
    main()
