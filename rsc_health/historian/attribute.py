"""Why did a job fail? Blame FAILED and NODE_FAIL job instances on the health checks that fired
on their nodes around their end (paper III: "detected within the last 10 minutes or 5 minutes
after a failing job's lifetime").

Rules, in order, pushed down to the database as INSERT ... SELECT (rule 2's maintenance
reasons, Python regular expressions, are judged in pandas on its few candidate rows):
1. check:  every failing check result (status fail with a drain severity, or any non-ok XID
   but those the XID catalog marks `application = true`: 13, 31, 43... are the program's own
   error, never the node's, as triage and the lemon features read them too)
   on one of the job's nodes whose interval overlaps [end - before_s, end + after_s] -> one row per
   (job, node, check family); several causes and culprit nodes are normal. The row names the
   finding that caused the action: when rsc-health itself drained or requeued the node in the
   window (a node_actions row whose reason is ours and carries a code), the check with that
   code wins; otherwise the most severe, then the earliest (then its record id, so a rerun
   picks the same one). Never the alphabetically smallest code: an earlier XID 48 on another
   GPU is not the XID 79 that drained the node (issue 26).
2. event:  a NODE_FAIL or BOOT_FAIL (HOST_FAIL_STATES) with no such check -> the job's
   node(s) whose own out-of-service event was open at the job's end (cause `node_down`; of
   several, the one that began last). Planned maintenance (a maintenance reason or a MAINT
   reservation: outages.planned_maintenance, as the lemon features and the reliability
   figures read it) is not the node's own: a node drained for maintenance while the job ran
   on is not blamed for another node's NODE_FAIL.
3. unattributed: one of them with neither -> one row, cause `unattributed`, no node.
A FAILED job without a failing check gets no row: nothing says the hardware failed (the
paper's r_f counts only *attributed* FAILED jobs).

Re-running replaces the rows of every job it considers, so it is idempotent.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime

import pandas as pd
from sqlalchemy import (
    Connection,
    Engine,
    Select,
    and_,
    case,
    delete,
    exists,
    func,
    literal,
    or_,
    select,
)
from sqlalchemy.sql import ColumnElement

from rsc_health.config import packaged_default
from rsc_health.historian import schema
from rsc_health.historian.db import TURNS_ATTRIBUTE, refresh_statistics, take_turns, writer
from rsc_health.historian.outages import (
    OutageRules,
    application_xid_codes,
    maintenance_reservations,
    planned_maintenance,
)
from rsc_health.model import FINDING_SEVERITIES, REASON_PREFIX, ActionKind, Severity, Status
from rsc_health.policy import MODE_FOR_LEVEL

# REQUEUED instances are included because rsc-health itself requeues the jobs of a node it
# drains: the killed instance then ends REQUEUED, not FAILED, and is still an infra failure
# when a check fired on its nodes. Without a check it stays unattributed (a user's requeue).
# Slurm's own word that a job's host failed (sacct State): NODE_FAIL, and BOOT_FAIL ("launch
# failure, typically due to a hardware failure": the node did not boot or came up unusable, and
# the job could not be requeued). One list for attribution, the metrics, lemons and triage:
# BOOT_FAIL was a host failure in triage only, so a node whose jobs died in its reboots was
# neither attributed, counted in r_f and MTTF, nor a lemon.
HOST_FAIL_STATES = ("NODE_FAIL", "BOOT_FAIL")
FAILED_STATES = ("FAILED", *HOST_FAIL_STATES, "REQUEUED")
DRAIN_SEVERITIES = (Severity.DRAIN_AFTER_JOB.severity_word, Severity.DRAIN_NOW.severity_word)
# rsc-health's own actions that take a node's jobs down: the drain (now or after the job) and
# the requeue of its jobs. Their reason is `rsc_health:<mode>:<code>:...` (policy.format_reason).
ACTING_KINDS = (ActionKind.DRAIN_NOW.value, ActionKind.DRAIN_AFTER_JOB.value,
                ActionKind.REQUEUE.value)
J, JN, C, E, A, NA = (
    schema.jobs,
    schema.job_nodes,
    schema.check_results,
    schema.node_events,
    schema.attributions,
    schema.node_actions,
)


@dataclass(frozen=True)
class Window:
    before_s: int = packaged_default("attribution.before_s")
    after_s: int = packaged_default("attribution.after_s")

    @classmethod
    def from_config(cls, cfg) -> Window:
        if cfg is None:
            return cls()
        return cls(int(cfg.get("attribution.before_s")), int(cfg.get("attribution.after_s")))


def _shift(engine: Engine, column: ColumnElement, seconds: int) -> ColumnElement:
    """column + seconds, in the database's own date arithmetic."""
    if engine.dialect.name == "sqlite":
        # SQLAlchemy stores "YYYY-MM-DD HH:MM:SS.ffffff"; produce the same text so the string
        # comparison is exact at the window's edges (sacct times are whole seconds).
        return func.strftime("%Y-%m-%d %H:%M:%S", column, f"{seconds:+d} seconds").op("||")(
            literal(".000000")
        )
    return column + func.make_interval(0, 0, 0, 0, 0, 0, seconds)


