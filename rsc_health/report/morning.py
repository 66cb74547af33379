"""What the on-call operator reads first: the headline r_f and its weekly change, nodes out of
service, how long each lemon candidate has been listed and its ticket, nodes whose checks
stopped, XIDs per GPU, and how fresh each input is.

Everything comes from the historian (never from Slurm: the report runs where Slurm may not be
reachable, and must show what the historian knows). Each query is bounded by a time window on
an indexed column or reads a table that holds one row per node, so the cost does not grow with
the years of history kept.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pandas as pd
from sqlalchemy import Engine, func, literal, or_, select

from rsc_health.historian import schema
from rsc_health.model import DRAIN_KINDS, ActionKind, Status
from rsc_health.report.data import SectionEmpty, empty_frame

WEEK = timedelta(days=7)
HOUR_S = 3600.0
# node_actions words that take a node out of service ("drain": lemon drains written before
# ActionKind existed) and the one that brings it back. would_drain (shadow mode) changes nothing.
OUT_ACTIONS = tuple(sorted(k.value for k in DRAIN_KINDS)) + ("drain",)
# A qualification pass resumes the node into service too (the reservation goes).
BACK_ACTIONS = (ActionKind.RESUME.value, ActionKind.QUALIFY_RELEASE.value)


def _hours(now: datetime, then: datetime | None) -> float:
    if then is None:
        return math.nan
    return max(0.0, (now - then).total_seconds() / HOUR_S)


def _has_rows(engine: Engine, table) -> bool:
    with engine.connect() as conn:
        return conn.execute(select(literal(1)).select_from(table).limit(1)).first() is not None


# --- 1. headline r_f and its weekly change ----------------------------------------------------


def weekly_rates(
    engine: Engine,
    as_of: datetime,
    failure_rate: Callable,
    *,
    large_job_gpus: int,
    long_days: float,
    confidence: float = 0.9,
) -> pd.DataFrame:
    """r_f per 1000 node-days over the latest 7 days, the 7 before them and the metrics window.

    `failure_rate` is rsc_health.historian.metrics.rates.failure_rate (passed in so importing
    this module does not pull in scipy). Each period is one indexed range on jobs.end."""
    from rsc_health.historian.metrics._sql import Window

    periods = (
        ("last 7 days", as_of - WEEK, as_of),
        ("previous 7 days", as_of - 2 * WEEK, as_of - WEEK),
        (f"last {long_days:g} days", as_of - timedelta(days=long_days), as_of),
    )
    rows = []
    for name, since, until in periods:
        fr = failure_rate(engine, Window(since=since, until=until), large_job_gpus, confidence)
        per = fr.per_1000()
        rows.append({"period": name, "since": since, "until": until, "failures": fr.failures,
                     "node_days": fr.node_days, "jobs": fr.jobs, "r_f": per["r_f"],
                     "ci_low": per["ci_low"], "ci_high": per["ci_high"],
                     "confidence": confidence})
    frame = pd.DataFrame(rows)
    if not (frame["node_days"] > 0).any():
        raise SectionEmpty(
            f"no r_f yet: no job over {large_job_gpus} GPUs ended in the last {long_days:g} "
            "days, so there are no node-days to divide by")
    return frame


@dataclass(frozen=True)
class RateChange:
    """The latest week's r_f against the week before, per 1000 node-days."""

    delta: float
    p_value: float  # two-sided, conditional binomial test of two Poisson counts
    words: str


def rate_change(rates: pd.DataFrame) -> RateChange | None:
    """None when either week has no node-days (nothing to compare)."""
    if rates.empty or len(rates) < 2:
        return None
    week, prev = rates.iloc[0], rates.iloc[1]
    e1, e2 = float(week["node_days"]), float(prev["node_days"])
    if not (e1 > 0 and e2 > 0):
        return None
    n1, n2 = int(week["failures"]), int(prev["failures"])
    delta = float(week["r_f"]) - float(prev["r_f"])
    if n1 + n2 == 0:
        return RateChange(0.0, 1.0, "no failures in either week")
    from scipy import stats

    # Given n1 + n2 failures, n1 is Binomial(n1 + n2, e1 / (e1 + e2)) when the rate is the same.
    p = float(stats.binomtest(n1, n1 + n2, e1 / (e1 + e2)).pvalue)
    direction = "up" if delta > 0 else "down" if delta < 0 else "unchanged"
    verdict = "a real change" if p < 0.1 else "within noise"
    return RateChange(delta, p, f"{direction} {abs(delta):.2f} ({verdict}, p = {p:.2f})")


