"""Nodes holding a drain verdict rsc-health has not carried out, and why (`healthctl status`,
`healthctl node`).

A node keeps such a verdict pending (rsc_health.nodepath's pending_verdict.json) while the
mass-drain guard holds it back or a drain that is not ours stands (a person's, NHC's, slurmd's
"Prolog error"), and spools a held action (model.HELD_KINDS, its reason saying why) each time
it tries and is held again. The verdict is carried out by a later try: a drain action.

So a node is held when its newest held action is newer than its newest drain action and
recent enough that the node would have tried, and been held, again since: tries are at most
1.5 x [actions] guard_retry_max_min apart (nodepath.guard_retry_after), and a node's spool
reaches the historian within [historian] stale_after_s. Older than that, the node stopped
saying so (it is then named as not checking, or its verdict went with its state dir).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy import Engine, select

from rsc_health.historian import schema
from rsc_health.historian.freshness import stale_after_s
from rsc_health.model import DRAIN_KINDS, HELD_KINDS


@dataclass(frozen=True, slots=True)
class Held:
    node: str
    time: datetime  # naive UTC: the newest held action
    action: str  # a HELD_KINDS value: guard_tripped | held_under_drain
    reason: str  # why, as the node said it


def held_within(cfg) -> timedelta:
    """How old a node's newest held action may be and still stand for a pending verdict."""
    longest_wait_min = 1.5 * float(cfg.get("actions.guard_retry_max_min"))
    return timedelta(minutes=longest_wait_min, seconds=stale_after_s(cfg))


def held_verdicts(engine: Engine, now: datetime, within: timedelta,
                  nodes: list[str] | None = None) -> list[Held]:
    """Nodes whose drain verdict is held back, by name."""
    if now.tzinfo is not None:
        now = now.astimezone(UTC).replace(tzinfo=None)
    a = schema.node_actions
    kinds = sorted(k.value for k in HELD_KINDS | DRAIN_KINDS)
    stmt = select(a.c.node, a.c.time, a.c.action, a.c.reason).where(
        a.c.action.in_(kinds), a.c.time >= now - within)
    if nodes is not None:
        stmt = stmt.where(a.c.node.in_(nodes))
    with engine.connect() as conn:
        rows = conn.execute(stmt).all()
    # Within one second (the stored resolution) a hold comes before the drain that ends it.
    rows.sort(key=lambda r: (r.time, r.action not in HELD_KINDS))
    newest: dict[str, Held | None] = {}
    for node, time, action, reason in rows:
        newest[node] = Held(node, time, action, reason or "") if action in HELD_KINDS else None
    return sorted((h for h in newest.values() if h is not None), key=lambda h: h.node)
