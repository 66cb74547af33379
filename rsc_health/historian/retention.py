"""Retention: what the historian forgets, and when (`healthctl db prune`).

The node path's rows are the volume: closed check intervals, actions, job exclusions. They are
kept `[historian] retention_days` (400: a year plus the lemon history window) and then
deleted; the daily rollups (`heartbeat_days`, `check_days`,
`telemetry_day_rollups`) keep their counts for
`rollup_retention_days` (0 = forever), so a report over years does not need the rows.
Telemetry samples (`telemetry_samples`) are kept `telemetry_retention_days` (3), and so are
the nodes' prolog and epilog times (`job_starts`, `job_ends`) that say which job they belong
to; their per-job rollups go with their job. Open intervals are never pruned: they are the
node's current state, however old. Jobs and node events stay unless `jobs_retention_days` is set:
the paper's metrics need a year. Jobs' step times (`step_times`, fail-slow evidence) go after
`[failslow] steps_retention_days`.

The big tables are pruned a day of rows per transaction, each under the historian's statement
timeout like any other command: a prune cut short (a row locked elsewhere, a kill, a lost
database) keeps what it deleted and the next run goes on from there, and no transaction holds
a year of deleted rows (one did: under a 3600 s timeout of its own, a lock held it for an hour
and its rollback threw away everything it had done).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

from sqlalchemy import ColumnElement, Engine, Table, and_, delete, func, select
from sqlalchemy.exc import DBAPIError

from rsc_health.config import packaged_default
from rsc_health.historian import schema
from rsc_health.historian.db import HistorianError, HistorianFrozen, first_line, writer

# Rows of one day of the time column per transaction (a day of a 16,000-node fleet's check
# intervals is well under a second to delete).
WINDOW = timedelta(days=1)
# How far past the newest row the historian holds `healthctl db prune` believes the clock.
PRUNE_CLOCK_LEAD = timedelta(days=7)


class PruneStopped(HistorianError):
    """A prune ended before it was done; what it deleted so far stays deleted."""


@dataclass(frozen=True)
class Retention:
    days: int = packaged_default("historian.retention_days")
    rollup_days: int = packaged_default("historian.rollup_retention_days")
    jobs_days: int = packaged_default("historian.jobs_retention_days")
    steps_days: int = packaged_default("failslow.steps_retention_days")
    telemetry_days: int = packaged_default("historian.telemetry_retention_days")

    @classmethod
    def from_config(cls, cfg) -> Retention:
        if cfg is None:
            return cls()
        return cls(int(cfg.get("historian.retention_days")),
                   int(cfg.get("historian.rollup_retention_days")),
                   int(cfg.get("historian.jobs_retention_days")),
                   int(cfg.get("failslow.steps_retention_days")),
                   int(cfg.get("historian.telemetry_retention_days")))


    def events_start(self, first_start: str, now: datetime) -> str:
        """Start= for reading node events from Slurm: `first_start`, or the jobs retention's
        cut when that is later. Prune deletes the events that ended before the cut; reading
        them from 1970 again every night would put them back, for the next prune to delete
        again. sacctmgr still lists an event that began before the cut and ended after it
        (or is open), and prune keeps exactly those."""
        if self.jobs_days <= 0:
            return first_start
        cut = now - timedelta(days=self.jobs_days)
        try:
            first = datetime.fromisoformat(first_start)
        except ValueError:
            first = None  # sacctmgr's own forms (now-7days...): leave them to it
        if first is not None and first.tzinfo is not None:
            first = first.astimezone(UTC).replace(tzinfo=None)
        if first is None or first >= cut:
            return first_start
        return cut.strftime("%Y-%m-%dT%H:%M:%S")


@dataclass(frozen=True)
class _Step:
    """What one table loses: rows matching `where`. With `column` (indexed, and every row
    matching `where` has column < `upper`) the rows go a WINDOW of that column at a time;
    without, in one statement (small tables whose time column no index leads)."""

    name: str
    table: Table
    where: ColumnElement
    column: ColumnElement | None = None
    upper: datetime | date | None = None
    window: timedelta = WINDOW


def _plan(now: datetime, r: Retention) -> list[_Step]:
    """Everything past its retention, table by table."""
    out = []
    if r.days > 0:
        cut = now - timedelta(days=r.days)
        c, a, x = schema.check_results, schema.node_actions, schema.job_exclusions
        # A closed interval last seen before the cut began before it (time <= last_seen).
        out += [
            _Step("check_results", c, c.c.is_open.is_(False) & (c.c.last_seen < cut),
                  c.c.time, cut),
            _Step("node_actions", a, a.c.time < cut),
            _Step("job_exclusions", x, x.c.time < cut),
        ]
    if r.rollup_days > 0:
        day = (now - timedelta(days=r.rollup_days)).date()
        for t in (schema.heartbeat_days, schema.check_days, schema.telemetry_day_rollups):
            out.append(_Step(t.name, t, t.c.day < day, t.c.day, day))
    if r.steps_days > 0:
        cut = now - timedelta(days=r.steps_days)
        st = schema.step_times
        out.append(_Step("step_times", st, st.c.time < cut, st.c.time, cut))
    if r.telemetry_days > 0:
        # Telemetry samples: the fail-slow detector's window, days not a year. An hour of a
        # 16,000-node fleet's samples (about two million rows) per transaction.
        cut = now - timedelta(days=r.telemetry_days)
        t = schema.telemetry_samples
        out.append(_Step(t.name, t, t.c.time < cut, t.c.time, cut, timedelta(hours=1)))
        # Each node's epilog times (job_ends) bound which job the samples are judged in: kept
        # as long as the samples, and while a run of their job is still open in the
        # historian (a runaway job slurmdbd holds RUNNING: its epilogs end it on each node;
        # pruned, it ran again there and hid every later job's slow node, helper-111).
        e, j = schema.job_ends, schema.jobs
        still_open = (select(j.c.id).where(j.c.job_id == e.c.job_id, j.c.end.is_(None),
                                           j.c.start <= e.c.time).exists())
        out.append(_Step(e.name, e, and_(e.c.time < cut, ~still_open), e.c.time, cut))
        b = schema.job_starts  # their prolog times: read only until sacct tells of the job
        out.append(_Step(b.name, b, b.c.time < cut, b.c.time, cut))
    if r.jobs_days > 0:
        cut = now - timedelta(days=r.jobs_days)
        j, e = schema.jobs, schema.node_events
        # job_nodes and attributions go with their job (ON DELETE CASCADE).
        out += [_Step("jobs", j, j.c.end < cut, j.c.end, cut),
                _Step("node_events", e, e.c.end < cut)]
    return out


def prune_moment(engine: Engine, now: datetime) -> tuple[datetime, str]:
    """The moment `healthctl db prune` cuts from (naive UTC), and why it is not `now` ("" when
    it is): the cut deletes what is `retention_days` older than it, so a clock years ahead (a
    bad NTP answer, an RTC reset to a far date) deleted the whole history, which no node can
    send again. freshness.believed_now, PRUNE_CLOCK_LEAD past the newest row."""
    from rsc_health.historian.freshness import believed_now

    return believed_now(engine, now, PRUNE_CLOCK_LEAD)


def prune(engine: Engine, now: datetime, retention: Retention, *, dry_run: bool = False
          ) -> dict[str, int]:
    """Rows deleted (or, with dry_run, that would be) per table. PruneStopped when a
    transaction fails (its statement timeout, a lost database): the message says how far it
    got, and every transaction before it stays committed."""
    counts: dict[str, int] = {}
    for step in _plan(now, retention):
        counts[step.name] = 0
        try:
            if dry_run:
                with engine.connect() as conn:
                    counts[step.name] = int(conn.execute(
                        select(func.count()).select_from(step.table).where(step.where)
                    ).scalar() or 0)
            else:
                _delete(engine, step, counts)
        except (DBAPIError, HistorianFrozen) as exc:
            done = ", ".join(f"{n} {t}" for t, n in counts.items() if n) or "nothing"
            raise PruneStopped(
                f"prune stopped in {step.name} (deleted so far, and kept: {done}; the next "
                f"run goes on from there): {first_line(exc)}") from exc
    return counts


def _delete(engine: Engine, step: _Step, counts: dict[str, int]) -> None:
    if step.column is None:
        with writer(engine).begin() as conn:
            counts[step.name] += int(conn.execute(delete(step.table).where(step.where))
                                     .rowcount or 0)
        return
    col, upper = step.column, step.upper
    with engine.connect() as conn:
        lo = conn.execute(select(func.min(col))).scalar()
    # Each window's transaction also finds the next (an index probe: years without rows, or
    # a node's 1970 clock, cost one step, not one per empty day).
    while lo is not None and lo < upper:
        hi = min(lo + step.window, upper)
        with writer(engine).begin() as conn:
            counts[step.name] += int(conn.execute(
                delete(step.table).where(step.where, col >= lo, col < hi)).rowcount or 0)
            lo = conn.execute(select(func.min(col)).where(col >= hi)).scalar()