# --- 2. nodes out of service now --------------------------------------------------------------


def out_of_service(engine: Engine, as_of: datetime, lookback_days: float = 30) -> pd.DataFrame:
    """Nodes out of service at `as_of`, newest outage first: Slurm's node events reconciled with
    rsc-health's own actions, which the historian has first (events come from sacctmgr on the
    ingest timer and lag; the node spools and `healthctl drain/resume` record the actions).

    Per node, the newer of its latest open node event and its latest out/back action decides:
    - an open event (DOWN, DRAIN, FAIL and Slurm's reason) names the state, unless rsc-health
      resumed the node at or after the event began (`healthctl resume` 20 s ago: the event's
      end is not ingested yet);
    - an rsc-health drain with no later resume counts though no event shows it yet, unless an
      event that ended after the drain says the node came back (a person resumed it).
    Actions are looked for over `lookback_days` only (an older one has its event by now)."""
    if not (_has_rows(engine, schema.node_events) or _has_rows(engine, schema.node_actions)):
        raise SectionEmpty("no node events or rsc-health actions in the historian yet "
                       "(healthctl ingest events; the node spools' actions), so which nodes "
                       "are out of service is unknown")
    e, a = schema.node_events, schema.node_actions
    with engine.connect() as conn:
        events = conn.execute(
            select(e.c.node, e.c.start, e.c.state, e.c.reason)
            .where(e.c.start <= as_of, or_(e.c.end.is_(None), e.c.end > as_of))
            .order_by(e.c.node, e.c.start)
        ).all()
        acts = conn.execute(
            select(a.c.node, a.c.time, a.c.action, a.c.reason)
            .where(a.c.time >= as_of - timedelta(days=lookback_days), a.c.time <= as_of,
                   a.c.action.in_(OUT_ACTIONS + BACK_ACTIONS))
            .order_by(a.c.node, a.c.time)
        ).all()
    last: dict[str, tuple] = {}
    for node, when, action, reason in acts:  # ordered by time: the latest wins
        last[node] = (when, action, reason)
    out: dict[str, dict] = {}
    for node, start, state, reason in events:  # ordered by start: the latest open one wins
        out[node] = {"node": node, "state": state, "since": start, "reason": reason,
                     "source": "node event"}
    for node, (when, action, _reason) in last.items():
        if action in BACK_ACTIONS and node in out and when >= out[node]["since"]:
            del out[node]  # resumed by rsc-health since the event began: Slurm's end lags
    drained = {n: v for n, v in last.items() if v[1] in OUT_ACTIONS and n not in out}
    if drained:
        with engine.connect() as conn:
            closed = dict(conn.execute(
                select(e.c.node, func.max(e.c.end))
                .where(e.c.node.in_(sorted(drained)), e.c.end.is_not(None), e.c.end <= as_of)
                .group_by(e.c.node)
            ).all())
        for node, (when, action, reason) in drained.items():
            if closed.get(node) is not None and closed[node] > when:
                continue  # drained, then back in service (a person resumed it)
            out[node] = {"node": node, "state": f"DRAIN ({action})", "since": when,
                         "reason": reason, "source": "rsc-health action"}
    if not out:
        return empty_frame("out_of_service")
    frame = pd.DataFrame(list(out.values()))
    frame["age_hours"] = [_hours(as_of, s) for s in frame["since"]]
    frame = frame.sort_values(["since", "node"], ascending=[False, True])
    return frame[["node", "state", "since", "age_hours", "reason", "source"]].reset_index(
        drop=True)


# --- 3. the pull list: lemon candidates, days listed, state and ticket ------------------------


