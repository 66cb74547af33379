"""Feed lemon verdicts back into Slurm: drain the node and open a repair ticket.

A dry run unless `apply=True`. The rules, in order, for each candidate:

0. A name that is not one Slurm node name (an imported row's `gpu[01-64]`, `a,b`, `-x`) is never
   sent to Slurm: scontrol would act on every node it names. One Slurm no longer knows
   (decommissioned or renamed within the window) is skipped with Slurm's words; the others go on.
1. A node whose reason is not ours (a person's or Slurm's own) is left alone: a human drain is
   sacred, and a reason set on an idle node is a person's note.
2. A node already drained by rsc-health (any mode) is left alone: it is already out of service,
   and a lemon drain would only overwrite the more specific reason.
2a. A node whose lemon drain of ours was lifted outside healthctl (Slurm shows it undrained while
   the historian has no return from repair since that drain: no closed lemon ticket, no
   resume recorded with the lemon reason) is left in service: a person's `scontrol update
   State=RESUME` is their decision, and the verdict is still on the evidence of that drain.
   With apply=True the lift is recorded once as a `resume` whose reason is the lifted one plus
   "(lifted outside healthctl ...)", so lemon_repairs counts it as the node's return and its
   windows start over: only new evidence drains it again. The open lemon ticket is left open,
   as after `healthctl resume --force`; a person closes it.
3. A node in shadow mode by its own config (`shadow_node`: a pilot's
   `[nodes."GLOB".actions] enabled = false`) is recorded as a would_drain, outside the guard:
   it takes none of the run's or a partition's drains.
   The mass-drain guard decides how many of the rest may go out now; the others are reported as
   held back, most damning first kept.
4. Drain (Slurm DRAIN: running jobs finish, nothing is killed) with reason
   `rsc_health:lemon:<top feature>:<evidence text>`, then open a ticket (source 'lemon') and
   record a node_actions row (one per drain: a drain after a recorded return gets its own).
   The `lemon` mode is never auto-resumed: only `healthctl resume` after repair brings the
   node back, and verdicts.repeat_offenders watches it afterwards.

Slurm is reached through SlurmNodes, the slice of rsc_health.slurm.SlurmAPI used here (CliSlurm
satisfies it; tests use an in-memory fake). The guard is the action layer's: per partition, at
most [actions] guard_max_share of its nodes drained by rsc-health within guard_window_min, and at
most [lemon] max_drains_per_run lemon drains per run.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from typing import Protocol

from sqlalchemy import Engine, func, insert, or_, select

from rsc_health.actions import guard_states
from rsc_health.historian.db import TURNS_LEMON_RECORDS, take_turns, writer
from rsc_health.historian.lemons.features import (
    LEMON_DRAIN_ACTIONS,
    LEMON_REASON_PREFIX,
    lemon_repairs,
)
from rsc_health.historian.lemons.verdicts import LemonVerdict
from rsc_health.historian.schema import job_nodes, jobs, node_actions, tickets
from rsc_health.hostlist import is_one_node
from rsc_health.model import ActionKind, Finding, Severity, Status
from rsc_health.policy import LEMON_MODE, format_reason, is_ours, parse_reason
from rsc_health.slurm.api import NodeInfo, SlurmCommandError


class SlurmNodes(Protocol):
    """The part of rsc_health.slurm.SlurmAPI that lemon drains use."""

    def node(self, name: str) -> NodeInfo: ...

    def nodes(self, names: list[str] | None = None) -> list[NodeInfo]: ...

    def drain(self, node: str, reason: str) -> None: ...


class DrainGuard(Protocol):
    def allow(self, nodes: Sequence[str]) -> tuple[list[str], str]:
        """The nodes that may be drained now (in order), and a message when some are held."""
        ...


@dataclass
class CountGuard:
    """At most `limit` lemon drains per run: a bad night of data must not empty a partition."""

    limit: int

    def allow(self, nodes: Sequence[str]) -> tuple[list[str], str]:
        if len(nodes) <= self.limit:
            return list(nodes), ""
        return list(nodes[: self.limit]), f"lemon drains per run limited to {self.limit}"


@dataclass
class PartitionGuard:
    """The action layer's mass-drain guard (rsc_health.actions.guard_states), counted per
    partition from Slurm's own view, plus this run's lemon drains as they are granted."""

    fleet: list[NodeInfo]
    max_share: float
    window: timedelta
    now: datetime
    per_run: int

    @classmethod
    def from_slurm(cls, slurm: SlurmNodes, cfg, now: datetime) -> PartitionGuard:
        return cls(
            fleet=slurm.nodes(),
            max_share=float(cfg.get("actions.guard_max_share")),
            window=timedelta(minutes=float(cfg.get("actions.guard_window_min"))),
            now=now.replace(tzinfo=UTC) if now.tzinfo is None else now,
            per_run=int(cfg.get("lemon.max_drains_per_run")),
        )

    def allow(self, nodes: Sequence[str]) -> tuple[list[str], str]:
        parts = sorted({p for n in self.fleet for p in n.partitions})
        states = {
            g.partition: g
            for g in guard_states(
                self.fleet, parts, max_share=self.max_share, window=self.window, now=self.now
            )
        }
        member_of = {n.name: n.partitions for n in self.fleet}
        allowed: list[str] = []
        held: set[str] = set()
        for node in nodes:
            full = [p for p in member_of.get(node, ()) if states[p].tripped]
            if full:
                held.add(f"mass-drain guard: partition {full[0]} at its limit")
                continue
            for p in member_of.get(node, ()):
                states[p].recent_ours.append(node)
            allowed.append(node)
        allowed, count_msg = CountGuard(self.per_run).allow(allowed)
        return allowed, "; ".join(sorted(held) + ([count_msg] if count_msg else []))

    def still_allows(self, slurm: SlurmNodes, node: str) -> str | None:
        """Right before a granted drain: why the guard holds it now, counted on Slurm's view
        read again (None: it may go). The grants were counted on the listing read at the
        start; node-path drains landing since (a fabric event) and this run's own drains are
        in Slurm's view now, and together they must stay within the limit."""
        again = PartitionGuard(fleet=slurm.nodes(), max_share=self.max_share,
                               window=self.window, now=self.now, per_run=1)
        allowed, message = again.allow([node])
        return None if allowed else (message or "mass-drain guard")


