"""Retention: what the historian forgets, and when (`healthctl db prune`).

The node path's rows are the volume: closed check intervals, actions, job exclusions. They are
kept `[historian] retention_days` (400: a year plus the lemon history window) and then
deleted; the daily rollups (`heartbeat_days`, `check_days`) keep their counts for
`rollup_retention_days` (0 = forever), so a report over years does not need the rows.
Open intervals are never pruned: they are the node's current state, however old. Jobs and
node events stay unless `jobs_retention_days` is set: the paper's metrics need a year.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import Engine, delete, func, select

from rsc_health.historian import schema
from rsc_health.historian.db import writer
from rsc_health.historian.ingest import limit_statements


@dataclass(frozen=True)
class Retention:
    days: int = 400
    rollup_days: int = 0
    jobs_days: int = 0

    @classmethod
    def from_config(cls, cfg) -> Retention:
        h = cfg.section("historian") if cfg is not None else {}
        return cls(int(h.get("retention_days", 400)), int(h.get("rollup_retention_days", 0)),
                   int(h.get("jobs_retention_days", 0)))


def _plan(now: datetime, r: Retention) -> list[tuple[str, object, object]]:
    """(table name, table, where-clause) for everything past its retention."""
    out = []
    if r.days > 0:
        cut = now - timedelta(days=r.days)
        c, a, x = schema.check_results, schema.node_actions, schema.job_exclusions
        out += [
            ("check_results", c, (c.c.is_open.is_(False)) & (c.c.last_seen < cut)),
            ("node_actions", a, a.c.time < cut),
            ("job_exclusions", x, x.c.time < cut),
        ]
    if r.rollup_days > 0:
        day = (now - timedelta(days=r.rollup_days)).date()
        for t in (schema.heartbeat_days, schema.check_days):
            out.append((t.name, t, t.c.day < day))
    if r.jobs_days > 0:
        cut = now - timedelta(days=r.jobs_days)
        j, e = schema.jobs, schema.node_events
        # job_nodes and attributions go with their job (ON DELETE CASCADE).
        out += [("jobs", j, j.c.end < cut), ("node_events", e, e.c.end < cut)]
    return out


def prune(engine: Engine, now: datetime, retention: Retention, *, dry_run: bool = False
          ) -> dict[str, int]:
    """Rows deleted (or, with dry_run, that would be) per table, in one transaction."""
    counts: dict[str, int] = {}
    with writer(engine).begin() as conn:
        limit_statements(conn, 3600)
        for name, table, where in _plan(now, retention):
            if dry_run:
                counts[name] = int(conn.execute(
                    select(func.count()).select_from(table).where(where)).scalar() or 0)
            else:
                counts[name] = int(conn.execute(delete(table).where(where)).rowcount or 0)
        if dry_run:
            conn.rollback()
    return counts
