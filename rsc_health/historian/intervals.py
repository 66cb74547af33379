"""Check results as state: fold the node path's per-run records into intervals.

Every prolog, epilog and sweep reports, per check family it ran, either one all-clear record
(component "*", status ok) or one record per component that is not ok. Stored as they come,
that is 7-8 rows per node every five minutes (32M rows a day at 16,000 nodes) saying the same
thing. Here each run is folded into `check_results` intervals instead:

- a family the run looked at, whose component is in the same state as its open interval
  (same status, severity and code): the interval's `last_seen` moves to the run's time;
- a component in a new state: its open interval closes and a new one opens, keyed by the
  record that saw it first (so redelivering that record lands nothing twice);
- an open interval of a family the run looked at, whose component the run no longer reports
  (the family is all clear, or other components fail now): it closes.
- Events are not states: an XID record is news, each one its own closed point.
- Checker errors (family `checker`: the node could not look) are the one family no run reports
  as all clear: a clean run has no checker finding at all. Each entry point runs the same
  families every time, so a run reporting no such error closes the open checker intervals of
  its own entry point (`source`): a clean sweep closes a sweep's error, and a prolog, which runs
  fewer families, neither closes a sweep's error nor makes it flap. A bad config is the whole
  node's (every entry point reads the one file): any run that got past it closes it.

A run is the records of one node with one time (the node path stamps every record of a run
with the same time). A run no newer than what a family's open intervals already saw is a
redelivery or a late arrival: it changes no state, so delivering a batch twice, or a batch
cut short and delivered again, gives the same table. A source-scoped family whose error a
clean run closed has no open interval to say so: there a run no newer than the last sighting
of its latest closed interval (of the run's entry point, or node-wide) is the stale one, and
an interval's `last_seen` never moves back.

Readers ask for "failing around time T" as overlap: `time <= T_hi AND last_seen >= T_lo`.
Per-sweep numeric telemetry (clocks, power, link throughput) does not belong here: it would
change every sweep. It goes to its own table, rolled up per node-day like `heartbeat_days`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import Connection, and_, bindparam, func, select, text, update

from rsc_health.historian import schema
from rsc_health.historian.db import TURNS_CHECK_INTERVALS, take_turns
from rsc_health.historian.ingest import bulk_write, db_time
from rsc_health.model import Severity, Status

C = schema.check_results
EVENT_CHECKS = frozenset({"xid"})
# Families whose state each entry point reports whole, in every run (see the module's doc).
SOURCE_SCOPED = frozenset({"checker"})
# Their codes that say something of the whole node, not of one entry point's look
# (node.exits.broken_config: the config every entry point reads).
NODE_WIDE_CODES = frozenset({"config_error"})
# Nodes per query when loading open intervals (bound parameters stay well under limits).
_NODES_PER_QUERY = 500


@dataclass(frozen=True)
class CheckRecord:
    """One spool `check` record, parsed (times naive UTC)."""

    id: str
    time: datetime
    node: str
    source: str
    job_id: str | None
    check: str
    component: str
    status: str
    severity: str
    code: str
    reason: str

    @property
    def state(self) -> tuple[str, str, str]:
        return (self.status, self.severity, self.code)


@dataclass
class _Open:
    id: str
    component: str
    state: tuple[str, str, str]
    last_seen: datetime
    source: str


@dataclass
class FoldReport:
    opened: int = 0
    extended: int = 0
    closed: int = 0
    events: int = 0
    stale_runs: int = 0
    new_by_day: dict[tuple, list[int]] = field(default_factory=dict)


def _row(r: CheckRecord, *, is_open: bool) -> tuple:
    return (r.id, db_time(r.time), r.node, r.source, r.job_id, r.check, r.component, r.status,
            r.severity, r.code, r.reason, db_time(r.time), is_open)


COLUMNS = ("id", "time", "node", "source", "job_id", "check", "component", "status",
           "severity", "code", "reason", "last_seen", "is_open")


# Built once: a node's flush runs these every few minutes on every node of the fleet, and
# building the statement cost more than running it.
_OPEN_Q = select(C.c.id, C.c.node, C.c.check, C.c.component, C.c.status, C.c.severity,
                 C.c.code, C.c.last_seen, C.c.source).where(
    schema.open_interval(), C.c.node.in_(bindparam("nodes", expanding=True)))
# One statement per run time, not one per interval: a node's flush extends its eight
# all-clear families to the same latest sweep, and every statement costs the database host
# (and a PgBouncer in front) more than the row it changes.
# Never back: an interval a redelivered run names (its first record's id) may have been seen
# later than that run already.
_EXTEND = update(C).where(C.c.id.in_(bindparam("ids", expanding=True)),
                          C.c.last_seen < bindparam("seen")).values(
    last_seen=bindparam("seen"))
_CLOSE = update(C).where(C.c.id.in_(bindparam("ids", expanding=True))).values(is_open=False)


def _load_open(conn: Connection, nodes: list[str]) -> dict[tuple[str, str], list[_Open]]:
    out: dict[tuple[str, str], list[_Open]] = defaultdict(list)
    for i in range(0, len(nodes), _NODES_PER_QUERY):
        rows = conn.execute(_OPEN_Q, {"nodes": nodes[i : i + _NODES_PER_QUERY]})
        for rid, node, check, comp, status, sev, code, last, source in rows:
            out[(node, check)].append(_Open(rid, comp, (status, sev, code), last, source))
    return out


def fold(conn: Connection, records: Iterable[CheckRecord]) -> FoldReport:
    """Apply check records (any order, any mix of nodes) to the intervals, in one transaction
    of the caller's. Idempotent: applying the same records again changes nothing."""
    runs: dict[tuple[str, datetime], list[CheckRecord]] = defaultdict(list)
    for r in records:
        runs[(r.node, r.time)].append(r)
    if not runs:
        return FoldReport()
    nodes = sorted({node for node, _ in runs})
    # Two folds of one node take turns: otherwise both read its open intervals before either
    # wrote, both closed the same one and each opened its own (two open failures where the
    # newest run saw one).
    take_turns(conn, TURNS_CHECK_INTERVALS, nodes)
    state = _load_open(conn, nodes)
    last_event = _last_events(conn, sorted({
        (r.node, r.check) for recs in runs.values() for r in recs
        if r.check in EVENT_CHECKS and not state.get((r.node, r.check))}))
    last_closed = _last_closed(conn, sorted({
        r.node for recs in runs.values() for r in recs
        if r.check in SOURCE_SCOPED and not _scoped(state.get((r.node, r.check), []),
                                                    r.check, {r.source})[0]}))
    folding = _Folding(state, last_event, last_closed)
    for (node, when), recs in sorted(runs.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        folding.run(node, when, recs)
    return folding.write(conn)


class _Folding:
    """One fold's work: the open intervals by (node, family) as the runs move them, and what
    to write (rows to insert, intervals to extend to a time, ids to close)."""

    def __init__(self, state: dict[tuple[str, str], list[_Open]],
                 last_event: dict[tuple[str, str], datetime],
                 last_closed: dict[tuple[str, str], list[tuple[str, str, datetime]]]):
        self.state, self.last_event, self.last_closed = state, last_event, last_closed
        self.report = FoldReport()
        self.inserts: list[tuple] = []
        self.news: dict[str, CheckRecord] = {}  # failures and events this fold may count
        self.extend: dict[str, datetime] = {}
        self.close: set[str] = set()

    def run(self, node: str, when: datetime, recs: list[CheckRecord]) -> None:
        """One run's records (one node, one time), family by family."""
        by_family: dict[str, list[CheckRecord]] = defaultdict(list)
        for r in recs:
            by_family[r.check].append(r)
        sources = {r.source for r in recs}
        for family in SOURCE_SCOPED:
            if self.state.get((node, family)):
                by_family.setdefault(family, [])  # no record is its all clear
        for family, frecs in by_family.items():
            self.family(node, when, family, frecs, sources)

    def family(self, node: str, when: datetime, family: str, frecs: list[CheckRecord],
               sources: set[str]) -> None:
        current, others = _scoped(self.state[(node, family)], family, sources)
        seen = max((o.last_seen for o in current), default=None)
        if seen is None and family in SOURCE_SCOPED:
            # A clean run closed this entry point's error: nothing open says how far it was
            # seen, its closed interval does. Without this floor a flush cut between chunks
            # and delivered again reopened the error from the batch's first run (moving the
            # closed interval's last_seen back) and opened a second one (helper-116).
            seen = max((last for source, code, last in self.last_closed.get((node, family), [])
                        if source in sources or code in NODE_WIDE_CODES), default=None)
        # An event closes the family's intervals and opens none: then a run before the
        # latest event is the stale one (else an old run would reopen state). Its own run
        # is not: its events are keyed, and a same-time record new to the table lands.
        event = self.last_event.get((node, family)) if seen is None else None
        if (seen is not None and when <= seen) or (event is not None and when < event):
            self.report.stale_runs += 1
            return
        wanted = self._wanted(family, frecs)
        keep = self._carry(current, wanted, when)
        keep.extend(self._open(wanted, others, when))
        self.state[(node, family)] = keep + others

    def _wanted(self, family: str, frecs: list[CheckRecord]) -> dict[str, CheckRecord]:
        """The state each component should be in (its first record); events are inserted
        closed as they come."""
        wanted: dict[str, CheckRecord] = {}
        for r in frecs:
            if family in EVENT_CHECKS and r.status != Status.OK:
                self.inserts.append(_row(r, is_open=False))
                self.report.events += 1
                self.news[r.id] = r
            else:
                wanted.setdefault(r.component, r)
        return wanted

    def _carry(self, current: list[_Open], wanted: dict[str, CheckRecord],
               when: datetime) -> list[_Open]:
        """Extend each open interval the run still sees in the same state (taking it out of
        `wanted`), close the others; the ones kept open."""
        keep: list[_Open] = []
        for o in current:
            r = wanted.get(o.component)
            if r is not None and r.state == o.state:
                o.last_seen = when
                self.extend[o.id] = when
                keep.append(o)
                del wanted[o.component]
            else:
                # Closed at its last sighting (an extension earlier in this fold stays).
                self.close.add(o.id)
                self.report.closed += 1
        return keep

    def _open(self, wanted: dict[str, CheckRecord], others: list[_Open],
              when: datetime) -> list[_Open]:
        """Open an interval for each state still wanted, unless another entry point's open
        one already says the same (then that one is extended)."""
        opened: list[_Open] = []
        for comp, r in wanted.items():
            twin = next((o for o in others if o.component == comp and o.state == r.state),
                        None)
            if twin is not None:  # the same error another entry point saw: one interval
                if when > twin.last_seen:
                    twin.last_seen = self.extend[twin.id] = when
                continue
            self.inserts.append(_row(r, is_open=True))
            opened.append(_Open(r.id, comp, r.state, when, r.source))
            self.report.opened += 1
            if r.status != Status.OK:
                self.news[r.id] = r
        return opened

    def write(self, conn: Connection) -> FoldReport:
        report = self.report
        report.extended = len(self.extend)
        # Count only what this fold really adds: an event read again (a cursor that could not
        # be saved, a batch delivered twice) carries the id it had the first time and is
        # already here.
        for rid in _existing(conn, sorted(self.news)):
            del self.news[rid]
        for r in self.news.values():
            _count_new(report, r)
        bulk_write(conn, C, COLUMNS, self.inserts, conflict=("id",))
        by_time: dict[datetime, list[str]] = defaultdict(list)
        for rid, seen in self.extend.items():
            by_time[seen].append(rid)
        for seen, rids in sorted(by_time.items()):
            for i in range(0, len(rids), _NODES_PER_QUERY):
                conn.execute(_EXTEND, {"ids": sorted(rids[i : i + _NODES_PER_QUERY]),
                                       "seen": seen})
        closing = sorted(self.close)
        for i in range(0, len(closing), _NODES_PER_QUERY):
            conn.execute(_CLOSE, {"ids": closing[i : i + _NODES_PER_QUERY]})
        _rollup_checks(conn, report.new_by_day)
        return report


def _scoped(current: list[_Open], family: str,
            sources: set[str]) -> tuple[list[_Open], list[_Open]]:
    """(the intervals a run of these entry points judges, the ones it leaves): another entry
    point's intervals of a source-scoped family are left as they are, this run did not look
    where they were seen."""
    if family not in SOURCE_SCOPED:
        return current, []
    mine = [o for o in current if o.source in sources or o.state[2] in NODE_WIDE_CODES]
    return mine, [o for o in current if o not in mine]


_CLOSED_Q = select(C.c.node, C.c.check, C.c.source, C.c.code, func.max(C.c.last_seen)).where(
    C.c.node.in_(bindparam("nodes", expanding=True)),
    C.c.check.in_(sorted(SOURCE_SCOPED)), C.c.is_open.is_(False),
).group_by(C.c.node, C.c.check, C.c.source, C.c.code)


def _last_closed(conn: Connection,
                 nodes: list[str]) -> dict[tuple[str, str], list[tuple[str, str, datetime]]]:
    """Per (node, source-scoped family): (source, code, latest last_seen) of its closed
    intervals; only asked for nodes with such a record and no open interval of its entry
    point (an error after a clean run, or a redelivery), so a normal flush pays nothing."""
    out: dict[tuple[str, str], list[tuple[str, str, datetime]]] = defaultdict(list)
    for i in range(0, len(nodes), _NODES_PER_QUERY):
        rows = conn.execute(_CLOSED_Q, {"nodes": nodes[i : i + _NODES_PER_QUERY]})
        for node, check, source, code, last in rows:
            out[(node, check)].append((source, code, last))
    return out


_EVENTS_Q = select(C.c.node, C.c.check, func.max(C.c.time)).where(
    C.c.node.in_(bindparam("nodes", expanding=True)),
    C.c.check.in_(sorted(EVENT_CHECKS)), C.c.is_open.is_(False), C.c.status != Status.OK,
).group_by(C.c.node, C.c.check)


def _last_events(conn: Connection, keys: list[tuple[str, str]]) -> dict[tuple[str, str], datetime]:
    """The latest stored event of each (node, event family) that has no open interval; only
    asked for those (rare: a node whose last run saw an XID), so a normal flush pays nothing."""
    if not keys:
        return {}
    nodes = sorted({node for node, _ in keys})
    out: dict[tuple[str, str], datetime] = {}
    for i in range(0, len(nodes), _NODES_PER_QUERY):
        rows = conn.execute(_EVENTS_Q, {"nodes": nodes[i : i + _NODES_PER_QUERY]})
        out.update({(node, check): last for node, check, last in rows})
    return out


_EXISTING_Q = select(C.c.id).where(C.c.id.in_(bindparam("ids", expanding=True)))


def _existing(conn: Connection, ids: list[str]) -> set[str]:
    found: set[str] = set()
    for i in range(0, len(ids), _NODES_PER_QUERY):
        found.update(conn.execute(_EXISTING_Q, {"ids": ids[i : i + _NODES_PER_QUERY]}).scalars())
    return found


def _count_new(report: FoldReport, r: CheckRecord) -> None:
    key = (r.time.date(), r.node, r.check)
    counts = report.new_by_day.setdefault(key, [0, 0])
    counts[0 if r.status in (Status.FAIL, Status.ERROR) else 1] += 1


def _rollup_checks(conn: Connection, new_by_day: dict[tuple, list[int]]) -> None:
    """check_days += the failure/warning intervals and events that began (exactly once: a
    record only counts here when it opened a row, and a redelivered run is stale)."""
    if not new_by_day:
        return
    t = schema.check_days
    quote = conn.dialect.identifier_preparer.quote
    name = quote(t.name)
    cols = ("day", "node", "check", "fail", "warn")
    placeholders = ", ".join(f":{c}" for c in cols)
    sql = (
        f"INSERT INTO {name} ({', '.join(quote(c) for c in cols)}) VALUES ({placeholders}) "
        f"ON CONFLICT (day, node, {quote('check')}) DO UPDATE SET "
        f"{quote('fail')} = {name}.{quote('fail')} + excluded.{quote('fail')}, "
        f"warn = {name}.warn + excluded.warn"
    )
    conn.execute(text(sql), [
        {"day": day, "node": node, "check": check, "fail": f, "warn": w}
        for (day, node, check), (f, w) in new_by_day.items()
    ])


def open_failures(conn: Connection, node: str | None = None) -> list[dict]:
    """The current non-ok states (open intervals), most severe first."""
    q = select(C).where(schema.open_interval(), C.c.status != Status.OK)
    if node is not None:
        q = q.where(C.c.node == node)
    rows = [dict(r._mapping) for r in conn.execute(q)]
    return sorted(rows, key=lambda r: (-_rank(r["severity"]), r["node"], r["check"]))


def _rank(word: str) -> int:
    """A stored severity word's rank on the one scale (model.Level); below all for a word
    that is not one."""
    try:
        return int(Severity.parse(word or ""))
    except KeyError:
        return -1


def overlapping(lo_col, hi_col):
    """SQL condition: a check_results interval overlaps [lo, hi] (columns or values)."""
    return and_(C.c.time <= hi_col, C.c.last_seen >= lo_col)
