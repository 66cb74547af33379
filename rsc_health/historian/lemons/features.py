"""Per-node lemon features over a window `[as_of - window_days, as_of)`.

Every count is a GROUP BY in the database; pandas only joins the per-feature series into one
frame. A node appears when it was seen in the window in job_nodes (a job that ended there),
check_results or node_events, or with a ticket or an out-of-service period in the history
window (below).

Definitions (everything restricted to the window):

  excl_jobid_count      job instances that excluded the node (job_exclusions rows, `time` in
                        window: one per job start, so a job id Slurm reused counts again)
  xid_cnt               XID episodes: distinct XID events (time, component, code) among
                        check_results rows with check='xid' and status warn/fail, chained
                        into one episode while each is at most `episode_gap_h` after the
                        one before (106 retries of one bad GPU in an evening are one). XIDs
                        the catalog marks `application = true` (13, 31, 43, 45, 68: the
                        program's error) are never the node's and count nowhere. An
                        XID no catalog lists (a newer driver's) is the node's: a storm of
                        it is one episode, repeats on separate days count as any XID's, and
                        xid_codes names it for the operator to judge. An episode that began
                        on one of the node's fleet-wide incident days (incident_episodes,
                        below) is the incident's and not counted; xid_codes still names its
                        codes
  xid_codes             the distinct XID codes of those events, sorted (kept alongside xid_cnt)
  tickets               repair tickets (any source) `opened` in window
  out_count             out-of-service periods (node_events, any state/source) that `start`
                        in window
  multi_node_node_fails distinct job instances with nnodes > 1, `end` in window, attributed to
                        the node (attributions.kind check or event)
  single_node_node_fails  distinct nnodes = 1 instances on the node, `end` in window, either
                        attributed to the node or ended NODE_FAIL (Slurm's own verdict; with
                        one node there is no other suspect)
  single_node_node_failure_rate  single_node_node_fails / single_node_jobs (0 without jobs)
Extras:
  jobs                  job instances that ran on the node and `end` in window
  single_node_jobs      the same for nnodes = 1
  node_fails            multi_node_node_fails + single_node_node_fails
  single_node_failed_jobs  single-node instances on the node that ended FAILED or NODE_FAIL,
                        attributed or not: on one node the node is the only suspect, and lemons
                        are exactly what health checks do not see
  single_node_fail_rate_any  single_node_failed_jobs / single_node_jobs
  early_fails           FAILED / NODE_FAIL instances on the node that ended within
                        `early_fail_minutes` (default 10) of `start`; multi-node jobs count only
                        when attributed to the node
  repeat_outs           out-of-service periods starting in window after a repair ticket for
                        the node had been closed (it came back from repair and went out again)
  fail_causes           distinct attribution causes (check family / node_down) of its failures
Longer memory (over `[as_of - history_days, as_of)`, default 90 days, still one verdict at
as_of): a lemon whose faults show as plain node-downs fails too rarely to stand out in 28 days,
but it keeps coming back to repair over a quarter.
  tickets_history       repair tickets `opened` in the history window, except the ones
                        `lemons --apply` opened itself (source 'lemon'): counting its own
                        verdicts would re-flag a repaired node for the whole history window
  out_count_history     out-of-service periods (node_events, any state/source) that `start` in
                        the history window
  down_outs_history     those of them whose state is DOWN (slurmctld's "Not responding": the
                        node died rather than being drained by a check or a person)
Out-of-service periods that are not the node's own doing count in none of out_count,
repeat_outs, out_count_history and down_outs_history (`OutageRules`, the [lemon] keys):
  planned maintenance   a reason matching one of `maintenance_reason_patterns` (Python regular
                        expressions, searched; rsc-health's own `rsc_health:` reasons never are)
  fleet-wide            at least `fleet_event_nodes` nodes, or `fleet_event_share` of the
                        nodes seen, going out within `fleet_event_window_s` of each other (a
                        switch, a shared filesystem or slurmctld failing, not the nodes)
  MAINT reservation     the node is in a Slurm reservation with the MAINT flag (`healthctl
                        ingest reservations`) and the outage begins inside it, or in the
                        hour before it (nodes are drained ahead of the work)
The fleet-rate rule (over `[as_of - rate_window_days, as_of)`, lemons/episodes.py):
  episodes              the node's own fault episodes: its XID events (not application
                        class), failed checks, own outages (none of the three kinds above)
                        and repair tickets, one episode per fault whatever the sources
                        (a ticket opened within ticket_lag_h of an episode is its repair,
                        episodes.fault_episodes), chained by episode_gap_h, less those
                        beginning on a fleet-wide incident day of its peer group
  rate_expected         the episodes expected of it at its peer group's rate (the group's
                        other nodes' episodes per node-day) times its own node-days
  repairs, repairs_expected  the same for its repaired episodes (those with a ticket)
  rate_q                the smaller of the two Poisson upper tails P(X >= count),
                        Benjamini-Hochberg adjusted across every node and both counts of
                        the fleet (rate_by says which count gave it)
  rate_surprise         -log10(rate_q) (0 below rate_min_episodes episodes): the rule
  left_out              the node's events in the rate window counted nowhere: maintenance
                        and fleet-wide outages, application-class XIDs, episodes on incident
                        days, failures of a GPU that failed in two nodes (historian/gpus.py:
                        the fault moved with it); the verdict says so
  incident_episodes     of those, the node's episodes that began on a fleet-wide incident
                        day of its peer group (episodes.incident_days); that day's outages
                        of the node, its XID episodes that began that day, and its tickets
                        opened that day or within ticket_lag_h after, count in none of
                        xid_cnt, out_count, repeat_outs, out_count_history,
                        down_outs_history and tickets_history either (incidents are found
                        over the rate window: one shorter than the history window leaves
                        the older ones in). The verdict names them
  host_failed_jobs      failed jobs in the window that failed-job triage (historian/triage.py)
                        labels host and blames on the node: its own checks, drains and
                        DOWN events around the job's end, or Slurm's NODE_FAIL with them;
                        never an application-class XID. An input, judged by no rule yet
  peer_group, peer_nodes the node's peer group and how many nodes it has (quiet ones too)
  Peer group and exposure come from the node inventory (`healthctl ingest inventory`:
  cluster/partition, and the GPU model where it names more than one in a partition:
  cluster/partition/model, `peer_groups`; node-days in service); without one, every node
  seen in the rate window (jobs, checks, events) is in service all of it, its group its
  cluster.
Both windows of a node that came back from a lemon repair start at that repair
(`lemon_repairs`): its past is what sent it there, and only new trouble (or the repeat-offender
rule) should send it back.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

import numpy as np
import pandas as pd
from sqlalchemy import Engine, and_, case, distinct, func, or_, select, union

from rsc_health.historian.attribute import HOST_FAIL_STATES
from rsc_health.historian.lemons.episodes import (
    episode_starts,
    fault_episodes,
    rate_test,
)
from rsc_health.historian.lemons.episodes import incident_days as find_incident_days
from rsc_health.historian.outages import (  # noqa: F401 - long read from here too
    FLEET_FLOOR,
    MAINT_LEAD,
    OUTAGE_DEFAULTS,
    OutageRules,
    classify_outages,
    maintenance_reservations,
    nodes_seen,
    planned_maintenance,
    removed_by_cause,
)
from rsc_health.historian.schema import (
    attributions,
    check_results,
    job_exclusions,
    job_nodes,
    jobs,
    node_actions,
    node_events,
    tickets,
)
from rsc_health.historian.triage import host_failed_jobs, triage
from rsc_health.model import LEGACY_LEMON_DRAIN, REASON_PREFIX, ActionKind, Status
from rsc_health.policy import LEMON_MODE

# The paper's seven signals (Fig. 11), in the paper's order.
PAPER_FEATURES: tuple[str, ...] = (
    "excl_jobid_count",
    "xid_cnt",
    "tickets",
    "out_count",
    "multi_node_node_fails",
    "single_node_node_fails",
    "single_node_node_failure_rate",
)
EXTRA_FEATURES = (
    "jobs",
    "single_node_jobs",
    "node_fails",
    "single_node_failed_jobs",
    "single_node_fail_rate_any",
    "early_fails",
    "repeat_outs",
    "fail_causes",
    "tickets_history",
    "out_count_history",
    "down_outs_history",
    "episodes",
    "rate_expected",
    "repairs",
    "repairs_expected",
    "rate_q",
    "rate_surprise",
    "left_out",
    "incident_episodes",
    "host_failed_jobs",
)
FEATURE_COLUMNS = PAPER_FEATURES + EXTRA_FEATURES
FAILED_STATES = ("FAILED", *HOST_FAIL_STATES)
# Most -log10(q) reported: a q that underflows to 0 is still a number.
MAX_SURPRISE = 300.0


LEMON_REASON_PREFIX = f"{REASON_PREFIX}{LEMON_MODE}:"
# node_actions words of a lemon drain: `lemons --apply` writes LEMON_DRAIN; older rows "drain".
LEMON_DRAIN_ACTIONS = (ActionKind.LEMON_DRAIN.value, LEGACY_LEMON_DRAIN)
ATTRIBUTED_KINDS = ("check", "event")


def window_bounds(as_of: datetime, window_days: float) -> tuple[datetime, datetime]:
    return as_of - timedelta(days=window_days), as_of


def _seconds(start, end, dialect: str):
    """end - start in seconds, in the database's own date arithmetic."""
    if dialect == "sqlite":
        return (func.julianday(end) - func.julianday(start)) * 86400.0
    return func.extract("epoch", end - start)


