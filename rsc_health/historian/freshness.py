"""Which nodes are still looking: the node path's heartbeats, and nodes whose checks stopped.

Every prolog, epilog and sweep spools one `heartbeat` record (rsc_health.spool). Delivered,
it updates `node_runs` (the latest run per node and entry point) and counts into
`heartbeat_days`. A node whose latest run is older than `stale_after_s` (three sweep
intervals, say) has stopped checking: its timer died, its disk filled, its Python broke. A node
whose latest run was `checker_error` is checking but cannot look. Both are named by
`healthctl status`, `healthctl node` and the report; neither is ever a reason to drain.

Nodes from before heartbeats existed fall back to the newest check result they delivered.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import Connection, Engine, bindparam, func, select, text

from rsc_health.historian import schema
from rsc_health.historian.ingest import db_time

R = schema.node_runs
# [historian] stale_after_s when a config lacks it (the packaged default_config.toml has it):
# one flush interval plus three sweeps (tests/unit/test_freshness_matches_the_shipped_timers.py).
STALE_AFTER_S = 2700.0
_RUNS_Q = select(R.c.node, R.c.source, R.c.last_seen).where(
    R.c.node.in_(bindparam("nodes", expanding=True)))
LEVELS = ("ok", "warn", "drain_after_job", "drain_now", "checker_error")


@dataclass(frozen=True, slots=True)
class Heartbeat:
    node: str
    time: datetime  # naive UTC
    source: str
    level: str
    checker_errors: int
    duration_s: float | None
    version: str


@dataclass(frozen=True, slots=True)
class NodeFreshness:
    node: str
    last_seen: datetime | None
    last_source: str
    last_level: str
    checker_errors: int
    stale: bool

    @property
    def broken(self) -> bool:
        """Checking, but the checker could not look (config, sources, its own state)."""
        return self.last_level == "checker_error" or self.checker_errors > 0


def record_runs(conn: Connection, beats: Iterable[Heartbeat]) -> int:
    """Fold heartbeats into node_runs and heartbeat_days; returns how many were new.

    A heartbeat no newer than the stored run of its (node, source) is a redelivery or late:
    it changes nothing, so delivery stays exactly-once for the counts too."""
    beats = sorted(beats, key=lambda b: (b.node, b.source, b.time))
    if not beats:
        return 0
    nodes = sorted({b.node for b in beats})
    latest: dict[tuple[str, str], datetime] = {}
    for i in range(0, len(nodes), 500):
        rows = conn.execute(_RUNS_Q, {"nodes": nodes[i : i + 500]})
        latest.update({(n, s): t for n, s, t in rows})
    newest: dict[tuple[str, str], Heartbeat] = {}
    days: dict[tuple, list[int]] = defaultdict(lambda: [0, 0, 0])
    fresh = 0
    for b in beats:
        key = (b.node, b.source)
        if key in latest and b.time <= latest[key]:
            continue
        latest[key] = b.time
        newest[key] = b
        fresh += 1
        d = days[(b.time.date(), b.node)]
        d[0] += 1
        d[1] += b.level == "checker_error"
        d[2] += b.level in ("drain_now", "drain_after_job")
    if newest:
        quote = conn.dialect.identifier_preparer.quote
        cols = ("node", "source", "last_seen", "level", "checker_errors", "duration_s",
                "version")
        conn.execute(
            text(
                f"INSERT INTO node_runs ({', '.join(quote(c) for c in cols)}) VALUES "
                f"({', '.join(':' + c for c in cols)}) ON CONFLICT (node, source) DO UPDATE SET "
                + ", ".join(f"{quote(c)} = excluded.{quote(c)}" for c in cols[2:])
                + " WHERE excluded.last_seen > node_runs.last_seen"
            ),
            [{"node": b.node, "source": b.source, "last_seen": db_time(b.time),
              "level": b.level, "checker_errors": b.checker_errors, "duration_s": b.duration_s,
              "version": b.version} for b in newest.values()],
        )
        conn.execute(
            text(
                "INSERT INTO heartbeat_days (day, node, runs, checker_error_runs, drain_runs) "
                "VALUES (:day, :node, :runs, :err, :drain) ON CONFLICT (day, node) DO UPDATE SET "
                "runs = heartbeat_days.runs + excluded.runs, "
                "checker_error_runs = heartbeat_days.checker_error_runs "
                "+ excluded.checker_error_runs, "
                "drain_runs = heartbeat_days.drain_runs + excluded.drain_runs"
            ),
            [{"day": day, "node": node, "runs": r, "err": e, "drain": dr}
             for (day, node), (r, e, dr) in days.items()],
        )
    return fresh


def node_freshness(
    engine: Engine, now: datetime, stale_after_s: float, nodes: Iterable[str] | None = None
) -> list[NodeFreshness]:
    """Every node the historian has heard from (or those named), newest run first per node.

    Cost: node_runs (a row per node and entry point), plus index probes into check_results
    for the nodes without a heartbeat; never a pass over check_results, which holds a year
    of intervals (10M rows took a full GROUP BY 4-9 s per call, for `healthctl node` too)."""
    if now.tzinfo is not None:
        from datetime import UTC

        now = now.astimezone(UTC).replace(tzinfo=None)
    wanted = sorted(set(nodes)) if nodes is not None else None
    cutoff = now - timedelta(seconds=stale_after_s)
    best: dict[str, NodeFreshness] = {}
    with engine.connect() as conn:
        q = select(R.c.node, R.c.source, R.c.last_seen, R.c.level, R.c.checker_errors)
        runs = ([row for part in _chunks(wanted)
                 for row in conn.execute(q.where(R.c.node.in_(part)))]
                if wanted is not None else conn.execute(q).all())
        for node, source, seen, level, errors in runs:
            cur = best.get(node)
            if cur is None or (cur.last_seen or datetime.min) < seen:
                best[node] = NodeFreshness(node, seen, source, level, int(errors or 0),
                                           seen < cutoff)
        # Nodes from before heartbeats: their newest delivered check result.
        listed = wanted if wanted is not None else _nodes_with_results(conn)
        c = schema.check_results
        for part in _chunks([n for n in listed if n not in best]):
            q2 = (select(c.c.node, func.max(c.c.last_seen)).where(c.c.node.in_(part))
                  .group_by(c.c.node))
            for node, seen in conn.execute(q2):
                best[node] = NodeFreshness(node, seen, "checks", "", 0, seen < cutoff)
    for node in (wanted or ()):
        best.setdefault(node, NodeFreshness(node, None, "", "", 0, True))
    return sorted(best.values(), key=lambda f: f.node)


# The distinct nodes of check_results by one index probe each (ix_check_results_node_time),
# a "loose index scan" neither database does on its own for SELECT DISTINCT.
_DISTINCT_NODES = text(
    "WITH RECURSIVE n(node) AS ("
    " SELECT MIN(node) FROM check_results"
    " UNION ALL"
    " SELECT (SELECT MIN(c.node) FROM check_results AS c WHERE c.node > n.node)"
    " FROM n WHERE n.node IS NOT NULL"
    ") SELECT node FROM n WHERE node IS NOT NULL"
)


def _nodes_with_results(conn: Connection) -> list[str]:
    return list(conn.execute(_DISTINCT_NODES).scalars())


def _chunks(items: list[str], size: int = 500) -> Iterator[list[str]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


def stale_after_s(cfg) -> float:
    """[historian] stale_after_s of a Config: how old a node's newest run may be."""
    return float(cfg.get("historian.stale_after_s", STALE_AFTER_S))


def stale_nodes(engine: Engine, now: datetime, stale_after_s: float) -> list[NodeFreshness]:
    return [f for f in node_freshness(engine, now, stale_after_s) if f.stale]