def days_listed(
    candidates: Iterable[str],
    listed_on: Callable[[datetime], set[str]],
    as_of: datetime,
    max_days: int,
) -> dict[str, int]:
    """Consecutive days (today included) each candidate has been a lemon candidate, judged by
    the same verdicts as of each earlier day; at most `max_days` (the walk stops there, or as
    soon as every candidate has dropped out: each day costs one lemon evaluation)."""
    streak = {n: 1 for n in candidates}
    alive = set(streak)
    for k in range(1, max(1, max_days)):
        if not alive:
            break
        listed = listed_on(as_of - timedelta(days=k))
        alive &= listed
        for node in alive:
            streak[node] += 1
    return streak


def streak_from_previous(
    candidates: Iterable[str], previous: Mapping[str, Any] | None, as_of: datetime,
    max_days: int,
) -> dict[str, int] | None:
    """The nightly case, at no query cost: last night's report.json knows how long each of its
    candidates had been listed, so tonight's streak is that plus one (1 for a new candidate).
    None when there is no usable report from the day before (a first night, a gap, a report
    run for another day, a file from before days were counted, candidates carried from an
    earlier night because last night's verdicts failed): then `days_listed` walks."""
    if not previous:
        return None
    try:  # lemons_as_of: the candidates a failed night carried are as old as their verdicts
        before = datetime.fromisoformat(str(previous["lemons_as_of"] if "lemons_as_of" in
                                            previous else previous["as_of"]))
    except (KeyError, ValueError):
        return None
    if before.tzinfo is not None:
        before = before.astimezone(UTC).replace(tzinfo=None)
    if not timedelta(hours=12) <= as_of - before <= timedelta(hours=36):
        return None
    rows = [r for r in previous.get("lemons") or [] if isinstance(r, Mapping)]
    days = {str(r.get("node")): r.get("days_listed") for r in rows}
    if any(not isinstance(d, int) or d < 1 for d in days.values()):
        return None
    return {n: min(max(1, max_days), days.get(n, 0) + 1) for n in candidates}


def tickets_for(engine: Engine, nodes: list[str]) -> dict[str, str]:
    """The open ticket of each node ('#12 opened 2024-03-28 (lemon): reason'), else ''."""
    if not nodes:
        return {}
    t = schema.tickets
    with engine.connect() as conn:
        rows = conn.execute(
            select(t.c.node, t.c.id, t.c.opened, t.c.source, t.c.reason)
            .where(t.c.node.in_(nodes), t.c.closed.is_(None))
            .order_by(t.c.node, t.c.opened)
        ).all()
    out: dict[str, str] = {}
    for node, tid, opened, source, reason in rows:  # newest open ticket last, so it wins
        out[node] = f"#{tid} opened {opened:%Y-%m-%d} ({source}): {reason}"
    return out


def last_actions(engine: Engine, nodes: list[str], as_of: datetime,
                 lookback_days: float = 30) -> dict[str, str]:
    """rsc-health's latest action on each node in the lookback ('lemon_drain 2024-03-29')."""
    if not nodes:
        return {}
    a = schema.node_actions
    with engine.connect() as conn:
        rows = conn.execute(
            select(a.c.node, a.c.time, a.c.action)
            .where(a.c.node.in_(nodes), a.c.time >= as_of - timedelta(days=lookback_days),
                   a.c.time <= as_of)
            .order_by(a.c.node, a.c.time)
        ).all()
    return {node: f"{action} {when:%Y-%m-%d %H:%M}" for node, when, action in rows}


def pull_columns(lemons: pd.DataFrame, streak: dict[str, int], max_days: int,
                 outs: pd.DataFrame, tickets: dict[str, str],
                 actions: dict[str, str]) -> pd.DataFrame:
    """The lemon rows with what the operator needs to pull the node today."""
    if lemons.empty:
        return lemons
    state = {r["node"]: f"{r['state']} for {format_age(r['age_hours'])}"
             for r in outs.to_dict("records")} if not outs.empty else {}
    nodes = lemons["node"].astype(str)
    return lemons.assign(
        days_listed=[streak.get(n, 1) for n in nodes],
        listed_capped=[streak.get(n, 1) >= max_days > 1 for n in nodes],
        slurm_state=[state.get(n, "in service (no open node event)") for n in nodes],
        ticket=[tickets.get(n, "") for n in nodes],
        last_action=[actions.get(n, "") for n in nodes],
    )


