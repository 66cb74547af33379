"""Event-based reliability, beside the paper's job-based figures: what the fleet's own failure
history says, per period and peer group, with no jobs at all.

A failure is one of a node's own out-of-service periods (node_events that are neither planned
maintenance, by reason or a MAINT reservation it began in, nor a fleet-wide event:
outages.classify_outages) or one of its XID events
that is not of the application class, in [lo, hi). Per period (calendar month, quarter or
year, UTC) and group (cluster/partition from the node inventory, else the events' cluster):

  failures         failures that began in the period (an XID up to XID_LEAD before a node's
                   outage starts, or within its first second, is that outage's; otherwise one
                   per node and second)
  episodes         the same chained into episodes ([lemon] episode_gap_h)
  nodes_failed     distinct nodes with a failure
  node_days        node-days in service (node inventory; None without one)
  hours            hours of the period inside [lo, hi)
  system_mtbf_h    the mean time between consecutive failures of the group in the period,
                   (last - first) / (failures - 1): the published system MTBF (Titan, SC20);
                   None below two failures
  hours_per_failure  hours / failures
  node_mtbf_h      node_days * 24 / failures: one node's mean time between failures
  repair_p50_h, repair_p90_h, repair_mean_h  hours from an outage's start to its end (the
                   outages with an end)
  reasons          failures by reason (the outage's reason, or the XID code)

Everything is read once for [lo, hi) and grouped in pandas: rows are failures, not checks.
"""

from __future__ import annotations

from datetime import datetime

import numpy as np
import pandas as pd
from sqlalchemy import Engine, func, select

from rsc_health.historian.ingest.inventory import exposure
from rsc_health.historian.lemons.episodes import episode_starts
from rsc_health.historian.outages import (
    OutageRules,
    classify_outages,
    maintenance_reservations,
    nodes_seen,
    removed_by_cause,
)
from rsc_health.historian.schema import check_results, node_events
from rsc_health.model import Status

PERIODS = {"month": "M", "quarter": "Q", "year": "Y"}
WHOLE = "window"  # reliability(period=WHOLE): the whole [lo, hi) as one period
# An XID and the outage it caused are one failure. The node path stamps the XID to the
# sub-second and drains in the same run; slurmdbd stamps the drain in whole seconds, floored.
# So the XID comes up to a second after the outage's stamp (10:00:01.4 for 10:00:01) or a
# little before it (10:00:00.7 for the drain made at 10:00:01.2): matching by floor-second
# split the second pair in two. XID_LEAD is how far before it may come (the run's own drain
# latency, seconds), not so far that a separate earlier fault is merged.
XID_LEAD = pd.Timedelta(seconds=2)
COLUMNS = ["period", "group", "failures", "episodes", "nodes_failed", "node_days", "hours",
           "system_mtbf_h", "hours_per_failure", "node_mtbf_h", "repair_p50_h",
           "repair_p90_h", "repair_mean_h", "reasons"]


def failures(engine: Engine, lo: datetime, hi: datetime,
             rules: OutageRules | None = None) -> pd.DataFrame:
    """node, time, repair_h (None for an XID or an outage not ended), reason, cluster. What
    was left out is in attrs["left_out"]: outages by maintenance pattern and fleet-wide
    event (outages.removed_by_cause), and the application-class XIDs."""
    rules = rules or OutageRules()
    cr = check_results
    with engine.connect() as conn:
        ev = pd.DataFrame(conn.execute(
            select(node_events.c.node, node_events.c.start, node_events.c.end,
                   node_events.c.reason, node_events.c.cluster)
            .where(node_events.c.start >= lo, node_events.c.start < hi)).all(),
            columns=["node", "start", "end", "reason", "cluster"])
        xid = pd.DataFrame(conn.execute(
            select(cr.c.node, cr.c.time, cr.c.code).distinct()
            .where(cr.c.time >= lo, cr.c.time < hi, cr.c.check == "xid",
                   cr.c.status.in_((Status.WARN, Status.FAIL)),
                   cr.c.code.not_in(rules.application_xids))).all(),
            columns=["node", "time", "reason"])
        app_xids = conn.execute(
            select(func.count()).select_from(
                select(cr.c.node, cr.c.time, cr.c.code).distinct()
                .where(cr.c.time >= lo, cr.c.time < hi, cr.c.check == "xid",
                       cr.c.status.in_((Status.WARN, Status.FAIL)),
                       cr.c.code.in_(rules.application_xids)).subquery())).scalar_one()
    left_out: dict[str, dict[str, int]] = {"maintenance": {}, "fleet": {}}
    if not ev.empty:
        # A fleet-wide event is a share of the fleet: the nodes in service (inventory) and
        # those seen in the window, as the lemon features count them; never only the nodes
        # that failed, which made any five failures minutes apart an "event".
        fleet = len(set(exposure(engine, lo, hi)["node"]) | nodes_seen(engine, lo, hi))
        # Planned maintenance by the rule the job failure attribution reads
        # (outages.planned_maintenance): a maintenance reason, or an outage that began inside
        # a person's MAINT reservation (not rsc-health's own qualification one, and no
        # MAINT_LEAD: a crash before the window opened is the node's own).
        ev["kind"] = classify_outages(ev, rules, fleet, maintenance_reservations(engine, hi),
                                      lead=pd.Timedelta(0))
        left_out = removed_by_cause(ev, ev["kind"], rules, fleet)
        ev = ev[ev["kind"] == "node"]
    own = pd.DataFrame({
        "node": ev["node"], "time": pd.to_datetime(ev["start"]),
        "repair_h": (pd.to_datetime(ev["end"]) - pd.to_datetime(ev["start"]))
        .dt.total_seconds() / 3600, "reason": ev["reason"], "cluster": ev["cluster"]})
    xid = xid.assign(time=pd.to_datetime(xid["time"]), repair_h=np.nan, cluster="")
    xid = xid[~_caused_an_outage(xid, own)]
    out = pd.concat([own.assign(xid=False), xid[own.columns].assign(xid=True)],
                    ignore_index=True)
    # Then one failure per node and second (two records of one fault: two XIDs, or an
    # outage and a state change slurmdbd stamped with it); the outage is the one kept (its
    # reason and repair time), then the earliest record.
    second = out["time"].dt.floor("s")
    out = (out.assign(second=second).sort_values(["node", "second", "xid", "time", "repair_h"])
           .drop_duplicates(["node", "second"]).drop(columns=["second", "xid"]))
    out = out.reset_index(drop=True)
    out.attrs["left_out"] = {**left_out, "application_xids": int(app_xids)}
    return out


