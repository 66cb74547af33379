"""What the report shows of the fleet whatever its age: rsc-health's actions folded into
intervals, the findings open now and the node events per node.

A young cluster has no job over the large-job size yet, so r_f, MTTF and ETTR are "-" for
weeks; these sections need no job at all (issue 26: "shows a young fleet what it can").
"""

from __future__ import annotations

from datetime import datetime, timedelta

import pandas as pd
from sqlalchemy import ColumnElement, DateTime, Engine, case, func, literal_column, select

from rsc_health.historian import schema
from rsc_health.historian.gpu_names import named
from rsc_health.model import FINDING_SEVERITIES, Status
from rsc_health.report.data import SectionEmpty, empty_frame

FOLD_KEY = ("node", "action", "reason", "job_id")


def fold_repeats(actions: pd.DataFrame) -> pd.DataFrame:
    """One row per run of the same (node, action, reason, job) with nothing else done to the
    node in between: every sweep's "would drain" for one node and reason is one interval
    (time = first seen, last_seen, count), not a row per sweep. A different action on the
    node (a resume, another reason) starts a new interval, so the order of events is kept.
    Rows come back oldest first."""
    if actions.empty:
        return actions.assign(last_seen=pd.Series(dtype=object), count=pd.Series(dtype=int))
    frame = actions.copy()
    frame["job_id"] = frame["job_id"].where(frame["job_id"].notna(), None)
    frame = frame.sort_values(["node", "time"], kind="stable").reset_index(drop=True)
    # Compared as text, a missing job id as "" (NaN never equals itself).
    key = frame[list(FOLD_KEY)].map(lambda v: "" if v is None or v != v else str(v))
    same_node = key["node"].eq(key["node"].shift())
    same = same_node & (key == key.shift()).all(axis=1)
    frame["_run"] = (~same).cumsum()
    folded = (
        frame.groupby("_run", sort=False)
        .agg(time=("time", "first"), last_seen=("time", "last"), count=("time", "size"),
             node=("node", "first"), action=("action", "first"), reason=("reason", "first"),
             job_id=("job_id", "first"))
        .reset_index(drop=True)
    )
    folded["count"] = folded["count"].astype(int)
    return folded.sort_values(["time", "node"], kind="stable").reset_index(drop=True)[
        ["time", "last_seen", "count", "node", "action", "reason", "job_id"]]


def open_findings(engine: Engine, as_of: datetime, limit: int) -> pd.DataFrame:
    """The findings open now (check intervals still open, not OK, begun by as_of), most severe
    first, then the oldest: the fleet's current faults, whatever jobs have run. `limit` rows;
    attrs total and nodes say how many there are in all."""
    c = schema.check_results
    rank = case({s.severity_word: int(s) for s in FINDING_SEVERITIES}, value=c.c.severity, else_=0)
    begun: ColumnElement[datetime] = c.c.time
    if engine.dialect.name == "sqlite":
        # Unary plus keeps SQLite off ix_check_results_time: its planner (no histograms)
        # took that index for `time <= as_of`, true of nearly every row, over the partial
        # index of the open ones (a year of sweeps of 3,000 nodes, 1M intervals: 3.5 s vs
        # 0.02 s). PostgreSQL takes the partial index as it is.
        begun = literal_column(f"+{c.name}.{c.c.time.name}", DateTime)
    where = (schema.open_interval(), c.c.status != Status.OK, begun <= as_of)
    with engine.connect() as conn:
        if conn.execute(select(c.c.id).limit(1)).first() is None:
            raise SectionEmpty("no check results in the historian yet (the node spools "
                               "deliver them: healthctl spool flush)")
        total, nodes = conn.execute(
            select(func.count(), func.count(func.distinct(c.c.node))).where(*where)).one()
        rows = conn.execute(
            select(c.c.node, c.c.check, c.c.component, c.c.severity, c.c.status, c.c.code,
                   c.c.time, c.c.last_seen, c.c.reason)
            .where(*where).order_by(rank.desc(), c.c.time, c.c.node).limit(limit)).all()
        if not rows:
            return empty_frame("open_findings")
        frame = pd.DataFrame(rows, columns=["node", "check", "component", "severity", "status",
                                            "code", "since", "last_seen", "reason"])
        frame["component"] = named(conn, list(frame["node"]), list(frame["component"]))
    frame.attrs.update(total=int(total), nodes=int(nodes))
    return frame


def events_per_node(engine: Engine, as_of: datetime, days: float, limit: int) -> pd.DataFrame:
    """Node events (sacctmgr: DOWN, DRAIN, FAIL) that began in the last `days`, per node:
    how many, how many DOWN, the newest with its state and reason; most first."""
    e = schema.node_events
    since = as_of - timedelta(days=days)
    with engine.connect() as conn:
        if conn.execute(select(e.c.id).limit(1)).first() is None:
            raise SectionEmpty("no node events in the historian yet (healthctl ingest events)")
        rows = conn.execute(
            select(e.c.node, e.c.start, e.c.state, e.c.reason)
            .where(e.c.start >= since, e.c.start <= as_of, e.c.node != "")
            .order_by(e.c.node, e.c.start)).all()
    if not rows:
        return empty_frame("node_events")
    raw = pd.DataFrame(rows, columns=["node", "start", "state", "reason"])
    raw["down"] = raw["state"].astype(str).str.upper().str.startswith("DOWN")
    per = (raw.groupby("node", sort=False)
           .agg(events=("start", "size"), down=("down", "sum"), last_start=("start", "last"),
                last_state=("state", "last"), last_reason=("reason", "last"))
           .reset_index())
    per["down"] = per["down"].astype(int)
    per = per.sort_values(["events", "last_start"], ascending=[False, False])
    per.attrs.update(total_nodes=len(per), total_events=int(per["events"].sum()))
    return per.head(limit).reset_index(drop=True)