def _series(engine: Engine, stmt, name: str) -> pd.Series:
    with engine.connect() as conn:
        rows = conn.execute(stmt).all()
    return pd.Series({r[0]: r[1] for r in rows}, name=name, dtype="float64")


@dataclass(frozen=True)
class _Span:
    """The window [lo, hi); with `since`, only those nodes, each from its own start."""

    lo: datetime
    hi: datetime
    since: dict[str, datetime] | None = None

    def of(self, node, time):
        if not self.since:
            return and_(time >= self.lo, time < self.hi)
        start = case(self.since, value=node, else_=self.lo)
        return and_(node.in_(list(self.since)), time >= start, time < self.hi)


def _window_features(engine: Engine, span: _Span, early_fail_minutes: float,
                     application_xids: tuple[str, ...]):
    """The window features as one Series each (node -> value), the XID-event rows (not the
    `application_xids`: OutageRules.application_xids) as a query and as a frame (node, time):
    xid_cnt is counted from the frame once the incident days are known (lemon_features)."""
    j, a = jobs, attributions
    attributed = and_(a.c.job_pk == j.c.id, a.c.kind.in_(ATTRIBUTED_KINDS))

    s: dict[str, pd.Series] = {}
    s["excl_jobid_count"] = _series(
        engine,
        # A row per job instance and node (the key is (job_id, node, time)): a job whose id
        # Slurm reused is another job, not merged into the first by a distinct job_id.
        select(job_exclusions.c.node, func.count())
        .where(span.of(job_exclusions.c.node, job_exclusions.c.time))
        .group_by(job_exclusions.c.node),
        "excl_jobid_count",
    )
    xid_rows = (
        select(
            check_results.c.node,
            check_results.c.time,
            check_results.c.component,
            check_results.c.code,
        )
        .where(
            check_results.c.check == "xid",
            check_results.c.status.in_((Status.WARN, Status.FAIL)),
            check_results.c.code.not_in(application_xids),
            span.of(check_results.c.node, check_results.c.time),
        )
        .distinct()
        .subquery()
    )
    with engine.connect() as conn:
        xids = pd.DataFrame(conn.execute(select(xid_rows.c.node, xid_rows.c.time)).all(),
                            columns=["node", "time"])
    s["tickets"] = _series(
        engine,
        select(tickets.c.node, func.count())
        .where(span.of(tickets.c.node, tickets.c.opened))
        .group_by(tickets.c.node),
        "tickets",
    )
    s["multi_node_node_fails"] = _series(
        engine,
        select(a.c.node, func.count(distinct(j.c.id)))
        .select_from(j.join(a, attributed))
        .where(span.of(a.c.node, j.c.end), j.c.nnodes > 1, a.c.node.is_not(None))
        .group_by(a.c.node),
        "multi_node_node_fails",
    )
    s.update(_job_node_counts(engine, span, early_fail_minutes))
    s["fail_causes"] = _series(
        engine,
        select(a.c.node, func.count(distinct(a.c.cause)))
        .select_from(j.join(a, attributed))
        .where(span.of(a.c.node, j.c.end), a.c.node.is_not(None))
        .group_by(a.c.node),
        "fail_causes",
    )

    return s, xid_rows, xids