# --- 4. nodes whose checks stopped --------------------------------------------------------------


def stale_checks(engine: Engine, as_of: datetime, stale_after_s: float) -> pd.DataFrame:
    """Nodes whose latest node-path run is older than stale_after_s, whose checker could not
    look, or whose probes keep hanging (`hung`: which, since when), oldest first.
    node_freshness reads node_runs (one row per node and entry point), hung_probes the open
    check intervals of a hung probe."""
    from rsc_health.historian.freshness import hung_probes, node_freshness

    if not _has_rows(engine, schema.node_runs):
        raise SectionEmpty("no node-path heartbeats in the historian yet (each prolog, epilog and "
                       "sweep spools one; healthctl spool flush delivers them), so nodes whose "
                       "checks stopped cannot be told from nodes never checked")
    hung: dict[str, list[str]] = {}
    for h in hung_probes(engine, as_of, stale_after_s):
        hung.setdefault(h.node, []).append(f"{h.probe} since {h.since:%Y-%m-%d %H:%M}")
    rows = [
        {"node": f.node, "last_seen": f.last_seen, "age_hours": _hours(as_of, f.last_seen),
         "source": f.last_source, "level": f.last_level, "stopped": f.stale,
         "broken": f.broken, "hung": "; ".join(hung.get(f.node, []))}
        for f in node_freshness(engine, as_of, stale_after_s)
        if f.stale or f.broken or f.node in hung
    ]
    if not rows:
        return empty_frame("stale")
    frame = pd.DataFrame(rows)
    return frame.sort_values(["stopped", "age_hours"], ascending=[False, False]).reset_index(
        drop=True)


# --- 5. XIDs per GPU ----------------------------------------------------------------------------


def xids_per_gpu(engine: Engine, as_of: datetime, days: float, top: int) -> pd.DataFrame:
    """XID check intervals per (node, GPU) that began in the last `days`, most first, top N.

    check_days has no component, so this reads check_results, bounded to the window by its
    time index; the rows are grouped in the database (one per node, GPU and code)."""
    c = schema.check_results
    if not _has_rows(engine, c):
        raise SectionEmpty("no check results in the historian yet (the node spools deliver them)")
    q = (
        select(c.c.node, c.c.component, c.c.code, func.count(), func.max(c.c.last_seen))
        .where(c.c.time >= as_of - timedelta(days=days), c.c.time < as_of,
               c.c.check == "xid", c.c.status != Status.OK)
        .group_by(c.c.node, c.c.component, c.c.code)
    )
    from rsc_health.historian.gpu_names import named

    with engine.connect() as conn:
        rows = pd.DataFrame(conn.execute(q).all(),
                            columns=["node", "gpu", "code", "n", "last_seen"])
        if rows.empty:
            return empty_frame("xids")
        # One name per GPU (gpu1 and 0000:1a:00 are the same one): then one row per GPU.
        rows["gpu"] = named(conn, list(rows["node"]), list(rows["gpu"]))
    rows = (rows.groupby(["node", "gpu", "code"], as_index=False)
            .agg(n=("n", "sum"), last_seen=("last_seen", "max")))
    rows = rows.sort_values(["n", "code"], ascending=[False, True])
    out = (
        rows.groupby(["node", "gpu"], sort=False)
        .agg(intervals=("n", "sum"), last_seen=("last_seen", "max"),
             codes=("code", lambda s: list(s)), counts=("n", lambda s: list(s)))
        .reset_index()
    )
    out["codes"] = [", ".join(f"{c or '?'} x{n}" for c, n in zip(cs, ns, strict=True))
                    for cs, ns in zip(out["codes"], out["counts"], strict=True)]
    out = out.sort_values(["intervals", "last_seen"], ascending=[False, False])
    out.attrs["total_gpus"] = len(out)
    out.attrs["total_intervals"] = int(out["intervals"].sum())
    return out[["node", "gpu", "intervals", "codes", "last_seen"]].head(top).reset_index(
        drop=True)


# --- 6. data freshness ----------------------------------------------------------------------