def failing_check(application_xids: Collection[str] = ()) -> ColumnElement:
    """A check row that says a node failed: a fail with a drain severity, or any non-ok XID;
    not an XID whose code is among `application_xids` (OutageRules.application_xids: the
    program's own error, which blames no node). Triage asks with none: it reads those as the
    user's side."""
    failing = or_(
        and_(C.c.status == Status.FAIL, C.c.severity.in_(DRAIN_SEVERITIES)),
        and_(C.c.check == "xid", C.c.status.in_((Status.WARN, Status.FAIL))),
    )
    if not application_xids:
        return failing
    return and_(failing, or_(C.c.check != "xid", C.c.code.not_in(sorted(application_xids))))


def severity_rank() -> ColumnElement:
    """A check row's severity as its Severity number (the worst is the largest): the one order
    of rsc_health.model, never the spelling of the label."""
    return case({s.severity_word: int(s) for s in FINDING_SEVERITIES}, value=C.c.severity, else_=0)


def acted_on(lo: ColumnElement, hi: ColumnElement) -> ColumnElement:
    """1 when rsc-health drained or requeued the check's node inside [lo, hi] with a reason
    carrying the check's code (`rsc_health:now:xid79:...`), else 0."""
    carries = [
        func.substr(NA.c.reason, 1, func.length(prefix)) == prefix
        for prefix in (literal(f"{REASON_PREFIX}{mode}:").op("||")(C.c.code).op("||")(
            literal(":")) for mode in sorted(MODE_FOR_LEVEL.values()))
    ]
    acted = exists().where(
        NA.c.node == C.c.node,
        NA.c.action.in_(ACTING_KINDS),
        NA.c.time >= lo,
        NA.c.time <= hi,
        C.c.code != "",
        or_(*carries),
    )
    return case((acted, 1), else_=0)


@dataclass
class AttributionReport:
    jobs: int
    by_kind: dict[str, int]

    def summary(self) -> str:
        parts = ", ".join(f"{k} {n}" for k, n in sorted(self.by_kind.items())) or "none"
        return f"{self.jobs} FAILED/NODE_FAIL instance(s) considered; attributed by {parts}"