def _job_node_counts(engine: Engine, span: _Span,
                     early_fail_minutes: float) -> dict[str, pd.Series]:
    """The features read from job_nodes, in one pass over the jobs that ended on each node in
    the window (one join of jobs and job_nodes, grouped by node):

      jobs, single_node_jobs, single_node_failed_jobs  (as the module docstring says)
      single_node_node_fails  single-node instances attributed to the node or ended NODE_FAIL
      early_fails             FAILED / NODE_FAIL instances ended within early_fail_minutes of
                              start: single-node, or attributed to the node

    Each was a query of its own, a pass over job_nodes each (on PostgreSQL a scan of the whole
    table per query: 0.5-0.9 s each at 1M jobs). (job_pk, node) is job_nodes' key, so a row is
    one job instance on one node, and counting rows counts distinct instances; the node's
    attributions are joined as distinct (job, node) pairs so that two causes of one failure
    do not count it twice. A Series holds only the nodes whose count is above zero."""
    j, jn, a = jobs, job_nodes, attributions
    blamed = (
        select(a.c.job_pk, a.c.node)
        .where(a.c.kind.in_(ATTRIBUTED_KINDS), a.c.node.is_not(None))
        .distinct()
        .subquery()
    )
    by_node = blamed.c.job_pk.is_not(None)
    single = j.c.nnodes == 1
    failed = j.c.state.in_(FAILED_STATES)
    # +0.5 s: SQLite's julianday arithmetic is floating point.
    quick = _seconds(j.c.start, j.c.end, engine.dialect.name) <= early_fail_minutes * 60 + 0.5

    def rows(*cond):
        return func.sum(case((and_(*cond), 1), else_=0))

    counts = {
        "jobs": func.count(),
        "single_node_jobs": rows(single),
        "single_node_node_fails": rows(single, or_(by_node, j.c.state.in_(HOST_FAIL_STATES))),
        "single_node_failed_jobs": rows(single, failed),
        "early_fails": rows(j.c.start.is_not(None), failed, quick, or_(single, by_node)),
    }
    with engine.connect() as conn:
        # The ids of the jobs that ended in the window, from ix_jobs_end: job_nodes rows of
        # other jobs cannot join, and a range of its key is one an index can read. Ids grow
        # with ingest (a job's at its first sacct row, when it started), so the window's ids
        # are close together and PostgreSQL reads that part of job_nodes_pkey instead of the
        # whole table (at 1M jobs a year, 3.2M job_nodes: 0.8-1.1 s -> 0.3 s). Without such
        # locality the range is wide and the plan what it was.
        # (id + 0: PostgreSQL would otherwise walk jobs_pkey from one end for min(id),
        # testing each job's end: 0.65 s, not 0.05 s.)
        first, last = conn.execute(
            select(func.min(j.c.id + 0), func.max(j.c.id + 0))
            .where(j.c.end >= span.lo, j.c.end < span.hi)
        ).one()
        if first is None:
            return {name: pd.Series(dtype="float64", name=name) for name in counts}
        stmt = (
            select(jn.c.node, *(v.label(k) for k, v in counts.items()))
            .select_from(
                j.join(jn, jn.c.job_pk == j.c.id).outerjoin(
                    blamed, and_(blamed.c.job_pk == j.c.id, blamed.c.node == jn.c.node)
                )
            )
            .where(span.of(jn.c.node, j.c.end), jn.c.job_pk.between(first, last))
            .group_by(jn.c.node)
        )
        frame = pd.DataFrame(conn.execute(stmt).all(), columns=["node", *counts])
    frame = frame.set_index("node").astype("float64")
    return {name: frame[name][frame[name] > 0].rename(name) for name in counts}


