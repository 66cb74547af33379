"""Suspect episodes in the historian (table `suspects`, migration 0010).

One row per episode of a node: opened by fail-slow evidence (`SuspectEvidence`, from
rsc_health.historian.failslow), renewed by more, ended

    cleared    by a qualification pass after it opened, of [suspects] qualify_tier or a deeper
               one (lite < full < deep), or by a person (`healthctl suspects
               clear NODE --reason`), who is named in changed_by with the reason;
    confirmed  by a qualification fail after it opened that drained the node (the flow's
               drain of a failed test, ticketed): a fail whose drain the mass-drain guard held
               back left the node in service, so its episode stays open (still kept off big
               jobs, qualified again), as does a fail no flow drained (a person's own run);
    expired    when no evidence renewed it for [suspects] expire_after_h.

Evidence counts only when it is newer than the node's last ended episode: a person's clear (or
a node a person resumed after a confirmed suspicion) wins over the evidence that was already
known; only evidence seen after it opens a new episode. Times are naive UTC.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import and_, func, insert, or_, select, update

from rsc_health.historian.db import TURNS_SUSPECTS, take_turns, writer
from rsc_health.historian.failslow.evidence import STEPS, SuspectEvidence
from rsc_health.historian.schema import node_actions, qualify_runs, suspects
from rsc_health.model import TIER_RETURNED, SuspectState

MAX_JOB_IDS = 32  # job ids kept per episode (the newest evidence's first)
MAX_DETAIL = 1000
SYSTEM = "rsc_health"  # changed_by for what rsc-health itself decided


@dataclass(frozen=True)
class Episode:
    id: int
    node: str
    state: SuspectState
    since: datetime
    last_evidence: datetime
    expires: datetime
    metric: str
    value: float | None
    peer_median: float | None
    deviation: float | None
    job_ids: tuple[str, ...]
    source: str
    detail: str
    changed: datetime
    changed_by: str
    change_reason: str
    tier: str
    slurm_weight: int | None

    def as_dict(self) -> dict:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d["state"] = self.state.value
        d["job_ids"] = list(self.job_ids)
        for k in ("since", "last_evidence", "expires", "changed"):
            d[k] = d[k].isoformat()
        return d


def _episode(row) -> Episode:
    m = row._mapping
    return Episode(
        id=m["id"], node=m["node"], state=SuspectState(m["state"]), since=m["since"],
        last_evidence=m["last_evidence"], expires=m["expires"], metric=m["metric"],
        value=m["value"], peer_median=m["peer_median"], deviation=m["deviation"],
        job_ids=tuple(j for j in (m["job_ids"] or "").split(",") if j), source=m["source"],
        detail=m["detail"], changed=m["changed"], changed_by=m["changed_by"],
        change_reason=m["change_reason"], tier=m["tier"], slurm_weight=m["slurm_weight"])


def _finite(x) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if v == v and abs(v) != float("inf") else None


def _strongest(evs: list[SuspectEvidence]) -> SuspectEvidence:
    """The evidence an episode is filed under: the node's own telemetry before a job's step
    files (untrusted: the guard ranks an episode by its source, and a job writing slow steps
    for a node the telemetry already showed slow must not turn its episode into a step-file
    one, last in the guard's line and given back to big jobs), then the largest deviation.
    The others are named in the detail."""
    return max(evs, key=lambda e: (e.source != STEPS, _finite(e.deviation) or 0.0))


def _fields(evs: list[SuspectEvidence], prior_jobs: Iterable[str] = ()) -> dict:
    top = _strongest(evs)
    jobs: list[str] = []
    for e in sorted(evs, key=lambda e: e.last, reverse=True):
        jobs += [str(j)[:32] for j in e.job_ids if "," not in str(j)]
    jobs += list(prior_jobs)
    uniq = list(dict.fromkeys(jobs))[:MAX_JOB_IDS]
    more = "" if len(evs) == 1 else f" (+{len(evs) - 1} more metric(s): " + ", ".join(
        sorted({e.metric for e in evs if e is not top})) + ")"
    return dict(metric=str(top.metric)[:64], value=_finite(top.value),
                peer_median=_finite(top.peer_median), deviation=_finite(top.deviation),
                job_ids=",".join(uniq), source=str(top.source)[:16],
                detail=(str(top.detail) + more)[:MAX_DETAIL])


def record(engine, evidence: Iterable[SuspectEvidence], now: datetime, *,
           expire_after: timedelta) -> dict[str, str]:
    """Open or renew episodes from the detector's evidence. {node: "new" | "renewed" |
    "ignored (...)"}; evidence no newer than the node's last ended episode is ignored."""
    by_node: dict[str, list[SuspectEvidence]] = {}
    for ev in evidence:
        if not isinstance(ev.node, str) or not ev.node or len(ev.node) > 128:
            continue
        by_node.setdefault(ev.node, []).append(ev)
    out: dict[str, str] = {}
    if not by_node:
        return out
    with writer(engine).begin() as conn:
        # Two passes at once (the timer and the strigger hook): one opens, the other renews.
        take_turns(conn, TURNS_SUSPECTS, sorted(by_node))
        for node, evs in sorted(by_node.items()):
            last = max(e.last for e in evs)
            since = min(e.since for e in evs)
            rows = conn.execute(select(suspects).where(suspects.c.node == node)
                                .order_by(suspects.c.id.desc()).limit(1)).first()
            current = _episode(rows) if rows is not None else None
            if current is not None and current.state is SuspectState.SUSPECT:
                f = _fields(evs, current.job_ids)
                if current.source != STEPS and all(e.source == STEPS for e in evs):
                    # Step files alone renew a telemetry episode, never refile it under them
                    # (more evidence never lowers a node's place in the guard's line).
                    f = {"job_ids": f["job_ids"]}
                newest = max(last, current.last_evidence)
                conn.execute(update(suspects).where(suspects.c.id == current.id).values(
                    last_evidence=newest, expires=newest + expire_after, **f))
                out[node] = "renewed"
                continue
            # When the last episode ended. One stamped after now, by a clock that was ahead (a
            # year), must not shut out every evidence until that clock's time: it is taken to
            # have ended with the last evidence it knew.
            ended = None if current is None else (
                current.changed if current.changed <= now
                else min(current.last_evidence, now))
            if current is not None and ended is not None and last <= ended:
                out[node] = (f"ignored (evidence up to {last:%Y-%m-%d %H:%M} is not newer "
                             f"than its {current.state.value} episode, "
                             f"{ended:%Y-%m-%d %H:%M})")
                continue
            if ended is not None:
                # Only the evidence seen after the last episode ended opens the new one.
                since = max(since, ended)
            conn.execute(insert(suspects).values(
                node=node, state=SuspectState.SUSPECT.value, since=since, last_evidence=last,
                expires=last + expire_after,
                changed=now, changed_by=SYSTEM, change_reason="fail-slow evidence", tier="",
                **_fields(evs)))
            out[node] = "new"
    return out


