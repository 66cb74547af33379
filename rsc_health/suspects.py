"""The suspect tier in Slurm, short of a drain (issue 25 item 4), run from the management host.

A suspect node stays in service for small jobs and is kept away from big ones. Slurm 22.05 has
no negative constraint, so the tier works with a positive one:

- every node carries the feature [suspects] trusted_feature (declared in slurm.conf: Slurm's
  own configuration is the state "nobody is suspect");
- deploy/slurm/job_submit.lua makes each job of [suspects] big_job_nodes nodes or more require
  it;
- a suspect loses the feature and gets [suspects] suspect_weight (Slurm fills the lowest
  weights first, so small jobs reach it last); an ended episode gets both back.

`scontrol update` changes are lost at `scontrol reconfigure` and at a slurmctld restart without
-R: the node reads slurm.conf's features and weight again. Every manager pass (`healthctl
suspects apply`, deploy/manager/rsc-health-suspects.timer, every minute) compares what Slurm
holds with the historian's open episodes and applies the difference, so a lost change comes back
within one pass and is recorded as re-applied (tests/slurm/test_suspect_tier.py measures it).

What is never done: a drain (qualification decides: `healthctl qualify auto` sends idle suspects
to the [suspects] qualify_tier, whose pass, or a deeper tier's, clears and whose fail drains);
a change in shadow mode ([actions] enabled = false: `would_suspect` is recorded); a change to a
node a person or Slurm drained or marked DOWN (their state wins: `suspect_held`); more suspects
in Slurm at once than the guard allows ([suspects] max_share of each partition, at least one,
strongest evidence first, a node's own telemetry before a job's step files; a pilot's shadow
nodes take none of its places, but one turned shadow while the tier held it keeps its place:
its marks stay in Slurm).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from rsc_health.actions import guard_limit
from rsc_health.historian.failslow.evidence import STEPS
from rsc_health.model import TIER_APPLIED, TIER_HELD, TIER_PERSON, TIER_SHADOW, ActionKind
from rsc_health.policy import MANUAL_MODE, parse_reason
from rsc_health.slurm.api import NodeInfo, SlurmError, SlurmUnavailable

# What the historian's `suspects.tier` says the tier did with an episode.
APPLIED, SHADOW, HELD, PERSON = TIER_APPLIED, TIER_SHADOW, TIER_HELD, TIER_PERSON


@dataclass(frozen=True)
class TierRules:
    trusted: str
    suspect_weight: int
    max_share: float
    enabled: bool
    # [actions] enabled per node (Config.actions_enabled: a pilot's `[nodes."GLOB".actions]`);
    # None: `enabled` for every node
    enabled_for: Callable[[str], bool] | None = None

    @classmethod
    def from_config(cls, cfg) -> TierRules:
        per_node = getattr(cfg, "actions_enabled", None)
        return cls(trusted=str(cfg.get("suspects.trusted_feature")),
                   suspect_weight=int(cfg.get("suspects.suspect_weight")),
                   max_share=float(cfg.get("suspects.max_share")),
                   enabled=bool(cfg.get("actions.enabled")), enabled_for=per_node)

    def writes(self, node: str) -> bool:
        """Whether the tier may change this node in Slurm (not in shadow mode, site-wide or
        by the node's own `[nodes."GLOB".actions]`)."""
        return self.enabled_for(node) if self.enabled_for is not None else self.enabled


@dataclass(frozen=True)
class Change:
    """One node's difference between Slurm and the historian, and what to do about it."""

    node: str
    kind: ActionKind
    why: str
    episode_id: int | None = None
    tier: str = ""  # the episode's tier after this change
    features: tuple[str, ...] | None = None  # set these (None: leave them)
    active: tuple[str, ...] | None = None  # the active ones with them (None: the same)
    weight: int | None = None  # set this (None: leave it)
    slurm_weight: int | None = None  # the weight to give back when the episode ends
    # slurm_weight is the weight Slurm showed for the node (not one saved before): it may
    # replace a saved one; a saved one is never replaced by a guess (two passes at once)
    own_weight: bool = True
    record: bool = True  # a node_actions row (False: nothing new to say)


def plan(nodes: list[NodeInfo], episodes, rules: TierRules,
         restore_weights: dict[str, int] | None = None) -> list[Change]:
    """Pure: what the tier changes in Slurm. `episodes`: the open ones (historian.suspects.
    Episode), strongest first; `restore_weights`: {node: weight before the tier raised it}
    for nodes an episode of which the tier applied: only those are given the feature back."""
    info = {n.name: n for n in nodes}
    saved = restore_weights or {}
    members: dict[str, int] = {}
    for node in nodes:
        for p in node.partitions:
            members[p] = members.get(p, 0) + 1
    # The guard bounds suspects in Slurm: nodes the tier writes take its places, and so does
    # every node whose marks the tier left in Slurm and no longer writes (turned shadow while
    # it held it: its marks stay, nothing gives them back). A shadow node never applied
    # ([nodes."GLOB".actions] off in a pilot) is judged as if the whole fleet were live
    # (`would`: every episode let through), so its would_suspect says what going live would
    # do, and never holds a live node back.
    used: dict[str, int] = {}
    would: dict[str, int] = {}
    stuck = _stuck(nodes, episodes, rules, saved)
    for name in stuck:
        for p in info[name].partitions or ("",):
            used[p] = used.get(p, 0) + 1
            would[p] = would.get(p, 0) + 1
    out: list[Change] = []
    suspect_nodes = set()
    # The node's own telemetry before a job's step files (untrusted: their deviation is what
    # the job wrote, and must not take the share from evidence it cannot write); within each,
    # what the tier holds already keeps its place (as the drain guard, first come); then the
    # strongest evidence.
    for ep in sorted(episodes, key=lambda e: (e.source == STEPS, e.tier != APPLIED,
                                              -(e.deviation or 0.0), e.node)):
        suspect_nodes.add(ep.node)
        n = info.get(ep.node)
        if n is None:
            continue
        parts = n.partitions or ("",)
        live = rules.writes(n.name)
        # a stuck node's place is taken already, and the guard could not give it back
        change = _held_by_state(n, ep) or (None if n.name in stuck else _held_by_guard(
            n, ep, parts, used if live else would, members, rules))
        if change is None:
            for p in parts if n.name not in stuck else ():
                would[p] = would.get(p, 0) + 1
                if live:
                    used[p] = used.get(p, 0) + 1
            change = _suspect(n, ep, rules, saved) if live else Change(
                n.name, ActionKind.WOULD_SUSPECT, f"shadow mode: would take {rules.trusted} "
                f"off and set weight {rules.suspect_weight}", ep.id, SHADOW,
                record=ep.tier != SHADOW)
        if change is not None:
            out.append(change)
    out.extend(r for r in _restores(nodes, suspect_nodes, rules, saved)
               if rules.writes(r.node))
    return out


def _stuck(nodes: list[NodeInfo], episodes, rules: TierRules, saved: dict[str, int]
           ) -> set[str]:
    """Nodes the tier does not write now (shadow mode) whose marks it left in Slurm: an
    episode applied before the node turned shadow (open, or ended with its give-back owed:
    `saved`). They are kept from big jobs all the same, so they count toward the guard."""
    open_weight = {ep.node: ep.slurm_weight for ep in episodes}
    out = set()
    for n in nodes:
        if rules.writes(n.name):
            continue
        own = open_weight.get(n.name)
        own = own if own is not None else saved.get(n.name)
        if own is not None and _marked(n, own, rules):
            out.add(n.name)
    return out


def _marked(n: NodeInfo, own: int | None, rules: TierRules) -> bool:
    """Whether the node carries the tier's marks: no trusted feature, at the suspect weight or
    (its own weight saved, `own`) at another than its own. Not the current suspect weight
    alone: one the operator changed since (raised above a site's weights, as the pass's error
    tells them to) left the nodes the tier marked at the old one, and those are the tier's to
    give back and to move, their saved weight kept. A node at its own weight without the
    feature is the site's (slurm.conf declares it so). `own` only while the tier holds the
    node (an open episode's, or an ended one's whose give-back is owed: _restore_weights): a
    given-back episode's saved weight would make any later weight the site sets its marks."""
    return rules.trusted not in n.features and (
        n.weight == rules.suspect_weight or (own is not None and n.weight != own))


def _held_by_state(n: NodeInfo, ep) -> Change | None:
    """A person's or Slurm's drain or down state wins over the tier; an operator's own
    `healthctl drain` (our prefix, mode manual) is a person's decision, as for the guard."""
    parsed = parse_reason(n.reason) if n.drain_set else None
    persons = n.drain_set and (parsed is None or parsed["mode"] == MANUAL_MODE)
    if not (persons or n.down):
        return None
    return Change(n.name, ActionKind.SUSPECT_HELD,
                  f"{n.state} ({n.reason[:60]!r}): a person's or Slurm's state wins; left alone",
                  ep.id, PERSON, record=ep.tier != PERSON)


def _held_by_guard(n: NodeInfo, ep, parts, used: dict[str, int], members: dict[str, int],
                   rules: TierRules) -> Change | None:
    """A partition of the node already has its share of suspects ([suspects] max_share): held,
    and given back if the tier had applied it (the cap was lowered meanwhile)."""
    full = [p for p in parts if used.get(p, 0) >= guard_limit(members.get(p, 1),
                                                               rules.max_share)]
    if not full:
        return None
    # Shadow mode gives nothing back either: a write to Slurm is a write ([actions] enabled).
    # The tier's own marks: an episode it applied, also one a person's drain or a DOWN held
    # since (its tier then reads `person`, the marks are still on the node).
    ours = (rules.writes(n.name) and (ep.tier == APPLIED or ep.slurm_weight is not None)
            and _marked(n, ep.slurm_weight, rules))
    return Change(n.name, ActionKind.SUSPECT_HELD,
                  f"guard: partition {full[0]} already has {used.get(full[0], 0)} suspect(s) "
                  f"([suspects] max_share {rules.max_share:g})" + ("; given back" if ours else ""),
                  ep.id, HELD, record=ep.tier != HELD,
                  features=(*n.features, rules.trusted) if ours else None,
                  active=_active(n, rules, add=True) if ours else None,
                  weight=(ep.slurm_weight if ep.slurm_weight is not None else 1)
                  if ours else None)


def _suspect(n: NodeInfo, ep, rules: TierRules, saved: dict[str, int]) -> Change | None:
    """Take the trusted feature off and set the suspect weight (again, if Slurm lost it);
    None when Slurm already shows the tier applied."""
    feats = tuple(f for f in n.features if f != rules.trusted)
    lost = rules.trusted in n.features or n.weight != rules.suspect_weight
    if not lost and ep.tier == APPLIED:
        return None
    # The weight to give back: the node's own while Slurm shows it (slurm.conf's, read
    # again at a reconfigure that may have changed it; with the feature on, the weight is
    # the node's whatever it is, the suspect weight included), else the one this episode
    # saved, else the one an earlier episode saved (the tier's marks left on the node by an
    # episode that ended while Slurm was away, or in shadow mode). A node with the tier's
    # marks is at a weight the tier set, the current suspect weight or one since changed:
    # never the node's own.
    kept = ep.slurm_weight if ep.slurm_weight is not None else saved.get(n.name)
    own = not _marked(n, kept, rules)
    original = n.weight if own else (kept if kept is not None else 1)
    moved = ep.tier == APPLIED and rules.trusted not in n.features and not own
    why = (f"re-applied: weight {n.weight} to [suspects] suspect_weight "
           f"{rules.suspect_weight} (changed since the tier set it)" if moved else
           f"re-applied: Slurm had {','.join(n.features) or 'no features'} and weight "
           f"{n.weight} again (a reconfigure or restart)" if ep.tier == APPLIED else
           f"{ep.metric} {_num(ep.value)} against peers {_num(ep.peer_median)} "
           f"(deviation {_num(ep.deviation)}): {rules.trusted} off, weight "
           f"{rules.suspect_weight}")
    return Change(n.name, ActionKind.SUSPECT, why, ep.id, APPLIED,
                  features=feats if rules.trusted in n.features else None,
                  active=_active(n, rules, add=False) if rules.trusted in n.features else None,
                  weight=rules.suspect_weight if n.weight != rules.suspect_weight else None,
                  slurm_weight=original, own_weight=own)


def _restores(nodes: list[NodeInfo], suspect_nodes: set[str], rules: TierRules,
              restore_weights: dict[str, int]) -> list[Change]:
    """The feature and weight given back to nodes the tier changed that have no open episode.
    Only a node the tier changed (an episode of it saved its weight) and whose marks it still
    carries (_marked: also at a suspect weight changed since): a node a site left without the
    feature at a weight of its own is not ours to touch."""
    return [Change(other.name, ActionKind.SUSPECT_RESTORE,
                   f"no open suspect episode: {rules.trusted} back, weight "
                   f"{restore_weights[other.name]}",
                   features=(*other.features, rules.trusted),
                   active=_active(other, rules, add=True), weight=restore_weights[other.name])
            for other in nodes
            if other.name not in suspect_nodes and other.name in restore_weights
            and _marked(other, restore_weights[other.name], rules)]


def _active(n: NodeInfo, rules: TierRules, *, add: bool) -> tuple[str, ...] | None:
    """The node's active features with the trusted one added or taken off; None where they
    are its available ones (no node_features plugin): the update sends those. A plugin's
    node lists modes it could boot into beside those it runs: sending every available one
    as active would mark exclusive modes all on."""
    if n.active_features is None:
        return None
    kept = tuple(f for f in n.active_features if f != rules.trusted)
    return (*kept, rules.trusted) if add else kept


def _num(x) -> str:
    return "?" if x is None else f"{x:.3g}"


@dataclass
class PassResult:
    evidence: int = 0
    recorded: dict[str, str] = field(default_factory=dict)
    settled: list = field(default_factory=list)
    expired: list[str] = field(default_factory=list)
    changes: list[Change] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # Slurm calls that failed
    # The detector's failure (a statement timeout, a bug): no new evidence this pass; the
    # tier was still brought in line. "" when it ran.
    detector_error: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return bool(self.errors or self.detector_error)

    def as_dict(self) -> dict:
        return {
            "evidence": self.evidence, "recorded": self.recorded,
            "settled": [{"node": n, "state": s.value, "why": w} for n, s, w in self.settled],
            "expired": self.expired,
            "changes": [{"node": c.node, "action": c.kind.value, "why": c.why}
                        for c in self.changes],
            "errors": self.errors, "detector_error": self.detector_error,
            "notes": self.notes,
        }


def detector() -> Callable | None:
    """The fail-slow detector (rsc_health.historian.failslow.detect), or None when this
    install has none."""
    try:
        from rsc_health.historian.failslow import detect  # type: ignore[attr-defined]
    except ImportError:
        return None
    return detect


def manager_pass(engine, slurm, cfg, now: datetime, *, detect: Callable | None = None,
                 log: Callable[[str], None] = lambda msg: None) -> PassResult:
    """One pass: new evidence -> episodes; qualification results and expiry end them; then
    Slurm is brought in line with the open episodes (re-applying what Slurm lost)."""
    from rsc_health.historian import suspects as hs

    res = PassResult()
    detect = detect or detector()
    if detect is None:
        res.notes.append("no fail-slow detector installed (rsc_health.historian.failslow."
                         "detect): no new evidence this pass")
        log(res.notes[-1])
    else:
        try:
            evidence = list(detect(engine, now, cfg))
        except Exception as exc:  # noqa: BLE001 - the tier is still brought in line below
            # The detector failed (a statement timeout on a week's read, a bug): no new
            # evidence this pass, but the episodes on record still expire and Slurm is still
            # brought in line with them (a reconfigure's lost changes re-applied).
            from rsc_health.historian.db import first_line

            evidence = None
            res.detector_error = (f"fail-slow detector: {type(exc).__name__}: "
                                  f"{first_line(exc)}"[:300] + " (no new evidence this pass)")
        if evidence is not None:
            res.evidence = len(evidence)
            res.recorded = hs.record(engine, evidence, now, expire_after=timedelta(
                hours=float(cfg.get("suspects.expire_after_h"))))
    res.settled = hs.settle(engine, now, tier=str(cfg.get("suspects.qualify_tier")))
    res.expired = hs.expire(engine, now)
    res.changes, errors = apply(engine, slurm, cfg, now, log=log)
    res.errors += errors
    return res


def apply(engine, slurm, cfg, now: datetime, *,
          log: Callable[[str], None] = lambda msg: None) -> tuple[list[Change], list[str]]:
    """Bring Slurm in line with the open episodes. (changes made or recorded, errors)."""
    from rsc_health.historian import suspects as hs

    rules = TierRules.from_config(cfg)
    episodes = hs.active(engine)
    try:
        nodes = slurm.nodes()
    except SlurmError as exc:
        return [], [f"Slurm: {exc}"]
    _seen_returned(engine, nodes, rules, now)
    # every node without the feature: one the tier marked may be at a suspect weight the
    # operator changed since (_marked reads the weight each saved)
    restore = _restore_weights(engine, {n.name for n in nodes
                                        if rules.trusted not in n.features})
    done, errors = [], []
    away: SlurmUnavailable | None = None
    changes = plan(nodes, episodes, rules, restore)
    info = {n.name: n for n in nodes}
    for ch in changes:
        if ch.kind is ActionKind.SUSPECT and ch.own_weight and ch.weight is not None \
                and ch.slurm_weight is not None and ch.slurm_weight >= rules.suspect_weight:
            # Slurm fills the lowest weights first: a suspect lowered from its own weight is
            # filled first by small jobs, not last. Kept off big jobs all the same (the feature).
            errors.append(f"{ch.node}: its own weight {ch.slurm_weight} is not below [suspects] "
                          f"suspect_weight {rules.suspect_weight}: as a suspect small jobs would "
                          "reach it first, not last; set suspect_weight above every node's")
    for ch in changes:
        if away is not None and (ch.features is not None or ch.weight is not None):
            # One timeout for the pass, not one per node: the next pass tries again.
            errors.append(f"{ch.node}: not tried, Slurm unavailable ({away})")
            continue
        if ch.episode_id is not None and ch.slurm_weight is not None and ch.weight is not None:
            # Before the update: one that lands with its answer lost leaves the node at the
            # suspect weight, where the next pass can no longer read the node's own.
            hs.keep_weight(engine, ch.episode_id, ch.slurm_weight, replace=ch.own_weight)
        try:
            if ch.features is not None or ch.weight is not None:
                # One update: slurmctld never schedules (nor a failed call leaves) a node
                # with the feature changed and not the weight, or the reverse.
                slurm.update_node(ch.node, features=ch.features, weight=ch.weight,
                                  **({"active": ch.active} if ch.active is not None else {}))
        except SlurmError as exc:
            if isinstance(exc, SlurmUnavailable):
                away = exc
            errors.append(f"{ch.node}: {exc}")
            log(f"suspect tier: {ch.node}: {exc}")
            continue
        if ch.episode_id is not None:
            hs.set_tier(engine, ch.episode_id, ch.tier,
                        ch.slurm_weight if ch.own_weight else None)
        if ch.kind is ActionKind.SUSPECT_RESTORE:
            _given_back(engine, ch.node)
        if ch.record:
            action(engine, ch.node, ch.kind, ch.why, now)
            log(f"suspect tier: {ch.node}: {ch.kind.value}: {ch.why}")
        done.append(ch)
        back = _ended_meanwhile(engine, ch, info.get(ch.node), rules)
        if back is not None:
            # A person's clear (or a qualification) ended the episode after this pass read
            # it; its own pass read Slurm before this update landed and found nothing to give
            # back. Checked after the update: a clear committed before its pass read Slurm, so
            # either that pass saw this update or this check sees the clear.
            try:
                slurm.update_node(back.node, features=back.features, weight=back.weight,
                                  **({"active": back.active} if back.active is not None
                                     else {}))
            except SlurmError as exc:
                errors.append(f"{back.node}: {exc} (the next pass gives it back)")
                continue
            _given_back(engine, back.node)
            action(engine, back.node, back.kind, back.why, now)
            log(f"suspect tier: {back.node}: {back.kind.value}: {back.why}")
            done.append(back)
    return done, errors


def _ended_meanwhile(engine, ch: Change, n: NodeInfo | None, rules: TierRules
                     ) -> Change | None:
    """The restore of a node this pass just made suspect whose episode ended since the pass
    read it; None when it is still open (or the change was not a suspect's)."""
    from rsc_health.historian import suspects as hs

    if ch.kind is not ActionKind.SUSPECT or ch.episode_id is None or n is None \
            or hs.is_open(engine, ch.episode_id):
        return None
    weight = ch.slurm_weight if ch.slurm_weight is not None else n.weight
    return Change(n.name, ActionKind.SUSPECT_RESTORE,
                  f"its episode ended while this pass applied it (a person's clear or a "
                  f"qualification): {rules.trusted} back, weight {weight}",
                  features=(*(f for f in n.features if f != rules.trusted), rules.trusted),
                  active=_active(n, rules, add=True), weight=weight)


def _restore_weights(engine, nodes: set[str]) -> dict[str, int]:
    """{node: the weight its newest applied episode saved} for nodes to give back: only while
    the tier holds the node, its episode open or ended with its give-back still owed (Slurm
    away, or shadow mode, when it ended). An ended episode whose marks were given back (tier
    `returned`, or a suspect_restore on record since it ended) is history: a site that later
    takes the node off big jobs at a weight of its own is not undone by its saved weight."""
    from sqlalchemy import func, select

    from rsc_health.historian.schema import node_actions as a
    from rsc_health.historian.schema import suspects as s
    from rsc_health.model import TIER_RETURNED, SuspectState

    if not nodes:
        return {}
    names = sorted(nodes)
    with engine.connect() as conn:
        rows = conn.execute(select(s.c.node, s.c.slurm_weight, s.c.state, s.c.tier,
                                   s.c.changed)
                            .where(s.c.node.in_(names), s.c.slurm_weight.is_not(None))
                            .order_by(s.c.id)).all()
        restored = dict(conn.execute(
            select(a.c.node, func.max(a.c.time))
            .where(a.c.node.in_(names), a.c.action == ActionKind.SUSPECT_RESTORE.value)
            .group_by(a.c.node)).all())
    newest = {r.node: r for r in rows}
    return {node: int(r.slurm_weight) for node, r in newest.items()
            if r.state == SuspectState.SUSPECT.value
            or (r.tier != TIER_RETURNED
                and not (restored.get(node) is not None and restored[node] >= r.changed))}


def _seen_returned(engine, nodes: list[NodeInfo], rules: TierRules, now: datetime) -> None:
    """Ended episodes with a saved weight whose node Slurm shows trusted: their marks are gone
    (given back, or lost to a reconfigure before the episode ended), so nothing is owed and
    their saved weight is history (`returned`). Only an episode ended SAME_CHANGE_WITHIN ago:
    an update sent just before its end whose answer was lost may still land."""
    from sqlalchemy import select

    from rsc_health.historian import suspects as hs
    from rsc_health.historian.schema import suspects as s
    from rsc_health.model import TIER_RETURNED, SuspectState

    trusted = {n.name for n in nodes if rules.trusted in n.features}
    with engine.connect() as conn:
        rows = conn.execute(select(s.c.id, s.c.node).where(
            s.c.state != SuspectState.SUSPECT.value, s.c.slurm_weight.is_not(None),
            s.c.tier != TIER_RETURNED, s.c.changed <= now - SAME_CHANGE_WITHIN)).all()
    ids = [r.id for r in rows if r.node in trusted]
    if ids:
        hs.returned(engine, ids)


def _given_back(engine, node: str) -> None:
    """A restore of `node` landed: its ended episodes' marks are given back."""
    from sqlalchemy import select

    from rsc_health.historian import suspects as hs
    from rsc_health.historian.schema import suspects as s
    from rsc_health.model import TIER_RETURNED, SuspectState

    with engine.connect() as conn:
        ids = list(conn.execute(select(s.c.id).where(
            s.c.node == node, s.c.state != SuspectState.SUSPECT.value,
            s.c.slurm_weight.is_not(None), s.c.tier != TIER_RETURNED)).scalars())
    if ids:
        hs.returned(engine, ids)


# Two passes at once (the timer's and the strigger hook's after a reconfigure) both read Slurm
# before either wrote and make the same change: one change, recorded once. The same change
# said again after this long is a change of its own (Slurm lost it again).
SAME_CHANGE_WITHIN = timedelta(minutes=2)


def action(engine, node: str, kind: ActionKind, reason: str, now: datetime) -> None:
    """The node_actions row of a tier change, unless a pass beside this one recorded the same
    change of the node (same action and words) within SAME_CHANGE_WITHIN."""
    from sqlalchemy import insert, select

    from rsc_health.historian.db import TURNS_SUSPECTS, take_turns, writer
    from rsc_health.historian.schema import node_actions as a

    reason = reason[:1000]
    aid = hashlib.sha256(f"{node}|{kind}|{reason}|{now.isoformat()}".encode()).hexdigest()
    with writer(engine).begin() as conn:
        take_turns(conn, TURNS_SUSPECTS, [node])
        if conn.execute(select(a.c.id).where(
                a.c.node == node, a.c.action == kind.value, a.c.reason == reason,
                a.c.time >= now - SAME_CHANGE_WITHIN, a.c.time <= now + SAME_CHANGE_WITHIN)
                ).first() is not None:
            return
        conn.execute(insert(a).values(id=aid[:32], time=now, node=node, action=kind.value,
                                      reason=reason))