def lemon_features(
    engine: Engine,
    as_of: datetime,
    window_days: float = 28,
    *,
    early_fail_minutes: float = 10,
    history_days: float = 90,
    outages: OutageRules | None = None,
    cluster: str | None = None,
    host_jobs: bool | pd.Series = True,
) -> pd.DataFrame:
    """One row per node seen in the window, indexed by node, columns FEATURE_COLUMNS.
    `outages` says which out-of-service periods are not the node's own (default: the
    packaged [lemon] keys). With `cluster`, only that cluster's nodes (those its jobs ran on
    or its node events name), and its fleet-wide events judged among its own nodes.
    `host_jobs` False leaves host_failed_jobs at 0 (no rule reads it: a caller that wants
    only verdicts, such as the report's days-listed walk back, saves the triage's read); a
    Series is the counts already taken (triage.host_failed_jobs of the same window)."""
    outages = outages or OutageRules()
    lo, hi = window_bounds(as_of, window_days)
    h_lo, _ = window_bounds(as_of, max(history_days, window_days))
    r_lo, _ = window_bounds(as_of, outages.rate_window_days)
    repaired = lemon_repairs(engine, hi)
    s, xid_rows, xid_events = _window_features(engine, _Span(lo, hi), early_fail_minutes,
                                                 outages.application_xids)
    # The nodes a job ended on in the window, before any node restarts from its repair.
    job_nodes_seen = set(s["jobs"].index)
    xid_codes = _xid_codes(engine, xid_rows)
    # A node back from a lemon repair inside the window is judged on what happened since: the
    # failures that sent it to repair must not send it straight back. One more pass, over
    # those few nodes only, each from its own repair.
    restart = {node: when for node, when in repaired.items() if when > lo}
    if restart:
        again, again_xid, again_events = _window_features(
            engine, _Span(lo, hi, restart), early_fail_minutes, outages.application_xids)
        for name, series in s.items():
            s[name] = pd.concat([series.drop(list(restart), errors="ignore"), again[name]])
        xid_events = pd.concat([xid_events[~xid_events["node"].isin(list(restart))],
                                again_events], ignore_index=True)
        xid_codes = pd.concat([xid_codes.drop(list(restart), errors="ignore"),
                               _xid_codes(engine, again_xid)])

    history_tickets = _since_repair(
        engine,
        select(tickets.c.node, tickets.c.opened).where(
            tickets.c.opened >= h_lo,
            tickets.c.opened < hi,
            or_(tickets.c.source.is_(None), tickets.c.source != "lemon"),
        ),
        repaired,
    )
    s["tickets_history"] = history_tickets.groupby("node").size().astype("float64")
    # Every out-of-service period of the history window (and a fleet-event window before it,
    # so an event straddling the edge is seen whole), each classified once.
    margin = timedelta(seconds=outages.fleet_event_window_s)
    with engine.connect() as conn:
        events = pd.DataFrame(
            conn.execute(
                select(node_events.c.node, node_events.c.start, node_events.c.state,
                       node_events.c.reason, node_events.c.cluster)
                .where(node_events.c.start >= min(h_lo, lo, r_lo) - margin,
                       node_events.c.start < hi)
            ).all(),
            columns=["node", "start", "state", "reason", "cluster"],
        )
    nodes = nodes_seen(engine, lo, hi, job_nodes_seen) | set(s["tickets_history"].index)
    members = _cluster_nodes(engine, cluster) if cluster is not None else None
    if members is not None:
        nodes &= members
        events = events[events["node"].isin(members)]
    fleet = nodes | set(events["node"])
    events["kind"] = classify_outages(events, outages, len(fleet),
                                      maintenance_reservations(engine, hi, cluster))
    rate, peer_group, left_out, rate_by, struck = _fleet_rate(
        engine, events, r_lo, hi, outages, cluster, members, fleet, repaired=repaired)
    # A node's episode on one of its peer group's incident days is the incident's, not the
    # node's: its outages that day, and the tickets opened for them (that day, or within
    # ticket_lag_h after), count in none of the count rules either (the rate rule already
    # left the episode out). Only the struck nodes: a quiet node's outage that day is its own.
    history_tickets = _outside_incidents(history_tickets, "opened", struck,
                                         pd.Timedelta(days=1, hours=outages.ticket_lag_h))
    s["tickets_history"] = history_tickets.groupby("node").size().astype("float64")
    # ... nor its XID episodes that began that day (a bad driver roll-out's XIDs on every node
    # of a rack made each a lemon through xid_cnt alone).
    s["xid_cnt"] = _xid_episodes(xid_events, outages.gap, struck)
    incident_outs = _on_incident(events, "start", struck, pd.Timedelta(days=1))
    events.loc[incident_outs & (events["kind"] == "node"), "kind"] = "incident"
    own = events[events["kind"] == "node"]
    # Slurm's event states read "DOWN", "DOWN*", "DOWN+DRAIN"...: the first word says it died.
    history_outs = _since_repair_frame(own[own["start"] >= h_lo], repaired)
    s["out_count_history"] = history_outs.groupby("node").size().astype("float64")
    downs = history_outs[history_outs["state"].astype(str).str.startswith("DOWN")]
    s["down_outs_history"] = downs.groupby("node").size().astype("float64")
    # The window's own outages; a node back from a lemon repair counts from that repair.
    since = pd.to_datetime(own["node"].map(lambda node: restart.get(node, lo)))
    in_window = own[(own["start"] >= since) & (own["start"] >= lo) & (own["start"] < hi)]
    s["out_count"] = in_window.groupby("node").size().astype("float64")
    s["repeat_outs"] = _repeat_outs(engine, in_window, hi)
    if isinstance(host_jobs, pd.Series):
        s["host_failed_jobs"] = host_jobs.astype("float64")
    elif host_jobs:
        s["host_failed_jobs"] = host_failed_jobs(triage(engine, lo, hi, rules=outages))
    s.update(rate)
    s["incident_episodes"] = struck.groupby("node").size().astype("float64")
    nodes |= set(s["out_count_history"].index) | set(s["episodes"].index)
    if members is not None:
        nodes &= members
    frame = pd.DataFrame(index=pd.Index(sorted(nodes), name="node"))
    for name, series in s.items():
        frame = frame.join(series.rename(name), how="outer")
    frame = frame.fillna(0.0)
    for name in FEATURE_COLUMNS:
        if name not in frame.columns:
            frame[name] = 0.0
    frame["rate_q"] = s["rate_q"].reindex(frame.index).fillna(1.0)
    frame["node_fails"] = frame["multi_node_node_fails"] + frame["single_node_node_fails"]
    singles = frame["single_node_jobs"].where(frame["single_node_jobs"] > 0)
    frame["single_node_node_failure_rate"] = (frame["single_node_node_fails"] / singles).fillna(0.0)
    frame["single_node_fail_rate_any"] = (frame["single_node_failed_jobs"] / singles).fillna(0.0)
    counts = [c for c in FEATURE_COLUMNS if "rate" not in c and not c.endswith("_expected")]
    frame[counts] = frame[counts].astype("int64")
    frame = frame[list(FEATURE_COLUMNS)]
    frame["xid_codes"] = xid_codes.reindex(frame.index)
    frame["xid_codes"] = frame["xid_codes"].apply(lambda v: v if isinstance(v, list) else [])
    frame["peer_group"] = peer_group.reindex(frame.index).fillna("")
    # Which stream gave rate_q: "episodes" (every episode) or "repairs" (those with a ticket)
    frame["rate_by"] = rate_by.reindex(frame.index).fillna("episodes")
    # Nodes in each peer group, the quiet ones too (the frame holds only nodes with something
    # to count): a group's mean count is over all of them (verdicts.selective_in_group).
    frame["peer_nodes"] = frame["peer_group"].map(peer_group.value_counts()).fillna(0).astype(
        "int64")
    frame.index.name = "node"
    if members is not None:
        frame = frame[frame.index.isin(members)]
    frame = frame.sort_index()
    frame.attrs["left_out"] = left_out
    # The XIDs that were not counted, so that the evidence an operator reads leaves them out
    # too (verdicts.evidence).
    frame.attrs["application_xids"] = tuple(outages.application_xids)
    return frame