@dataclass(frozen=True)
class Input:
    name: str
    newest: Callable  # a select of one value: the input's newest time at or before as_of
    stale_after_h: float | None  # None: rare by nature, its age alone is no fault
    note: str  # what the age is judged by
    alarm: str = ""  # what a stale one means


def freshness(engine: Engine, as_of: datetime, stale_after_s: float,
              sacct_stale_hours: float) -> pd.DataFrame:
    """Newest heartbeat, sacct job end, node event and ticket, each a max() over an index or a
    small table. A stale input is flagged; the report's other numbers are only as new."""
    r, j, e, t = schema.node_runs, schema.jobs, schema.node_events, schema.tickets
    inputs = (
        Input("node heartbeats (node path spools)",
              lambda: select(func.max(r.c.last_seen)).where(r.c.last_seen <= as_of),
              stale_after_s / HOUR_S, f"stale after [historian] stale_after_s "
              f"({stale_after_s:g} s)", "no node's runs are arriving"),
        Input("sacct jobs (job ends)",
              lambda: select(func.max(j.c.end)).where(j.c.end <= as_of),
              sacct_stale_hours, f"stale after [report] sacct_stale_hours "
              f"({sacct_stale_hours:g} h)", "the sacct ingest may have stopped"),
        Input("node events (sacctmgr)",
              lambda: select(func.max(e.c.start)).where(e.c.start <= as_of),
              None, "outages are rare: an old newest event alone is no fault"),
        Input("tickets", lambda: select(func.max(t.c.opened)).where(t.c.opened <= as_of),
              None, "opened by people and lemon drains"),
    )
    rows = []
    with engine.connect() as conn:
        for item in inputs:
            newest = conn.execute(item.newest()).scalar()
            age = _hours(as_of, newest)
            # An input that should flow and has nothing at all is as stale as an old one.
            stale = item.stale_after_h is not None and (newest is None
                                                       or age > item.stale_after_h)
            note = "none in the historian yet" if newest is None else item.note
            if stale and newest is not None:
                note = f"{note}: {item.alarm}"
            rows.append({"input": item.name, "newest": newest, "age_hours": age,
                         "stale": bool(stale), "note": note})
    return pd.DataFrame(rows)


def format_age(hours: float) -> str:
    """'45 min', '5.2 h', '3.1 d'; '-' when unknown."""
    if hours is None or hours != hours:
        return "-"
    if hours < 1:
        return f"{hours * 60:.0f} min"
    if hours < 48:
        return f"{hours:.1f} h"
    return f"{hours / 24:.1f} d"


def qualified(engine: Engine, as_of: datetime, hours: float = 24) -> pd.DataFrame:
    """Qualification runs that ended in the `hours` before as_of, newest first."""
    from rsc_health.historian.schema import qualify_runs as r

    with engine.connect() as conn:
        rows = conn.execute(
            select(r.c.node, r.c.tier, r.c.verdict, r.c.ended, r.c.reason, r.c.job_id)
            .where(r.c.ended > as_of - timedelta(hours=hours), r.c.ended <= as_of)
            .order_by(r.c.ended.desc())).all()
    return pd.DataFrame(rows, columns=["node", "tier", "verdict", "ended", "reason", "job_id"])


def suspects(engine: Engine, as_of: datetime, hours: float = 24) -> pd.DataFrame:
    """Suspect episodes open at as_of or ended in the `hours` before it: open ones first,
    strongest deviation first; ended ones newest first."""
    from rsc_health.historian.suspects import recent
    from rsc_health.model import SuspectState

    eps = [e for e in recent(engine, as_of - timedelta(hours=hours))
           if e.since <= as_of and (e.state is SuspectState.SUSPECT or e.changed <= as_of)]
    eps.sort(key=lambda e: (e.state is not SuspectState.SUSPECT, -(e.deviation or 0.0)))
    return pd.DataFrame(
        [(e.node, e.state.value, e.metric, e.value, e.peer_median, e.deviation, e.source,
          e.since, e.last_evidence, ", ".join(e.job_ids[:8]), e.tier, e.changed_by,
          e.change_reason) for e in eps],
        columns=["node", "state", "metric", "value", "peer_median", "deviation", "source",
                 "since", "last_evidence", "job_ids", "tier", "changed_by", "change_reason"])
