"""Feed lemon verdicts back into Slurm: drain the node and open a repair ticket.

A dry run unless `apply=True`. The rules, in order, for each candidate:

1. A node whose reason is not ours (a person's or Slurm's own) is left alone: a human drain is
   sacred, and a reason set on an idle node is a person's note.
2. A node already drained by rsc-health (any mode) is left alone: it is already out of service,
   and a lemon drain would only overwrite the more specific reason.
3. The mass-drain guard decides how many of the rest may go out now; the others are reported as
   held back, most damning first kept.
4. Drain (Slurm DRAIN: running jobs finish, nothing is killed) with reason
   `rsc_health:lemon:<top feature>:<evidence text>`, then open a ticket (source 'lemon') and
   record a node_actions row. The `lemon` mode is never auto-resumed: only `healthctl resume`
   after repair brings the node back, and verdicts.repeat_offenders watches it afterwards.

Slurm is reached through the small SlurmNodes protocol below, which the Slurm layer's backend
satisfies; tests use an in-memory fake.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Protocol

from sqlalchemy import Engine, insert

from rsc_health.historian.lemons.verdicts import LemonVerdict
from rsc_health.historian.schema import node_actions, tickets
from rsc_health.model import Finding, Severity, Status
from rsc_health.policy import format_reason, is_ours, parse_reason

DRAINED_STATES = ("DRAIN", "DRAINED", "DRAINING", "DOWN", "FAIL", "FAILING", "MAINT")


@dataclass(frozen=True)
class NodeInfo:
    state: str  # Slurm's state words, e.g. "IDLE", "MIXED+DRAIN", "DOWN*"
    reason: str = ""


class SlurmNodes(Protocol):
    def node_info(self, node: str) -> NodeInfo: ...

    def drain(self, node: str, reason: str) -> None: ...


class DrainGuard(Protocol):
    def allow(self, nodes: Sequence[str]) -> tuple[list[str], str]:
        """The nodes that may be drained now, and a message when some are held back."""
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
class LemonAction:
    node: str
    action: str  # drain | would_drain | skip | held
    why: str
    reason: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


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
    return format_reason("lemon", [finding])


def _num(v: float) -> str:
    return f"{v:.2f}" if v != int(v) else str(int(v))


def _is_out(state: str) -> bool:
    words = state.upper().replace("*", "").replace("+", " ").split()
    return any(w in DRAINED_STATES for w in words)


def apply_verdicts(
    engine: Engine,
    verdicts: Sequence[LemonVerdict],
    slurm: SlurmNodes,
    guard: DrainGuard,
    *,
    now: datetime,
    apply: bool = False,
) -> list[LemonAction]:
    """Decide (and with apply=True, perform) one action per verdict, in verdict order."""
    actions: list[LemonAction] = []
    wanted: list[tuple[LemonVerdict, str]] = []
    for v in verdicts:
        info = slurm.node_info(v.node)
        if info.reason and not is_ours(info.reason):
            actions.append(LemonAction(v.node, "skip", f"human reason kept: {info.reason}"))
        elif is_ours(info.reason) and _is_out(info.state):
            mode = parse_reason(info.reason)["mode"]
            actions.append(LemonAction(v.node, "skip", f"already drained by rsc_health ({mode})"))
        else:
            wanted.append((v, lemon_reason(v)))
    allowed, message = guard.allow([v.node for v, _ in wanted])
    allowed_set = set(allowed)
    for v, reason in wanted:
        if v.node not in allowed_set:
            actions.append(LemonAction(v.node, "held", message or "mass-drain guard", reason))
            continue
        if not apply:
            actions.append(LemonAction(v.node, "would_drain", v.summary(), reason))
            continue
        slurm.drain(v.node, reason)
        _record(engine, v, reason, now)
        actions.append(LemonAction(v.node, "drain", v.summary(), reason))
    return actions


def _record(engine: Engine, verdict: LemonVerdict, reason: str, now: datetime) -> None:
    with engine.begin() as conn:
        conn.execute(
            insert(tickets).values(node=verdict.node, opened=now, reason=reason, source="lemon")
        )
        conn.execute(
            insert(node_actions).values(
                id=uuid.uuid4().hex, time=now, node=verdict.node, action="drain", reason=reason
            )
        )