def _caused_an_outage(xid: pd.DataFrame, own: pd.DataFrame) -> pd.Series:
    """Per XID row: True where one of its node's own outages (`own`: node, time) starts at
    most XID_LEAD after it, or is stamped at most a second before it (slurmdbd's floor):
    the XID is that outage's cause, one failure with it."""
    hit = pd.Series(False, index=xid.index)
    if xid.empty or own.empty:
        return hit
    pairs = xid[["node", "time"]].reset_index().merge(
        own[["node", "time"]].rename(columns={"time": "start"}), on="node")
    lag = pairs["start"] - pairs["time"]
    near = pairs[(lag <= XID_LEAD) & (lag > -pd.Timedelta(seconds=1))]
    hit[near["index"].unique()] = True
    return hit


def reliability(engine: Engine, lo: datetime, hi: datetime, *, period: str = "quarter",
                rules: OutageRules | None = None, cluster: str | None = None) -> pd.DataFrame:
    """One row per period and group (COLUMNS), periods in order; attrs["left_out"] says what
    the failures left out (failures())."""
    rules = rules or OutageRules()
    f = failures(engine, lo, hi, rules)
    left_out = f.attrs["left_out"]
    inv = exposure(engine, lo, hi)
    if not inv.empty:
        groups = inv.set_index("node")["cluster"].str.cat(inv.set_index("node")["partition"],
                                                          sep="/")
        f["group"] = f["node"].map(groups).fillna(f["cluster"])
    else:
        f["group"] = f["cluster"].fillna("")
    if cluster is not None:
        f = f[f["group"].str.split("/").str[0] == cluster]
        inv = inv[inv["cluster"] == cluster]
    if period == WHOLE:  # one row per group over [lo, hi) (the exporter's window)
        f["period"] = WHOLE
    else:
        f["period"] = f["time"].dt.to_period(PERIODS[period])
    starts = episode_starts(f[["node", "time", "group", "period"]], rules.gap)
    rows = []
    for (per, group), g in f.groupby(["period", "group"], sort=True):
        if period == WHOLE:
            p_lo, p_hi = pd.Timestamp(lo), pd.Timestamp(hi)
        else:
            p_lo = max(per.start_time, pd.Timestamp(lo))
            p_hi = min(per.end_time + pd.Timedelta(microseconds=1), pd.Timestamp(hi))
        hours = (p_hi - p_lo).total_seconds() / 3600
        node_days = None
        if not inv.empty:
            e = exposure(engine, p_lo.to_pydatetime(), p_hi.to_pydatetime())
            e = e[e["cluster"].str.cat(e["partition"], sep="/") == group]
            node_days = float(e["days"].sum())
        n = len(g)
        t = g["time"].sort_values()
        repair = g["repair_h"].dropna()
        rows.append({
            "period": str(per), "group": group, "failures": n,
            "episodes": int(((starts["period"] == per) & (starts["group"] == group)).sum()),
            "nodes_failed": int(g["node"].nunique()), "node_days": node_days, "hours": hours,
            "system_mtbf_h": (t.iloc[-1] - t.iloc[0]).total_seconds() / 3600 / (n - 1)
            if n > 1 else None,
            "hours_per_failure": hours / n,
            "node_mtbf_h": node_days * 24 / n if node_days else None,
            "repair_p50_h": float(repair.quantile(0.5)) if len(repair) else None,
            "repair_p90_h": float(repair.quantile(0.9)) if len(repair) else None,
            "repair_mean_h": float(repair.mean()) if len(repair) else None,
            "reasons": g["reason"].fillna("").value_counts().to_dict(),
        })
    out = pd.DataFrame(rows, columns=COLUMNS)
    out.attrs["left_out"] = left_out
    return out