@dataclass
class LemonAction:
    node: str
    action: str  # drain | would_drain | skip | held
    why: str
    reason: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


def _left_alone(info: NodeInfo) -> LemonAction | None:
    """The skip for a node a lemon drain must not touch (rules 1 and 2), or None."""
    if info.reason and not is_ours(info.reason):
        return LemonAction(info.name, "skip", f"human reason kept: {info.reason}")
    ours = parse_reason(info.reason)
    if ours is not None and (info.drain_set or info.down):
        return LemonAction(info.name, "skip", f"already drained by rsc_health ({ours['mode']})")
    return None


def lemon_reason(verdict: LemonVerdict) -> str:
    """`rsc_health:lemon:node_fails:node_fails 4 (min 3), +2 more signals`, policy grammar."""
    top = verdict.top_feature
    if top == "repeat_offender":
        text = f"failed again after repair at {verdict.resumed_at:%Y-%m-%d}"
    else:
        c = next(c for c in verdict.crossings if c.feature == top)
        text = f"{top} {_num(c.value)} (min {_num(c.threshold)})"
    others = len(verdict.crossings) + verdict.repeat_offender - 1
    if others > 0:
        text += f", +{others} more signal{'s' if others > 1 else ''}"
    finding = Finding(
        family="lemon",
        component="",
        status=Status.FAIL,
        severity=Severity.DRAIN_AFTER_JOB,
        reason=text,
        code=top,
        repair=True,
    )
    return format_reason(LEMON_MODE, [finding])


def _num(v: float) -> str:
    return f"{v:.2f}" if v != int(v) else str(int(v))


