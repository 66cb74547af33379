"""Which nodes are still looking: the node path's heartbeats, and nodes whose checks stopped.

Every prolog, epilog and sweep spools one `heartbeat` record (rsc_health.spool). Delivered,
it updates `node_runs` (the latest run per node and entry point) and counts into
`heartbeat_days`. A node whose latest run is older than `stale_after_s` (three sweep
intervals, say) has stopped checking: its timer died, its disk filled, its Python broke. A node
whose latest run was `checker_error` is checking but cannot look. Both are named by
`healthctl status`, `healthctl node` and the report; neither is ever a reason to drain.

Nodes from before heartbeats existed fall back to the newest check result they delivered.

A node's clock can be wrong (a year ahead, or 1970 after its RTC battery died), and the node
stamps every record with it. Delivery judges each time against the historian's clock (the
database's): a stamp from the future would keep a dead node fresh for a year and make every
later, correct run look old, so such records are quarantined, never folded. The node is alive
all the same (it delivers): its `clock` row in node_runs says so, as of the database's clock,
with the level `clock_skew`, until a heartbeat with a believable time arrives.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import Connection, Engine, bindparam, delete, func, select, text

from rsc_health.historian import schema
from rsc_health.historian.ingest import db_time
from rsc_health.model import Level

R = schema.node_runs
_RUNS_Q = select(R.c.node, R.c.source, R.c.last_seen).where(
    R.c.node.in_(bindparam("nodes", expanding=True)))
# How far ahead of the historian's clock a node's stamp may be and still be believed: NTP keeps
# nodes within milliseconds, so this is only the slack between two honest clocks.
CLOCK_AHEAD_S = 300.0
# No node-path record is older than rsc-health: an earlier stamp is a reset clock (1970 after a
# dead RTC battery, 2000, or a BIOS's build date).
CLOCK_FLOOR = datetime(2020, 1, 1)
# Nor is one this much older than the same node's newest heartbeat on record: a node's spool is
# delivered in the order it was written, so a backlog of any age arrives newer than what came
# before it; a stamp this far behind the node's own is its clock reset to a date after
# CLOCK_FLOOR (an RTC battery's BIOS date): believed, the node's XID of today was attributed
# to whatever job it ran that day years ago. The node's own, not the fleet's newest or the
# historian's clock: a replay of a past fleet, a node back from months away, are their own.
CLOCK_BEHIND_S = 120 * 86400.0
# node_runs' row for a node whose latest delivered heartbeat had an unbelievable time: its
# last_seen is when the historian received it, its level CLOCK_SKEW.
CLOCK_SOURCE = "clock"
CLOCK_SKEW = "clock_skew"


@dataclass(frozen=True)
class Heartbeat:
    node: str
    time: datetime  # naive UTC
    source: str
    level: str
    checker_errors: int
    duration_s: float | None
    version: str


@dataclass(frozen=True)
class NodeFreshness:
    node: str
    last_seen: datetime | None
    last_source: str
    last_level: str
    checker_errors: int
    stale: bool

    @property
    def broken(self) -> bool:
        """Checking, but the checker could not look (config, sources, its own state), or
        the historian cannot use what it sends (its clock is wrong)."""
        return (self.last_level in (Level.CHECKER_ERROR.label, CLOCK_SKEW)
                or self.checker_errors > 0)


def believed_now(engine, now: datetime, lead: timedelta) -> tuple[datetime, str]:
    """The moment a management command that acts on elapsed time (a prune's cut, a suspect
    episode's expiry) may take as now (naive UTC), and why it is not `now` ("" when it is).
    This host's clock is believed up to the database server's (PostgreSQL: another host's, as
    delivery judges the nodes' stamps) and up to `lead` past the newest row the historian
    holds (a live fleet's heartbeat is minutes old): a clock jumped years ahead must not
    delete the fleet's history or end every suspect episode at once. An idle historian's
    commands just wait for data before time moves on for them."""
    from rsc_health.historian.db import historian_now

    c, j = schema.check_results, schema.jobs
    with engine.connect() as conn:
        server = historian_now(conn)
        # Indexed columns, and node_runs (a row per node and source, moved by every
        # heartbeat): the suspects pass asks this every minute. Not step_times: a user's
        # file writes those times (a line stamped at a jumped clock's time vouched for it).
        newest = [conn.execute(select(func.max(col))).scalar()
                  for col in (c.c.time, j.c.end, R.c.last_seen)]
    moment, why = now, ""
    if engine.dialect.name == "postgresql" and server + timedelta(minutes=5) < moment:
        moment, why = server, f"the database server's clock says {server:%Y-%m-%d %H:%M}"
    known = [t for t in newest if t is not None]
    if known and max(known) + lead < moment:
        moment = max(known) + lead
        why = (f"the newest row the historian holds is from {max(known):%Y-%m-%d %H:%M}"
               + (f" and {why}" if why else ""))
    if why:
        why = (f"this host's clock says {now:%Y-%m-%d %H:%M} but {why}: acting as of "
               f"{moment:%Y-%m-%d %H:%M} (a clock jump must not act on time that did not pass)")
    return moment, why


def believable(time: datetime, received: datetime, *, seen: datetime | None = None) -> bool:
    """A node-path stamp (naive UTC) the historian can fold, as of its own clock `received`;
    `seen`: the node's newest heartbeat on record (last_seen()), CLOCK_BEHIND_S before which
    no stamp of it is believed."""
    oldest = CLOCK_FLOOR if seen is None else max(
        CLOCK_FLOOR, seen - timedelta(seconds=CLOCK_BEHIND_S))
    return oldest <= time <= received + timedelta(seconds=CLOCK_AHEAD_S)


def last_seen(conn: Connection, nodes: Iterable[str], received: datetime
              ) -> dict[str, datetime]:
    """Each node's newest heartbeat delivered with a believed stamp (node_runs by its key, the
    wrong clocks' rows aside: theirs is the historian's receive time), no later than
    `received` + CLOCK_AHEAD_S: a row an earlier release believed from a year ahead, or one a
    SQLite historian's host wrote while its own clock was ahead, must not refuse the node's
    right stamps for a year."""
    out: dict[str, datetime] = {}
    cap = received + timedelta(seconds=CLOCK_AHEAD_S)
    for (node, source), seen in _runs(conn, nodes).items():
        if source != CLOCK_SOURCE and seen is not None:
            out[node] = min(max(seen, out.get(node, seen)), cap)
    return out


def _runs(conn: Connection, nodes: Iterable[str]) -> dict[tuple[str, str], datetime]:
    """node_runs' last_seen of these nodes, by (node, source): its key, 500 nodes a query."""
    names = sorted(set(nodes))
    out: dict[tuple[str, str], datetime] = {}
    for i in range(0, len(names), 500):
        out.update({(n, s): t for n, s, t in conn.execute(_RUNS_Q,
                                                          {"nodes": names[i : i + 500]})})
    return out


def record_runs(conn: Connection, beats: Iterable[Heartbeat],
                clocks: dict[str, Heartbeat | None] | None = None) -> int:
    """Fold heartbeats into node_runs and heartbeat_days; returns how many were new.

    A heartbeat no newer than the stored run of its (node, source) is a redelivery or late:
    it changes nothing, so delivery stays exactly-once for the counts too.

    `clocks`: per node, what its latest heartbeat of this delivery said of its clock: a
    Heartbeat stamped with the historian's receive time when that heartbeat's own time was
    unbelievable (the node's `clock` row is written), None when it was believable (a `clock`
    row from an earlier delivery is removed: the node's clock is right again)."""
    beats = sorted(beats, key=lambda b: (b.node, b.source, b.time))
    clocks = clocks or {}
    if not beats and not clocks:
        return 0
    latest = _runs(conn, {b.node for b in beats} | set(clocks))
    _record_clocks(conn, clocks, latest)
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
        d[1] += b.level == Level.CHECKER_ERROR.label
        d[2] += b.level in (Level.DRAIN_NOW.label, Level.DRAIN_AFTER_JOB.label)
    if newest:
        _upsert_runs(conn, [(b, b.source, b.level) for b in newest.values()])
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


_FORGET_CLOCK = delete(R).where(R.c.source == CLOCK_SOURCE,
                                R.c.node.in_(bindparam("nodes", expanding=True)))


def _record_clocks(conn: Connection, clocks: dict[str, Heartbeat | None],
                   latest: dict[tuple[str, str], datetime]) -> None:
    """Write the `clock` rows of nodes whose clock is wrong, drop those of nodes whose clock
    is right again; no statement at all in the usual flush (no clock row, none to write)."""
    right = sorted(n for n, b in clocks.items() if b is None and (n, CLOCK_SOURCE) in latest)
    for i in range(0, len(right), 500):
        conn.execute(_FORGET_CLOCK, {"nodes": right[i : i + 500]})
    wrong = [b for b in clocks.values() if b is not None]
    if not wrong:
        return
    # Not counted in heartbeat_days: the run's day is unknown, and a redelivered batch would
    # count it twice (its receive time is new each time).
    _upsert_runs(conn, [(b, CLOCK_SOURCE, CLOCK_SKEW) for b in wrong])


_RUN_COLUMNS = ("node", "source", "last_seen", "level", "checker_errors", "duration_s",
                "version")


def _upsert_runs(conn: Connection, runs: list[tuple[Heartbeat, str, str]]) -> None:
    """node_runs rows from (heartbeat, source, level): a row is replaced only by a newer run."""
    quote = conn.dialect.identifier_preparer.quote
    cols = _RUN_COLUMNS
    conn.execute(
        text(
            f"INSERT INTO node_runs ({', '.join(quote(c) for c in cols)}) VALUES "
            f"({', '.join(':' + c for c in cols)}) ON CONFLICT (node, source) DO UPDATE SET "
            + ", ".join(f"{quote(c)} = excluded.{quote(c)}" for c in cols[2:])
            + " WHERE excluded.last_seen > node_runs.last_seen"
        ),
        [{"node": b.node, "source": source, "last_seen": db_time(b.time), "level": level,
          "checker_errors": b.checker_errors, "duration_s": b.duration_s, "version": b.version}
         for b, source, level in runs],
    )


def node_freshness(
    engine: Engine, now: datetime, stale_after_s: float, nodes: Iterable[str] | None = None
) -> list[NodeFreshness]:
    """Every node the historian has heard from (or those named), newest run first per node.

    Cost: node_runs (a row per node and entry point), plus index probes into check_results
    for the nodes without a heartbeat; never a pass over check_results, which holds a year
    of intervals (10M rows took a full GROUP BY 4-9 s per call, for `healthctl node` too)."""
    if now.tzinfo is not None:
        from rsc_health.compat import UTC

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


@dataclass(frozen=True)
class HungProbe:
    node: str
    probe: str  # the finding's component: a mount's path, or "nvml"
    codes: tuple[str, ...]  # model.HUNG_CODES open for it (nvml_hung, then nvml_wedged too)
    since: datetime  # naive UTC: when the earliest of them opened
    last_seen: datetime


def hung_probes(engine: Engine, now: datetime, stale_after_s: float) -> list[HungProbe]:
    """Nodes whose probes keep hanging (a mount's statvfs, NVML): open intervals of a
    model.HUNG_CODES finding that a run still saw within stale_after_s. A node behind the
    mass-drain guard, or whose NVML is only a checker error yet, is named here. Reads the open
    intervals only (the partial index ix_check_results_open)."""
    from rsc_health.model import HUNG_CODES

    if now.tzinfo is not None:
        from rsc_health.compat import UTC

        now = now.astimezone(UTC).replace(tzinfo=None)
    c = schema.check_results
    q = (select(c.c.node, c.c.component, c.c.code, c.c.time, c.c.last_seen)
         .where(c.c.is_open, c.c.code.in_(sorted(HUNG_CODES)),
                c.c.last_seen >= now - timedelta(seconds=stale_after_s)))
    found: dict[tuple[str, str], list] = {}
    with engine.connect() as conn:
        for node, component, code, began, seen in conn.execute(q):
            codes, first, last = found.get((node, component), ((), began, seen))
            found[(node, component)] = [(*codes, code), min(first, began), max(last, seen)]
    return [HungProbe(node, probe, tuple(sorted(codes)), first, last)
            for (node, probe), (codes, first, last) in sorted(found.items())]


def stale_after_s(cfg) -> float:
    """[historian] stale_after_s of a Config: how old a node's newest run may be."""
    return float(cfg.get("historian.stale_after_s"))