def _own_fault_times(engine: Engine, lo: datetime, hi: datetime,
                     app: tuple[str, ...]) -> tuple[pd.DataFrame, pd.Series]:
    """(node, time) of the node's own faults in [lo, hi) the database holds apart from outages:
    XID events (not application class, `app`: OutageRules.application_xids) and failed checks
    of the other families; and per node its application-class XIDs. Repair tickets are not
    faults: a ticket is the repair of an outage already counted, opened hours or days after it
    (a site that imports its outage records as tickets too would count every one twice)."""
    cr = check_results
    in_window = and_(cr.c.time >= lo, cr.c.time < hi)
    faults = union(
        select(cr.c.node, cr.c.time).where(
            in_window, cr.c.check == "xid", cr.c.status.in_((Status.WARN, Status.FAIL)),
            cr.c.code.not_in(app)),
        select(cr.c.node, cr.c.time).where(
            in_window, cr.c.check != "xid", cr.c.status == Status.FAIL),
    )
    with engine.connect() as conn:
        rows = pd.DataFrame(conn.execute(faults).all(), columns=["node", "time"])
        app_rows = conn.execute(
            select(cr.c.node, func.count()).where(
                in_window, cr.c.check == "xid", cr.c.status.in_((Status.WARN, Status.FAIL)),
                cr.c.code.in_(app)).group_by(cr.c.node)
        ).all()
    return rows, pd.Series(dict(app_rows), dtype="float64")