def _end(conn, episode_id: int, state: SuspectState, now: datetime, who: str, why: str) -> None:
    conn.execute(update(suspects).where(suspects.c.id == episode_id,
                                        suspects.c.state == SuspectState.SUSPECT.value).values(
        state=state.value, changed=now, changed_by=who[:64], change_reason=why[:1000]))


def expire(engine, now: datetime) -> list[str]:
    """Episodes whose evidence stopped: expired. The nodes."""
    with writer(engine).begin() as conn:
        rows = conn.execute(select(suspects.c.id, suspects.c.node, suspects.c.last_evidence)
                            .where(suspects.c.state == SuspectState.SUSPECT.value,
                                   suspects.c.expires <= now)).all()
        for r in rows:
            _end(conn, r.id, SuspectState.EXPIRED, now, SYSTEM,
                 f"no evidence since {r.last_evidence:%Y-%m-%d %H:%M}")
    return [r.node for r in rows]


def settle(engine, now: datetime, *, tier: str) -> list[tuple[str, SuspectState, str]]:
    """Episodes a qualification run decided, after the episode opened: a pass of `tier`
    ([suspects] qualify_tier) or a deeper one clears, a fail of any tier confirms once the
    flow drained the node for it (its QUALIFY_DRAIN with a failed test's code since the
    episode opened); an inconclusive run decides nothing, nor does a fail left undrained, nor
    a pass of a shallower tier (the lite tier's seconds of DCGM level 1 cannot see a GPU in HW
    slowdown or a link at x8: what made the node a suspect). [(node, new state, why)]."""
    from rsc_health.qualify.judge import FAIL, PASS
    from rsc_health.qualify.runner import TIERS

    # The tiers are ordered lite < full < deep; a tier this build does not know clears none.
    deep_enough = list(TIERS[TIERS.index(tier):]) if tier in TIERS else []
    decides = or_(qualify_runs.c.verdict == FAIL,
                  and_(qualify_runs.c.verdict == PASS, qualify_runs.c.tier.in_(deep_enough)))
    out = []
    with writer(engine).begin() as conn:
        for ep in [_episode(r) for r in conn.execute(select(suspects).where(
                suspects.c.state == SuspectState.SUSPECT.value)).all()]:
            run = conn.execute(select(qualify_runs.c.verdict, qualify_runs.c.run_id,
                                      qualify_runs.c.tier, qualify_runs.c.ended)
                               .where(qualify_runs.c.node == ep.node,
                                      qualify_runs.c.ended > ep.changed, decides)
                               .order_by(qualify_runs.c.ended.desc())).first()
            if run is None or (run.verdict == FAIL and not _fail_drained(conn, ep)):
                continue
            state = SuspectState.CLEARED if run.verdict == PASS else SuspectState.CONFIRMED
            why = f"qualification {run.verdict} ({run.tier}, run {run.run_id[:12]})"
            _end(conn, ep.id, state, now, "qualify", why)
            out.append((ep.node, state, why))
    return out