def apply_verdicts(
    engine: Engine,
    verdicts: Sequence[LemonVerdict],
    slurm: SlurmNodes,
    guard: DrainGuard,
    *,
    now: datetime,
    apply: bool = False,
    shadow: bool = False,
    shadow_node: Callable[[str], bool] | None = None,
) -> list[LemonAction]:
    """Decide (and with apply=True, perform) one action per verdict, in verdict order.

    shadow=True ([actions] enabled = false): apply changes nothing in Slurm and opens no
    ticket; each drain it would have made is recorded as a `would_drain` node action.
    `shadow_node(node)`: the same for the nodes it is true of (a pilot's
    `[nodes."GLOB".actions] enabled = false`), the others drained."""
    if shadow and apply:
        would = apply_verdicts(engine, verdicts, slurm, guard, now=now)
        for a in would:
            if a.action == ActionKind.WOULD_DRAIN:
                _record_would_drain(engine, a.node, a.reason, now)
                a.why += " (shadow mode: not drained, no ticket opened)"
        return would
    actions: list[LemonAction] = []
    wanted: list[tuple[LemonVerdict, str]] = []
    unreturned = _unreturned_lemon_drains(
        engine, [v.node for v in verdicts if is_one_node(v.node)], now)
    for v in verdicts:
        if not is_one_node(v.node):
            # An imported row's node may be anything; `gpu[01-64]` or `a,b` would reach Slurm
            # as many nodes, past the guard that counted one. Never sent to Slurm at all.
            actions.append(LemonAction(v.node, "skip", "not one Slurm node name: never "
                                       "sent to Slurm (fix the imported rows)"))
            continue
        try:
            info = slurm.node(v.node)
        except SlurmCommandError as exc:
            # Slurm answered and does not know it (decommissioned, renamed within the
            # window), or its record is ambiguous: this candidate's, not the run's.
            actions.append(LemonAction(v.node, "skip", f"Slurm: {exc}"[:300]))
            continue
        standing = _left_alone(info)
        if standing is None and v.node in unreturned and not (info.drain_set or info.down):
            # Our lemon drain, lifted outside healthctl (a person's `scontrol update
            # State=RESUME`): their decision. This verdict is on the evidence that drain was
            # for (the windows start over only at a return from repair), so draining again
            # would undo it every night; the lift is recorded as that return instead.
            drained_at, lifted = unreturned[v.node]
            if apply:
                _record_lifted(engine, v.node, drained_at, lifted, info.state, now)
            actions.append(LemonAction(
                v.node, "skip",
                f"lemon drain of {drained_at:%Y-%m-%d %H:%M} lifted outside healthctl (Slurm "
                f"shows {info.state}): a person's decision, kept; "
                + ("recorded as its return from repair, so the node's windows start over and "
                   "only new evidence drains it again" if apply else "not recorded (dry run)")
                + "; its lemon ticket stays open until `healthctl ticket close`"))
        elif standing is None:
            wanted.append((v, lemon_reason(v)))
        elif (apply and (parse_reason(info.reason) or {}).get("mode") == LEMON_MODE
              and _record(engine, v, info.reason, now)):
            # A run cut short after the drain (a frozen slurmctld, a drain RPC that timed
            # out but landed): the ticket and the action record are completed now.
            actions.append(LemonAction(v.node, "repaired",
                                       "lemon drain found without its ticket or record; "
                                       "completed", info.reason))
        else:
            actions.append(standing)
    # A pilot's shadow nodes are never drained, so they take no part of the guard (the run's
    # max_drains_per_run, a partition's share): granted first (the most damning sort first,
    # and never repaired they stay candidates), they held every live lemon back, every night.
    shadowed = {v.node for v, _ in wanted if shadow_node is not None and shadow_node(v.node)}
    allowed, message = guard.allow([v.node for v, _ in wanted if v.node not in shadowed])
    allowed_set = set(allowed)
    for v, reason in wanted:
        if v.node in shadowed:
            if apply:
                _record_would_drain(engine, v.node, reason, now)
            actions.append(LemonAction(v.node, "would_drain", v.summary() + " (shadow mode "
                                       "for this node: not drained, no ticket opened)", reason))
            continue
        if v.node not in allowed_set:
            actions.append(LemonAction(v.node, "held", message or "mass-drain guard", reason))
            continue
        if not apply:
            actions.append(LemonAction(v.node, "would_drain", v.summary(), reason))
            continue
        # Read again: the others' reads took time (on 22.05 each costs slurmctld the whole
        # node table), and a person's drain (or Slurm's, or NHC's) set meanwhile is theirs.
        try:
            standing = _left_alone(slurm.node(v.node))
        except SlurmCommandError as exc:
            standing = LemonAction(v.node, "skip", f"Slurm: {exc}"[:300])
        if standing is not None:
            actions.append(standing)
            continue
        recheck = getattr(guard, "still_allows", None)
        held_now = recheck(slurm, v.node) if recheck is not None else None
        if held_now:
            actions.append(LemonAction(v.node, "held", held_now, reason))
            continue
        slurm.drain(v.node, reason)  # a timeout here leaves the records to the next run
        _record(engine, v, reason, now)
        actions.append(LemonAction(v.node, "drain", v.summary(), reason))
    return actions