def _exposure(engine: Engine, lo: datetime, hi: datetime, events: pd.DataFrame,
              cluster: str | None, members: set[str] | None,
              seen: set[str]) -> tuple[pd.DataFrame, str]:
    """node, group, days over [lo, hi), and where it came from ("inventory" or "seen"):
    without an inventory, the nodes `seen` (in the verdict window: jobs, checks, events) and
    every node with an event in [lo, hi), each in service all of it. (Reading 90 days of jobs
    for the nodes seen cost 1.7 s of a 4 s lemon pass at the paper's scale.)"""
    from rsc_health.historian.ingest.inventory import exposure

    inv = exposure(engine, lo, hi)
    if not inv.empty:
        if cluster is not None:
            inv = inv[inv["cluster"] == cluster]
        return pd.DataFrame({"node": inv["node"], "group": peer_groups(inv),
                             "days": inv["days"]}), "inventory"
    seen = set(seen) | set(events["node"])
    if members is not None:
        seen &= members
    clusters = events.sort_values("start").groupby("node")["cluster"].last()
    nodes = sorted(seen)
    return pd.DataFrame({
        "node": nodes,
        "group": clusters.reindex(nodes).fillna("").to_numpy(),
        "days": (hi - lo).total_seconds() / 86400.0,
    }), "seen"


def peer_groups(inv: pd.DataFrame) -> pd.Series:
    """Each inventory node's peer group: cluster/partition, and its GPU model where the
    inventory knows it in a partition with more than one (cluster/partition/model): a mixed
    fleet's models fail at their own rates, and a node is judged by its own model's. A
    partition of one model, or whose models nobody named, keeps its group as before; a node
    of unknown model in a mixed partition is a group of its own partition's unknowns."""
    group = inv["cluster"].astype(str).str.cat(inv["partition"].astype(str), sep="/")
    if "gpu_model" not in inv:
        return group
    model = inv["gpu_model"].fillna("").astype(str)
    mixed = model.groupby(group).transform("nunique") > 1
    return group.where(~mixed, group.str.cat(model, sep="/"))