def attribute(
    engine: Engine, *, window: Window = Window(), since: datetime | None = None,
    application_xids: Collection[str] | None = None, outages: OutageRules | None = None,
) -> AttributionReport:
    """(Re)attribute every FAILED/NODE_FAIL instance that ended at or after `since`.
    `application_xids`: the check codes ("xid13") never blamed on a node (`outages`'
    application_xids, the site's catalog, when None; the packaged catalog's without either).
    `outages`: the site's [lemon] rules of what is planned maintenance (the packaged ones
    when None)."""
    if application_xids is None:
        application_xids = outages.application_xids if outages else application_xid_codes()
    if outages is None:
        outages = OutageRules(application_xids=tuple(application_xids))
    # Every MAINT reservation: a job of any age may be re-attributed (`since` is optional).
    reservations = maintenance_reservations(engine, datetime.max)
    # The join below reads jobs, job_nodes, check_results and node_events, usually loaded just
    # before: without their statistics PostgreSQL plans it for empty tables (183 s instead of
    # seconds at the paper's scale). About a second, whatever the size.
    refresh_statistics(engine)
    targets = select(J.c.id).where(J.c.state.in_(FAILED_STATES), J.c.end.is_not(None))
    if since is not None:
        targets = targets.where(J.c.end >= since)
    lo = _shift(engine, J.c.end, -window.before_s)
    hi = _shift(engine, J.c.end, window.after_s)

    # One row per (job, node, family): the finding that caused the action (see the module's
    # rule 1), picked by its rank inside the group.
    ranked = (
        select(
            J.c.id.label("job_pk"),
            C.c.node.label("node"),
            C.c.check.label("cause"),
            C.c.code.label("code"),
            C.c.id.label("evidence"),
            func.row_number().over(
                partition_by=(J.c.id, C.c.node, C.c.check),
                order_by=(acted_on(lo, hi).desc(), severity_rank().desc(), C.c.time, C.c.id),
            ).label("rank"),
        )
        .select_from(J.join(JN, JN.c.job_pk == J.c.id))
        # Intervals (version 5): a failing state that began before the window and was still
        # seen inside it counts, as the per-sweep rows it replaces did.
        .join(C, and_(C.c.node == JN.c.node, C.c.time <= hi, C.c.last_seen >= lo))
        .where(J.c.id.in_(targets), failing_check(application_xids))
        .subquery()
    )
    by_check = select(
        ranked.c.job_pk, ranked.c.node, ranked.c.cause, ranked.c.code, ranked.c.evidence,
        literal("check"),
    ).where(ranked.c.rank == 1)
    has_row = exists().where(A.c.job_pk == J.c.id)
    # The node's own outage open at the job's end; of several, the one that began last (the
    # state it was in when the job died), never the alphabetically smallest state. A planned
    # maintenance drain is no outage of the node's (outages.planned_maintenance, the rule the
    # lemon features and the reliability figures read): Slurm lets the job run on under it,
    # and another node's NODE_FAIL must not be blamed on the drained one. The reasons are
    # Python regular expressions, so the few candidate rows are judged in pandas.
    candidates = (
        select(
            J.c.id.label("job_pk"),
            E.c.node.label("node"),
            E.c.state.label("code"),
            E.c.id.label("evidence"),
            E.c.start.label("start"),
            E.c.reason.label("reason"),
        )
        .select_from(J.join(JN, JN.c.job_pk == J.c.id))
        .join(
            E,
            and_(
                E.c.node == JN.c.node,
                E.c.start <= hi,
                or_(E.c.end.is_(None), E.c.end >= J.c.end),
            ),
        )
        .where(J.c.id.in_(targets), J.c.state.in_(HOST_FAIL_STATES), ~has_row)
    )
    unattributed = select(
        J.c.id,
        literal(None),
        literal("unattributed"),
        literal(""),
        literal(""),
        literal("unattributed"),
    ).where(J.c.id.in_(targets), J.c.state.in_(HOST_FAIL_STATES), ~has_row)

    cols = [A.c.job_pk, A.c.node, A.c.cause, A.c.code, A.c.evidence, A.c.kind]
    with writer(engine).begin() as conn:
        # Two runs at once (the timer's and an operator's) take turns: under READ COMMITTED
        # the second's DELETE, waiting on the first, would not see the rows the first
        # inserted, and every attribution would stand twice. Its statements after the lock
        # see what the first committed.
        take_turns(conn, TURNS_ATTRIBUTE, ["attribute"])
        conn.execute(delete(A).where(A.c.job_pk.in_(targets)))
        conn.execute(A.insert().from_select(cols, by_check))
        by_event = _own_outages(conn, candidates, outages, reservations)
        if by_event:
            conn.execute(A.insert(), by_event)
        conn.execute(A.insert().from_select(cols, unattributed))
        counts = conn.execute(
            select(A.c.kind, func.count(func.distinct(A.c.job_pk)))
            .where(A.c.job_pk.in_(targets))
            .group_by(A.c.kind)
        ).all()
        jobs = conn.execute(select(func.count()).select_from(targets.subquery())).scalar()
    return AttributionReport(int(jobs or 0), {k: int(n) for k, n in counts})


def _own_outages(
    conn: Connection, candidates: Select, rules: OutageRules,
    reservations: Sequence[tuple[set[str], datetime, datetime | None]],
) -> list[dict[str, object]]:
    """Rule 2's rows from `candidates` (job_pk, node, code (the state), evidence (the event's
    id), start, reason: the events open at a host-failed job's end on its nodes): per job and
    node the own outage that began last, planned maintenance left out."""
    rows = pd.DataFrame(conn.execute(candidates).all(),
                        columns=["job_pk", "node", "code", "evidence", "start", "reason"])
    if rows.empty:
        return []
    rows = rows[~planned_maintenance(rows, rules, reservations).to_numpy()]
    rows = rows.sort_values(["job_pk", "node", "start", "evidence"],
                            ascending=[True, True, False, False])
    rows = rows.drop_duplicates(["job_pk", "node"])
    return rows.assign(cause="node_down", kind="event", job_pk=rows["job_pk"].astype(int),
                       evidence=rows["evidence"].astype(str))[
        ["job_pk", "node", "cause", "code", "evidence", "kind"]].to_dict("records")


def cooccurrence(engine: Engine) -> pd.DataFrame:
    """How often two causes were attributed to the same failed instance (paper: PCIe with
    XID 79). Columns cause_a, cause_b (cause_a < cause_b), jobs; most frequent first."""
    pairs = select(A.c.job_pk, A.c.cause).where(A.c.kind == "check").distinct().subquery()
    a, b = pairs.alias("a"), pairs.alias("b")
    query = (
        select(a.c.cause, b.c.cause, func.count().label("jobs"))
        .select_from(a.join(b, and_(a.c.job_pk == b.c.job_pk, a.c.cause < b.c.cause)))
        .group_by(a.c.cause, b.c.cause)
        .order_by(func.count().desc(), a.c.cause, b.c.cause)
    )
    with engine.connect() as conn:
        rows = conn.execute(query).all()
    return pd.DataFrame(rows, columns=["cause_a", "cause_b", "jobs"]).astype({"jobs": int})