def _record(engine: Engine, verdict: LemonVerdict, reason: str, now: datetime) -> bool:
    """The open lemon ticket and the action record of a lemon drain, each written at most once
    per drain, so a rerun completes a run that was cut short and never doubles one. A drain
    is recorded when the node has no lemon_drain row with this reason since its lemon drain
    was last lifted (a resume recorded with the lemon reason): a drain after such a resume
    (`healthctl resume --force` with the ticket open, then new evidence with the same text) is
    a drain of its own and gets a row of its own. True when anything was written."""
    node = verdict.node
    wrote = False
    with writer(engine).begin() as conn:
        # Two runs at once (the timer's and an operator's) both read "no ticket" otherwise.
        take_turns(conn, TURNS_LEMON_RECORDS, [node])
        has_ticket = conn.execute(
            select(tickets.c.id).where(tickets.c.node == node,
                                       tickets.c.source == "lemon", tickets.c.closed.is_(None))
        ).first()
        if has_ticket is None:
            conn.execute(insert(tickets).values(node=node, opened=now, reason=reason,
                                                source="lemon"))
            wrote = True
        lifted = conn.execute(
            select(func.max(node_actions.c.time)).where(
                node_actions.c.node == node,
                node_actions.c.action == ActionKind.RESUME.value,
                or_(node_actions.c.reason == "",
                    node_actions.c.reason.like(LEMON_REASON_PREFIX + "%")))
        ).scalar()
        since = [node_actions.c.time > lifted] if lifted is not None else []
        recorded = conn.execute(
            select(node_actions.c.id).where(
                node_actions.c.node == node, node_actions.c.action.in_(LEMON_DRAIN_ACTIONS),
                node_actions.c.reason == reason, *since).limit(1)
        ).first()
        action_id = hashlib.sha256(
            f"lemon|{node}|{reason}|{now.isoformat()}".encode()).hexdigest()[:32]
        if recorded is None and conn.execute(
                select(node_actions.c.id).where(node_actions.c.id == action_id)).first() is None:
            conn.execute(insert(node_actions).values(
                id=action_id, time=now, node=node, action=ActionKind.LEMON_DRAIN.value,
                reason=reason))
            wrote = True
    return wrote


def _unreturned_lemon_drains(engine: Engine, nodes: Sequence[str],
                             now: datetime) -> dict[str, tuple[datetime, str]]:
    """Per node of `nodes`: its latest lemon drain (time, reason) when the node has had no
    return from repair since (lemon_repairs: a closed lemon ticket, or a resume recorded with
    the lemon reason), that is, when its windows still hold the evidence of that drain."""
    if not nodes:
        return {}
    with engine.connect() as conn:
        rows = conn.execute(
            select(node_actions.c.node, node_actions.c.time, node_actions.c.reason)
            .where(node_actions.c.node.in_(sorted(set(nodes))),
                   node_actions.c.action.in_(LEMON_DRAIN_ACTIONS),
                   node_actions.c.reason.like(LEMON_REASON_PREFIX + "%"),
                   node_actions.c.time <= now)
            .order_by(node_actions.c.time)
        ).all()
    latest = {node: (when, reason) for node, when, reason in rows}
    if not latest:
        return {}
    back = lemon_repairs(engine, now)
    return {node: drain for node, drain in latest.items()
            if node not in back or back[node] < drain[0]}


def _record_lifted(engine: Engine, node: str, drained_at: datetime, reason: str, state: str,
                   now: datetime) -> None:
    """A lemon drain lifted outside healthctl, recorded as the resume it was: the reason it
    lifted (so lemon_repairs counts it as the node's return from repair) and how it was
    seen. Once per drain, however many runs see it. Its time is the earliest the lift is
    known by: the first job to start on the node after the drain (none could start while
    it stood), else this run. At this run's time, a lemon that failed jobs between the
    person's resume and the run had those failures erased with the windows it restarted,
    and stayed in service (helper-134)."""
    action_id = hashlib.sha256(
        f"lemon-lifted|{node}|{reason}|{drained_at.isoformat()}".encode()).hexdigest()[:32]
    with writer(engine).begin() as conn:
        take_turns(conn, TURNS_LEMON_RECORDS, [node])
        if conn.execute(select(node_actions.c.id).where(node_actions.c.id == action_id)
                        ).first() is None:
            first_start = conn.execute(
                select(func.min(jobs.c.start))
                .select_from(jobs.join(job_nodes, job_nodes.c.job_pk == jobs.c.id))
                .where(job_nodes.c.node == node, jobs.c.start > drained_at,
                       jobs.c.start <= now)).scalar()
            when = min(first_start, now) if first_start is not None else now
            conn.execute(insert(node_actions).values(
                id=action_id, time=when, node=node, action=ActionKind.RESUME.value,
                reason=f"{reason} (lifted outside healthctl: Slurm showed {state}, no drain; "
                       "seen by lemons --apply)"))


def _record_would_drain(engine: Engine, node: str, reason: str, now: datetime) -> None:
    """Shadow mode's record of a lemon drain (and its ticket) not made: once per node and
    reason, however many nightly runs would have made it."""
    action_id = hashlib.sha256(f"lemon-shadow|{node}|{reason}".encode()).hexdigest()[:32]
    with writer(engine).begin() as conn:
        take_turns(conn, TURNS_LEMON_RECORDS, [node])
        if conn.execute(select(node_actions.c.id).where(node_actions.c.id == action_id)
                        ).first() is None:
            conn.execute(insert(node_actions).values(
                id=action_id, time=now, node=node, action=ActionKind.WOULD_DRAIN.value,
                reason=reason))