def _fleet_rate(engine: Engine, events: pd.DataFrame, lo: datetime, hi: datetime,
                rules: OutageRules, cluster: str | None, members: set[str] | None,
                seen: set[str], repaired: dict[str, datetime] | None = None):
    """The fleet-rate rule's series (episodes, rate_expected, rate_q, rate_surprise,
    left_out) over the nodes with an episode or an event left out, every node's peer group,
    and what the rule left out of the counts (episodes.py)."""
    faults, app_xids = _own_fault_times(engine, lo, hi, rules.application_xids)
    window = events[(events["start"] >= lo) & (events["start"] < hi)]
    own = window[window["kind"] == "node"]
    not_own = window[window["kind"] != "node"]
    faults = pd.concat([faults, own[["node", "start"]].rename(columns={"start": "time"})],
                       ignore_index=True)
    tickets_in = _repair_tickets(engine, lo, hi, rules)
    if members is not None:
        faults = faults[faults["node"].isin(members)]
        tickets_in = tickets_in[tickets_in["node"].isin(members)]
    # A node back from a lemon repair is judged on what happened since, over the days since:
    # the failures that sent it to repair must not send it straight back (as for every other
    # lemon feature above).
    restart = {n: t for n, t in (repaired or {}).items() if t > lo}
    if restart:
        since = pd.to_datetime(faults["node"].map(restart))
        faults = faults[since.isna() | (pd.to_datetime(faults["time"]) >= since)]
        since = pd.to_datetime(tickets_in["node"].map(restart))
        tickets_in = tickets_in[since.isna() | (pd.to_datetime(tickets_in["time"]) >= since)]
    # A GPU that failed in two nodes took its fault along: the nodes are not blamed for it.
    from rsc_health.historian.gpus import moved_gpu_failures

    moved = moved_gpu_failures(engine, faults, hi, rules)
    moved_by_node = faults[moved].groupby("node").size().astype("float64")
    moved_faults = faults[moved]
    faults = faults[~moved]
    exposure, basis = _exposure(engine, lo, hi, events, cluster, members,
                                seen | set(faults["node"]))
    if restart:
        back = pd.to_datetime(exposure["node"].map(restart))
        after = (pd.Timestamp(hi) - back).dt.total_seconds() / 86400.0
        exposure = exposure.assign(days=np.where(back.notna(),
                                                 np.minimum(exposure["days"], after),
                                                 exposure["days"]))
    groups = exposure.set_index("node")["group"]
    # One episode per fault, whatever the sources: the node's faults and own outages, the
    # outages that were not its own and the failures of a GPU that moved (so that their
    # tickets are not the node's faults either) and the repair tickets
    # (episodes.fault_episodes).
    rows = pd.concat([
        faults[["node", "time"]].assign(own=True),
        moved_faults[["node", "time"]].assign(own=False),
        not_own[["node", "start"]].rename(columns={"start": "time"}).assign(own=False),
    ], ignore_index=True)
    every = fault_episodes(rows, tickets_in, rules.gap, pd.Timedelta(hours=rules.ticket_lag_h))
    starts = every[every["own"] & every["node"].isin(groups.index)].assign(
        group=lambda f: f["node"].map(groups))
    incidents = find_incident_days(starts, exposure, rules.incident_alpha)
    day = pd.to_datetime(starts["time"]).dt.floor("D")
    on_incident = pd.MultiIndex.from_arrays([starts["group"], day]).isin(
        pd.MultiIndex.from_arrays([incidents["group"], pd.to_datetime(incidents["day"])]))
    kept = starts[~on_incident]
    episodes = kept.groupby("node").size().astype("float64")
    repairs = kept[kept["repaired"]].groupby("node").size().astype("float64")
    tested = rate_test({"episodes": episodes, "repairs": repairs}, exposure)
    tested["expected"] = tested["episodes_expected"]
    if basis == "inventory":
        # The inventory makes it a group of one on purpose (a one-node system): its own rate
        # is its base rate, and the absolute counts do not judge it either (verdicts.py gate).
        alone = tested["expected"].isna()
        tested.loc[alone, "expected"] = tested.loc[alone, "episodes"]
    q = tested["q"].to_numpy()
    surprise = np.clip(-np.log10(np.maximum(q, 1e-300)), 0.0, MAX_SURPRISE)
    surprise[tested["episodes"].to_numpy() < rules.rate_min_episodes] = 0.0
    left = pd.concat([
        not_own.groupby("node").size().astype("float64"),
        app_xids,
        starts[on_incident].groupby("node").size().astype("float64"),
        moved_by_node,
    ]).groupby(level=0).sum()
    tested["surprise"] = surprise
    tested = tested[tested["episodes"] > 0]
    series = {
        "episodes": tested["episodes"],
        "rate_expected": tested["expected"],
        "repairs": tested["repairs"],
        "repairs_expected": tested["repairs_expected"],
        "rate_q": tested["q"],
        "rate_surprise": tested["surprise"],
        "left_out": left,
    }
    left_out = {
        "window": [lo.isoformat(sep=" "), hi.isoformat(sep=" ")],
        "exposure": basis,
        "node_days": float(exposure["days"].sum()),
        "maintenance_outages": int((not_own["kind"] == "maintenance").sum()),
        "fleet_outages": int((not_own["kind"] == "fleet").sum()),
        # the same two counts by cause: which maintenance pattern or reservation, fleet-wide
        "removed": removed_by_cause(not_own, not_own["kind"], rules, len(seen)),
        "application_xids": int(app_xids.sum()),
        "incident_days": [
            {"group": r.group, "day": pd.Timestamp(r.day).date().isoformat(),
             "nodes": int(r.nodes), "expected": round(float(r.expected), 2)}
            for r in incidents.itertuples()
        ],
        "incident_episodes": int(on_incident.sum()),
        "moved_gpu_failures": int(moved.sum()),
    }
    struck = starts.loc[on_incident, ["node"]].assign(day=day[on_incident])
    return series, groups, left_out, tested["by"], struck.reset_index(drop=True)


def _on_incident(rows: pd.DataFrame, column: str, struck: pd.DataFrame,
                 reach: pd.Timedelta) -> pd.Series:
    """Per row of `rows` (node, `column`): whether it falls in [day, day + reach) of one
    of its node's incident days (`struck`: node, day, the node's episodes that began on a
    fleet-wide incident day of its peer group)."""
    hit = pd.Series(False, index=rows.index)
    if rows.empty or struck.empty:
        return hit
    when = pd.to_datetime(rows[column])
    for day, nodes in struck.groupby("day")["node"]:
        start = pd.Timestamp(day)
        hit |= rows["node"].isin(set(nodes)) & (when >= start) & (when < start + reach)
    return hit


def _outside_incidents(rows: pd.DataFrame, column: str, struck: pd.DataFrame,
                       reach: pd.Timedelta) -> pd.DataFrame:
    return rows[~_on_incident(rows, column, struck, reach)] if not rows.empty else rows


def _xid_episodes(xids: pd.DataFrame, gap: pd.Timedelta, struck: pd.DataFrame) -> pd.Series:
    """xid_cnt: per node, its XID episodes (`xids`: node, time) but those that began on one of
    its incident days (`struck`, as _on_incident)."""
    starts = episode_starts(xids, gap)
    starts = starts[~_on_incident(starts, "time", struck, pd.Timedelta(days=1))]
    return starts.groupby("node").size().astype("float64")


def _repair_tickets(engine: Engine, lo: datetime, hi: datetime,
                    rules: OutageRules) -> pd.DataFrame:
    """node, time (opened), own of the repair tickets opened in [lo, hi), not the ones
    `lemons --apply` opened itself (source 'lemon': its own verdicts); own is False for a
    ticket whose reason says planned maintenance (the outages' maintenance_reason_patterns)."""
    with engine.connect() as conn:
        rows = pd.DataFrame(conn.execute(
            select(tickets.c.node, tickets.c.opened, tickets.c.reason).where(
                tickets.c.opened >= lo, tickets.c.opened < hi,
                or_(tickets.c.source.is_(None), tickets.c.source != "lemon"))
        ).all(), columns=["node", "time", "reason"])
    planned = planned_maintenance(rows.rename(columns={"time": "start"}), rules)
    return rows.assign(own=~planned.to_numpy())[["node", "time", "own"]]


