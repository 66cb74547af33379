"""Lemon verdicts: threshold rules over the features, each with the evidence behind it.

A node is a lemon candidate when at least `min_signals` rules cross their thresholds, or when one
"strong" rule does (a rule whose threshold alone is damning, e.g. several failures attributed to
the node), or when it is a repeat offender: it came back from a lemon drain or a lemon ticket and
failed a job again. Thresholds live in the `[lemon]` config section; a threshold of 0 turns a
rule off (the paper found excl_jobid_count weakly correlated, so it is off by default).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

import numpy as np
import pandas as pd
from scipy.stats import poisson
from sqlalchemy import Engine, and_, func, or_, select

from rsc_health.config import packaged_default
from rsc_health.historian.attribute import HOST_FAIL_STATES
from rsc_health.historian.lemons.features import (
    ATTRIBUTED_KINDS,
    FAILED_STATES,
    OutageRules,
    lemon_repairs,
    window_bounds,
)
from rsc_health.historian.schema import (
    attributions,
    check_results,
    job_exclusions,
    job_nodes,
    jobs,
    node_events,
    tickets,
)
from rsc_health.model import Status

# feature -> config key of its threshold. A rule fires when feature >= threshold (> 0).
RULES: dict[str, str] = {
    "node_fails": "node_fails",
    "multi_node_node_fails": "multi_node_node_fails",
    "single_node_node_fails": "single_node_node_fails",
    "single_node_node_failure_rate": "single_node_node_failure_rate",
    "single_node_fail_rate_any": "single_node_fail_rate_any",
    "early_fails": "early_fails",
    "xid_cnt": "xid_cnt",
    "tickets": "tickets",
    "out_count": "out_count",
    "repeat_outs": "repeat_outs",
    "fail_causes": "fail_causes",
    "excl_jobid_count": "excl_jobid_count",
    "tickets_history": "tickets_history",
    "out_count_history": "out_count_history",
    "down_outs_history": "down_outs_history",
    "rate_surprise": "rate_surprise",
}
RATE_RULES = {"single_node_node_failure_rate", "single_node_fail_rate_any"}
# Absolute counts of outages and tickets: on a system whose every node fails often they fire
# for the whole fleet, so they fire only where the threshold is rare at the node's peer
# group's own level of that count (`count_rule_p`, selective_in_group), or on a node whose
# episodes are unusual at its peer group's rate: BH-adjusted q at most `peer_q` (features.py:
# rate_q).
PEER_GATED_RULES = {
    "tickets", "out_count", "repeat_outs", "tickets_history", "out_count_history",
    "down_outs_history",
}

# The packaged [lemon] section, for callers without a Config.
DEFAULTS: dict[str, Any] = packaged_default("lemon")


@dataclass(frozen=True)
class LemonRules:
    """The `[lemon]` thresholds, with DEFAULTS for anything the config leaves out."""

    thresholds: dict[str, float]
    min_signals: int = DEFAULTS["min_signals"]
    strong: tuple[str, ...] = tuple(DEFAULTS["strong"])
    min_single_node_jobs: int = DEFAULTS["min_single_node_jobs"]
    repeat_offender_fails: int = DEFAULTS["repeat_offender_fails"]
    peer_q: float = DEFAULTS["peer_q"]
    count_rule_p: float = DEFAULTS["count_rule_p"]

    @classmethod
    def from_config(cls, section: Mapping[str, Any] | None = None) -> LemonRules:
        merged = {**DEFAULTS, **(section or {})}
        return cls(
            thresholds={feat: float(merged[key]) for feat, key in RULES.items()},
            min_signals=int(merged["min_signals"]),
            strong=tuple(merged["strong"]),
            min_single_node_jobs=int(merged["min_single_node_jobs"]),
            repeat_offender_fails=int(merged["repeat_offender_fails"]),
            peer_q=float(merged["peer_q"]),
            count_rule_p=float(merged["count_rule_p"]),
        )

    def with_thresholds(self, **changes: float) -> LemonRules:
        return LemonRules(
            {**self.thresholds, **changes},
            self.min_signals,
            self.strong,
            self.min_single_node_jobs,
            self.repeat_offender_fails,
            self.peer_q,
            self.count_rule_p,
        )


@dataclass
class Crossing:
    feature: str
    value: float
    threshold: float


@dataclass
class LemonVerdict:
    node: str
    crossings: list[Crossing]
    repeat_offender: bool = False
    resumed_at: datetime | None = None
    evidence: dict[str, list[dict]] = field(default_factory=dict)
    # The fleet-rate rule's view of the node: its episodes, the expectation at its peer
    # group's rate, q, the group; and what the rule left out of the fleet's counts.
    peer: dict[str, Any] = field(default_factory=dict)
    left_out: dict[str, Any] = field(default_factory=dict)

    @property
    def top_feature(self) -> str:
        if self.repeat_offender and not self.crossings:
            return "repeat_offender"
        # The crossing furthest past its threshold leads the reason string.
        return max(self.crossings, key=lambda c: c.value / c.threshold).feature

    def summary(self) -> str:
        parts = [
            f"{self.peer.get('by', 'episodes')}={self.peer['episodes']} vs "
            f"{self.peer['expected']:.2f} expected at "
            f"the rate of {self.peer['group'] or 'its peers'} (q={self.peer['q']:.1e})"
            if c.feature == "rate_surprise" and self.peer
            else f"{c.feature}={_fmt(c.value)}>={_fmt(c.threshold)}"
            for c in self.crossings
        ]
        if self.repeat_offender:
            parts.insert(0, "repeat offender")
        text = ", ".join(parts)
        incident = int(self.peer.get("incident_episodes", 0))
        if incident:
            text += (f" ({incident} episode{'s' if incident > 1 else ''} on fleet-wide incident "
                     f"days of {self.peer['group'] or 'its peers'} left out)")
        return text

    def to_dict(self) -> dict:
        d = asdict(self)
        d["top_feature"] = self.top_feature
        d["summary"] = self.summary()
        d["resumed_at"] = self.resumed_at.isoformat() if self.resumed_at else None
        return d


def _fmt(v: float) -> str:
    return f"{v:.2f}" if v != int(v) else str(int(v))


def crossings_frame(features: pd.DataFrame, rules: LemonRules) -> pd.DataFrame:
    """Boolean frame: which rule each node crosses (vectorised, for tuning on big grids)."""
    out = pd.DataFrame(index=features.index)
    enough_singles = features["single_node_jobs"] >= rules.min_single_node_jobs
    above_peers = above_peer_rate(features, rules.peer_q)
    for feat, threshold in rules.thresholds.items():
        if threshold <= 0 or feat not in features:
            continue
        crossed = features[feat] >= threshold
        if feat in RATE_RULES:
            crossed &= enough_singles  # one failed job out of two is noise, not a rate
        if feat in PEER_GATED_RULES:
            crossed &= above_peers | selective_in_group(features, feat, threshold,
                                                        rules.count_rule_p)
        out[feat] = crossed
    return out


def above_peer_rate(features: pd.DataFrame, peer_q: float) -> pd.Series:
    """Nodes whose episodes are unusual at their peer group's rate: rate_q <= peer_q. Every
    node when peer_q >= 1 or the features have no rate columns, and a node with episodes but
    nothing to judge them against (no peers: rate_expected 0). A node without an episode of
    its own (every outage of it maintenance, fleet-wide or a moved GPU's) is not: its counts
    are of faults that were not its own."""
    if peer_q >= 1 or "rate_q" not in features:
        return pd.Series(True, index=features.index)
    return (features["rate_q"] <= peer_q) | (
        (features["rate_expected"] <= 0) & (features["episodes"] > 0))


def selective_in_group(features: pd.DataFrame, feat: str, threshold: float,
                       count_rule_p: float) -> pd.Series:
    """Per node: whether the count rule `feat >= threshold` is rare in the node's peer group,
    so the absolute threshold means there what it means on the fleet it was fitted to. A node
    at its group's mean count (the other nodes' mean, so a lemon does not raise its own bar)
    reaches the threshold with Poisson probability at most count_rule_p. On a system whose
    every node goes out ten times a quarter, 3 outages is no signal (the node must then be
    unusual at its group's rate, above_peer_rate); on one where 3 is far above the usual 0.6,
    it is the paper's rule, whatever the group's size. count_rule_p <= 0: never (the
    per-node gate alone decides)."""
    if count_rule_p <= 0 or feat not in features:
        return pd.Series(False, index=features.index)
    groups = (features["peer_group"] if "peer_group" in features
              else pd.Series("", index=features.index))
    values = features[feat].astype("float64")
    total = values.groupby(groups).transform("sum")
    size = values.groupby(groups).transform("size")
    if "peer_nodes" in features:  # the group's quiet nodes count towards its mean
        size = np.maximum(size, features["peer_nodes"])
    others = (size - 1).where(size > 1)
    mean = ((total - values) / others).to_numpy(dtype="float64", na_value=np.nan)
    rare = np.zeros(len(mean), dtype=bool)
    known = ~np.isnan(mean)  # a node alone in its group has no group level to compare with
    rare[known] = poisson.sf(threshold - 1, mean[known]) <= count_rule_p
    return pd.Series(rare, index=features.index)


def flagged(features: pd.DataFrame, rules: LemonRules, repeat: pd.Series | None = None):
    """Boolean Series: the nodes the rules call lemons."""
    crossed = crossings_frame(features, rules)
    hit = crossed.sum(axis=1) >= rules.min_signals
    strong = [s for s in rules.strong if s in crossed]
    if strong:
        hit |= crossed[strong].any(axis=1)
    if repeat is not None:
        hit |= repeat.reindex(features.index, fill_value=False)
    return hit


def repeat_offenders(
    engine: Engine, as_of: datetime, window_days: float, min_fails: int = 1
) -> pd.DataFrame:
    """Nodes resumed after a lemon drain or a lemon ticket that failed a job again since.

    resumed_at is the latest of: a closed lemon ticket's `closed`, and a `resume` node action
    after a lemon drain. fails_since counts job instances ending after resumed_at (inside the
    window, before as_of) that were attributed to the node, or single-node NODE_FAILs on it.
    """
    lo, hi = window_bounds(as_of, window_days)
    resumed = lemon_repairs(engine, hi)
    if not resumed:
        return pd.DataFrame(columns=["resumed_at", "fails_since"]).rename_axis("node")
    j, jn, a = jobs, job_nodes, attributions
    with engine.connect() as conn:
        attributed = conn.execute(
            select(a.c.node, j.c.id, j.c.end)
            .select_from(j.join(a, and_(a.c.job_pk == j.c.id, a.c.kind.in_(ATTRIBUTED_KINDS))))
            .where(j.c.end >= lo, j.c.end < hi, a.c.node.in_(list(resumed)))
        ).all()
        singles = conn.execute(
            select(jn.c.node, j.c.id, j.c.end)
            .select_from(j.join(jn, jn.c.job_pk == j.c.id))
            .where(
                j.c.end >= lo,
                j.c.end < hi,
                j.c.nnodes == 1,
                j.c.state.in_(HOST_FAIL_STATES),
                jn.c.node.in_(list(resumed)),
            )
        ).all()
    fails = pd.DataFrame(attributed + singles, columns=["node", "job_pk", "end"]).drop_duplicates()
    fails["resumed_at"] = fails["node"].map(resumed)
    after = fails[fails["end"] > fails["resumed_at"]]
    counts = after.groupby("node")["job_pk"].nunique()
    out = pd.DataFrame({"resumed_at": pd.Series(resumed)}).rename_axis("node")
    out["fails_since"] = counts.reindex(out.index, fill_value=0).astype(int)
    out["repeat"] = out["fails_since"] >= min_fails
    return out


def lemon_verdicts(
    engine: Engine,
    features: pd.DataFrame,
    as_of: datetime,
    rules: LemonRules,
    *,
    window_days: float = 28,
    with_evidence: bool = True,
    max_evidence: int = 20,
    history_days: float = 90,
) -> list[LemonVerdict]:
    """The lemon candidates, most damning first (most rules crossed, then most node failures)."""
    repeats = repeat_offenders(engine, as_of, window_days, rules.repeat_offender_fails)
    repeat_flag = repeats["repeat"] if "repeat" in repeats else None
    hit = flagged(features, rules, repeat_flag)
    crossed = crossings_frame(features, rules)
    verdicts = []
    candidates = [str(n) for n in features.index[hit]]
    failed = (failed_jobs_evidence(engine, candidates, as_of, window_days, limit=max_evidence)
              if with_evidence else {})
    for node in features.index[hit]:
        row = features.loc[node]
        cs = [
            Crossing(feat, float(row[feat]), rules.thresholds[feat])
            for feat in crossed.columns
            if crossed.at[node, feat]
        ]
        is_repeat = bool(repeat_flag is not None and repeat_flag.get(node, False))
        v = LemonVerdict(
            node=node,
            crossings=cs,
            repeat_offender=is_repeat,
            resumed_at=repeats.at[node, "resumed_at"].to_pydatetime() if is_repeat else None,
            peer=_peer(row),
            left_out=features.attrs.get("left_out", {}),
        )
        if with_evidence:
            v.evidence = evidence(
                engine, node, as_of, window_days, limit=max_evidence, history_days=history_days,
                application_xids=features.attrs.get("application_xids"),
                failed_jobs=failed.get(str(node), []),
            )
        verdicts.append(v)
    verdicts.sort(
        key=lambda v: (
            -(len(v.crossings) + v.repeat_offender),
            -features.at[v.node, "node_fails"],
            v.node,
        )
    )
    return verdicts


def _peer(row: pd.Series) -> dict[str, Any]:
    if "rate_q" not in row:
        return {}
    # The stream that gave q: every episode, or the repaired ones (with a ticket).
    repairs = row.get("rate_by") == "repairs"
    return {
        "group": str(row.get("peer_group", "")),
        "by": "repairs" if repairs else "episodes",
        "episodes": int(row["repairs"] if repairs else row["episodes"]),
        "expected": round(float(row["repairs_expected"] if repairs else row["rate_expected"]),
                          4),
        "q": float(row["rate_q"]),
        # its episodes that began on a fleet-wide incident day: the incident's, counted nowhere
        "incident_episodes": int(row.get("incident_episodes", 0)),
    }


def evidence(
    engine: Engine,
    node: str,
    as_of: datetime,
    window_days: float = 28,
    *,
    limit: int = 20,
    history_days: float = 90,
    application_xids: tuple[str, ...] | None = None,
    failed_jobs: list[dict] | None = None,
) -> dict[str, list[dict]]:
    """The rows behind a node's features: failed jobs, XID events, outages, tickets, exclusions.
    `failed_jobs`: that list already read (failed_jobs_evidence, for every candidate at once).

    Each list is newest first and at most `limit` long; these are what an operator reads before
    agreeing that the node goes to repair. Outages and tickets reach back over the history
    window, as the *_history features do. XID events are those xid_cnt counts: never one of
    the `application_xids` (the application's own errors; the packaged catalog's when None).
    """
    if application_xids is None:
        application_xids = OutageRules().application_xids
    lo, hi = window_bounds(as_of, window_days)
    h_lo, _ = window_bounds(as_of, max(history_days, window_days))
    queries = {
        "xid_events": select(
            check_results.c.time,
            check_results.c.component,
            check_results.c.code,
            check_results.c.reason,
        )
        .where(
            check_results.c.node == node,
            check_results.c.check == "xid",
            check_results.c.status.in_((Status.WARN, Status.FAIL)),
            check_results.c.code.not_in(application_xids),
            check_results.c.time >= lo,
            check_results.c.time < hi,
        )
        .order_by(check_results.c.time.desc()),
        "out_of_service": select(
            node_events.c.start, node_events.c.end, node_events.c.state, node_events.c.reason
        )
        .where(node_events.c.node == node, node_events.c.start >= h_lo, node_events.c.start < hi)
        .order_by(node_events.c.start.desc()),
        "tickets": select(tickets.c.opened, tickets.c.closed, tickets.c.reason, tickets.c.source)
        .where(tickets.c.node == node, tickets.c.opened >= h_lo, tickets.c.opened < hi)
        .order_by(tickets.c.opened.desc()),
        "exclusions": select(job_exclusions.c.job_id, job_exclusions.c.time)
        .where(
            job_exclusions.c.node == node,
            job_exclusions.c.time >= lo,
            job_exclusions.c.time < hi,
        )
        .order_by(job_exclusions.c.time.desc()),
    }
    if failed_jobs is None:
        failed_jobs = failed_jobs_evidence(engine, [node], as_of, window_days,
                                           limit=limit).get(node, [])
    out: dict[str, list[dict]] = {"failed_jobs": failed_jobs}
    with engine.connect() as conn:
        for name, stmt in queries.items():
            rows = conn.execute(stmt.limit(limit)).mappings().all()
            out[name] = [{k: _jsonable(v) for k, v in r.items()} for r in rows]
    return out


def failed_jobs_evidence(engine: Engine, nodes: list[str], as_of: datetime,
                         window_days: float = 28, *, limit: int = 20) -> dict[str, list[dict]]:
    """Per node, its failed jobs of the window, newest first, at most `limit`: only its own
    failures, as features.py counts them (attributed to it, or a single-node job Slurm ended
    NODE_FAIL), a row per attributed cause. Every node in one query: one a node read the
    window's jobs again each time (55 ms a node at 1M jobs on PostgreSQL: 2.5 s for 45
    candidates). Rows of one end time come newest job first, then in attribution order."""
    if not nodes:
        return {}
    lo, hi = window_bounds(as_of, window_days)
    j, jn, a = jobs, job_nodes, attributions
    rank = func.row_number().over(
        partition_by=jn.c.node, order_by=(j.c.end.desc(), j.c.id.desc(), a.c.id))
    ranked = (
        select(jn.c.node, j.c.job_id, j.c.state, j.c.start, j.c.end, j.c.nnodes, a.c.cause,
               a.c.code, rank.label("rank"))
        .select_from(
            j.join(jn, jn.c.job_pk == j.c.id).outerjoin(
                a, and_(a.c.job_pk == j.c.id, a.c.node == jn.c.node)
            )
        )
        .where(
            jn.c.node.in_(nodes),
            j.c.end >= lo,
            j.c.end < hi,
            j.c.state.in_(FAILED_STATES),
            or_(a.c.kind.in_(ATTRIBUTED_KINDS), and_(j.c.nnodes == 1,
                                                            j.c.state.in_(HOST_FAIL_STATES))),
        )
        .subquery()
    )
    columns = ("job_id", "state", "start", "end", "nnodes", "cause", "code")
    out: dict[str, list[dict]] = {}
    with engine.connect() as conn:
        rows = conn.execute(
            select(ranked.c.node, *(ranked.c[c] for c in columns))
            .where(ranked.c.rank <= limit)
            .order_by(ranked.c.node, ranked.c.rank)
        ).all()
    for node, *values in rows:
        out.setdefault(node, []).append(
            {k: _jsonable(v) for k, v in zip(columns, values, strict=True)})
    return out


def _jsonable(v: Any) -> Any:
    return v.isoformat(sep=" ") if isinstance(v, datetime) else v
