"""A year of five-minute sweeps, as the historian stores them, for the report benchmark.

Fleet-day shapes from the node path (docs/deployment.md, "What is stored"): per node one open
all-clear interval per check family; `--changes-per-node-day` state changes (a link flap, a
warning that comes and goes), each a failure interval and the all-clear interval it
interrupted; heartbeat_days one row per node-day (288 sweeps plus prologs and epilogs);
node_runs the latest run per (node, source); check_days the failures and warnings that began.
Writing them through the delivery path would take days of CPU at this volume, so they are
written directly with the same bulk writer the loads use.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import numpy as np
from sqlalchemy import Engine, select

from rsc_health.historian import schema
from rsc_health.historian.ingest import bulk_write, db_time

FAMILIES = ("gpu", "xid", "ecc", "remap", "nvlink", "pcie", "infiniband", "mount")
CHANGE_CODES = {"infiniband": "ib_symbol_errors", "pcie": "pcie_link_degraded",
                "mount": "mount_slow", "gpu": "gpu_clocks_throttled", "nvlink": "nvlink_down"}
CHUNK = 50_000


def fleet_nodes(engine: Engine, fallback: int) -> list[str]:
    """The historian's own node names (so the report's joins find them), else generated."""
    with engine.connect() as conn:
        names = sorted(conn.execute(select(schema.node_events.c.node).distinct()).scalars())
    return names or [f"node{i:05d}" for i in range(fallback)]


def fill_sweep_year(engine: Engine, as_of: datetime, nodes: list[str], *, days: int = 365,
                    changes_per_node_day: float = 0.5, seed: int = 0) -> dict[str, int]:
    rng = np.random.default_rng(seed)
    start = as_of - timedelta(days=days)
    counts = {"check_results": 0, "heartbeat_days": 0, "check_days": 0, "node_runs": 0}
    cols = ("id", "time", "node", "source", "job_id", "check", "component", "status",
            "severity", "code", "reason", "last_seen", "is_open")
    changing = tuple(CHANGE_CODES)
    with engine.begin() as conn:
        rows: list[tuple] = []
        day_rows: list[tuple] = []
        check_day: dict[tuple, int] = {}

        def flush_rows() -> None:
            counts["check_results"] += bulk_write(conn, schema.check_results, cols, rows,
                                                  conflict=("id",))
            rows.clear()

        for n, node in enumerate(nodes):
            n_changes = rng.poisson(changes_per_node_day * days)
            at = np.sort(rng.uniform(0, days * 86400, n_changes))
            fams = rng.choice(changing, n_changes)
            last_ok: dict[str, datetime] = {f: start for f in FAMILIES}
            for i, (offset, family) in enumerate(zip(at, fams, strict=True)):
                begin = start + timedelta(seconds=float(offset))
                end = begin + timedelta(minutes=float(5 * rng.integers(1, 24)))
                if end >= as_of or begin <= last_ok[family]:
                    continue
                code = CHANGE_CODES[family]
                rows.append((f"ok-{n}-{family}-{i}", db_time(last_ok[family]), node, "sweep",
                             None, family, "*", "ok", "none", "", "", db_time(begin), False))
                rows.append((f"chg-{n}-{family}-{i}", db_time(begin), node, "sweep", None,
                             family, "port1", "warn", "warn", code, code, db_time(end), False))
                key = (begin.date(), node, family)
                check_day[key] = check_day.get(key, 0) + 1
                last_ok[family] = end + timedelta(minutes=5)
            for family in FAMILIES:
                rows.append((f"open-{n}-{family}", db_time(last_ok[family]), node, "sweep",
                             None, family, "*", "ok", "none", "", "", db_time(as_of), True))
            for d in range(days):
                day_rows.append(((start + timedelta(days=d)).date(), node, 288 + 6, 0, 0))
            if len(rows) >= CHUNK:
                flush_rows()
        flush_rows()
        for i in range(0, len(day_rows), CHUNK):
            counts["heartbeat_days"] += bulk_write(
                conn, schema.heartbeat_days,
                ("day", "node", "runs", "checker_error_runs", "drain_runs"),
                day_rows[i : i + CHUNK], conflict=("day", "node"))
        counts["check_days"] += bulk_write(
            conn, schema.check_days, ("day", "node", "check", "fail", "warn"),
            [(d, node, fam, 0, w) for (d, node, fam), w in check_day.items()],
            conflict=("day", "node", "check"))
        runs = [(node, source, db_time(as_of - timedelta(minutes=m)), "ok", 0, 0.4, "bench")
                for node in nodes for source, m in (("sweep", 2), ("prolog", 30),
                                                    ("epilog", 25))]
        counts["node_runs"] += bulk_write(
            conn, schema.node_runs, ("node", "source", "last_seen", "level", "checker_errors",
                                     "duration_s", "version"), runs, conflict=("node", "source"))
    return counts