def _fail_drained(conn, ep: Episode) -> bool:
    """Whether a qualification flow drained the node for a failed test since the episode
    opened (not for a run that proved nothing, a fail the guard held, or a repair's three
    strikes: those drains carry a retry or repair code)."""
    from rsc_health.model import ActionKind
    from rsc_health.policy import QUALIFY_MODE, parse_reason
    from rsc_health.qualify.flow import RETRY_CODES, STRIKES_CODE

    reasons = conn.execute(select(node_actions.c.reason).where(
        node_actions.c.node == ep.node, node_actions.c.action == ActionKind.QUALIFY_DRAIN.value,
        node_actions.c.time > ep.changed)).scalars()
    for reason in reasons:
        parsed = parse_reason(reason)
        if parsed is not None and parsed["mode"] == QUALIFY_MODE \
                and parsed["code"] not in (*RETRY_CODES, STRIKES_CODE):
            return True
    return False


def clear(engine, node: str, now: datetime, *, who: str, why: str) -> Episode | None:
    """A person clears a node's open episode; None when it has none."""
    with writer(engine).begin() as conn:
        row = conn.execute(select(suspects).where(
            suspects.c.node == node, suspects.c.state == SuspectState.SUSPECT.value)).first()
        if row is None:
            return None
        _end(conn, row.id, SuspectState.CLEARED, now, who, why)
    return _episode(row)


def is_open(engine, episode_id: int) -> bool:
    """Whether the episode is still a suspect's (not cleared, confirmed or expired)."""
    with engine.connect() as conn:
        state = conn.execute(select(suspects.c.state).where(
            suspects.c.id == episode_id)).scalar()
    return state == SuspectState.SUSPECT.value


def keep_weight(engine, episode_id: int, slurm_weight: int, *, replace: bool = True) -> None:
    """The node's own weight, kept before the tier's update is sent: an update slurmctld took
    whose answer was lost (a timeout) must still give the node its weight back. `replace`
    False (a weight not read off the node): only where none is kept yet, so a pass beside one
    that read the node's own does not overwrite it with a guess."""
    where = [suspects.c.id == episode_id]
    if not replace:
        where.append(suspects.c.slurm_weight.is_(None))
    with writer(engine).begin() as conn:
        conn.execute(update(suspects).where(*where).values(slurm_weight=slurm_weight))


def set_tier(engine, episode_id: int, tier: str, slurm_weight: int | None = None) -> None:
    values: dict = {"tier": tier}
    if slurm_weight is not None:
        values["slurm_weight"] = slurm_weight
    with writer(engine).begin() as conn:
        conn.execute(update(suspects).where(suspects.c.id == episode_id).values(**values))


def returned(engine, episode_ids: list[int]) -> None:
    """Ended episodes whose marks are no longer in Slurm (given back, or the node seen
    trusted): tier `returned`, so their saved weight never makes the node's later state, a
    site's own, read as the tier's marks."""
    ids = sorted(set(episode_ids))
    with writer(engine).begin() as conn:
        for i in range(0, len(ids), 500):  # SQLite's bound on a statement's variables
            conn.execute(update(suspects).where(
                suspects.c.id.in_(ids[i:i + 500]),
                suspects.c.state != SuspectState.SUSPECT.value).values(tier=TIER_RETURNED))


def active(engine) -> list[Episode]:
    """Open episodes, one per node, strongest deviation first."""
    with engine.connect() as conn:
        rows = conn.execute(select(suspects).where(
            suspects.c.state == SuspectState.SUSPECT.value)).all()
    return sorted((_episode(r) for r in rows),
                  key=lambda e: (-(e.deviation or 0.0), e.node))


def ended_at(engine) -> dict[str, datetime]:
    """{node: when its last ended episode ended} (cleared, confirmed or expired): evidence
    from before it was already judged."""
    with engine.connect() as conn:
        rows = conn.execute(select(suspects.c.node, func.max(suspects.c.changed))
                            .where(suspects.c.state != SuspectState.SUSPECT.value)
                            .group_by(suspects.c.node)).all()
    return {n: t for n, t in rows if t is not None}


def recent(engine, since: datetime, node: str | None = None) -> list[Episode]:
    """Episodes open now or changed since `since` (newest first); one node's when named."""
    q = select(suspects).where((suspects.c.state == SuspectState.SUSPECT.value)
                               | (suspects.c.changed >= since))
    if node is not None:
        q = q.where(suspects.c.node == node)
    with engine.connect() as conn:
        rows = conn.execute(q.order_by(suspects.c.changed.desc(), suspects.c.id.desc())).all()
    return [_episode(r) for r in rows]


def of_node(engine, node: str, limit: int = 5) -> list[Episode]:
    with engine.connect() as conn:
        rows = conn.execute(select(suspects).where(suspects.c.node == node)
                            .order_by(suspects.c.id.desc()).limit(limit)).all()
    return [_episode(r) for r in rows]


def counts(engine) -> dict[str, int]:
    """{state: episodes}: what the exporter and status summarise."""
    with engine.connect() as conn:
        rows = conn.execute(select(suspects.c.state, func.count())
                            .group_by(suspects.c.state)).all()
    return {s: n for s, n in rows}