def lemon_repairs(engine: Engine, before: datetime) -> dict[str, datetime]:
    """When each node last came back from a lemon repair (at or before `before`): the latest
    `closed` of its lemon tickets, or the `resume` node action that lifted a lemon drain.
    Inclusive: a repair closed in the very second of a run (times are whole seconds) is
    already done.

    A resume records the reason it lifted (`healthctl resume`: "<reason> (by ...)"; the node
    agent's auto-resume: the reason as it was), so the resume that lifted the lemon drain is
    the one whose reason carries the lemon mark (LEMON_REASON_PREFIX). Any other resume (a
    check drain of the node's, auto-resumed after clean sweeps) is not back from repair: it
    would move the repair past the node's new failure and erase it. A resume recorded with no
    reason (older rows) counts only as the first one after a lemon drain."""
    with engine.connect() as conn:
        closed = conn.execute(
            select(tickets.c.node, tickets.c.closed).where(
                tickets.c.source == "lemon",
                tickets.c.closed.is_not(None),
                tickets.c.closed <= before,
            )
        ).all()
        acts = conn.execute(
            select(node_actions.c.node, node_actions.c.time, node_actions.c.action,
                   node_actions.c.reason)
            .where(
                node_actions.c.time <= before,
                or_(
                    node_actions.c.action == ActionKind.RESUME,
                    and_(
                        node_actions.c.action.in_(LEMON_DRAIN_ACTIONS),
                        node_actions.c.reason.like(LEMON_REASON_PREFIX + "%"),
                    ),
                ),
            )
            .order_by(node_actions.c.time)
        ).all()
    repaired: dict[str, datetime] = {}
    for node, when in closed:
        repaired[node] = max(repaired.get(node, when), when)
    lemon_drained: set[str] = set()  # ever drained as a lemon
    unlifted: set[str] = set()  # ... and no resume since
    for node, when, action, reason in acts:
        if action in LEMON_DRAIN_ACTIONS:
            lemon_drained.add(node)
            unlifted.add(node)
            continue
        reason = (reason or "").strip()
        if reason.startswith(LEMON_REASON_PREFIX):
            lifted = node in lemon_drained
        else:
            lifted = not reason and node in unlifted
        if lifted:
            repaired[node] = max(repaired.get(node, when), when)
            unlifted.discard(node)
    return repaired


def _repeat_outs(engine: Engine, outs: pd.DataFrame, hi: datetime) -> pd.Series:
    """Per node: its outages (rows of `outs`) that began after one of its repair tickets had
    closed."""
    if outs.empty:
        return pd.Series(dtype="float64")
    with engine.connect() as conn:
        closed = dict(
            conn.execute(
                select(tickets.c.node, func.min(tickets.c.closed))
                .where(tickets.c.closed.is_not(None), tickets.c.closed < hi)
                .group_by(tickets.c.node)
            ).all()
        )
    first_closed = pd.to_datetime(outs["node"].map(closed))
    after = outs[first_closed.notna() & (first_closed <= pd.to_datetime(outs["start"]))]
    return after.groupby("node").size().astype("float64")


def _since_repair_frame(frame: pd.DataFrame, repaired: dict[str, datetime]) -> pd.DataFrame:
    """The rows of `frame` (node, start, ...) at or after the node's last lemon repair."""
    if frame.empty or not repaired:
        return frame
    since = frame["node"].map(repaired)
    return frame[since.isna() | (frame["start"] >= since)]


def _since_repair(engine: Engine, stmt, repaired: dict[str, datetime]) -> pd.DataFrame:
    """The rows of `stmt` (node, time, ...) at or after the node's last lemon repair."""
    with engine.connect() as conn:
        rows = conn.execute(stmt).all()
    frame = pd.DataFrame(rows, columns=list(stmt.selected_columns.keys()))
    if frame.empty or not repaired:
        return frame
    when = frame.columns[1]
    since = frame["node"].map(repaired)
    return frame[since.isna() | (frame[when] >= since)]


def _cluster_nodes(engine: Engine, cluster: str) -> set[str]:
    """The nodes of one Slurm cluster: those its jobs ran on and its node events name."""
    stmt = union(
        select(job_nodes.c.node)
        .select_from(jobs.join(job_nodes, job_nodes.c.job_pk == jobs.c.id))
        .where(jobs.c.cluster == cluster),
        select(node_events.c.node).where(node_events.c.cluster == cluster),
    )
    with engine.connect() as conn:
        return {r[0] for r in conn.execute(stmt)}


def _xid_codes(engine: Engine, xid_rows) -> pd.Series:
    stmt = select(xid_rows.c.node, xid_rows.c.code).distinct()
    with engine.connect() as conn:
        rows = pd.DataFrame(conn.execute(stmt).all(), columns=["node", "code"])
    if rows.empty:
        return pd.Series(dtype=object)
    return rows.groupby("node")["code"].agg(lambda c: sorted(set(c)))
