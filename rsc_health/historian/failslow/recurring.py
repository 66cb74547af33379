"""Across jobs: a node off its peers in job after job, whatever job it runs (docs/failslow.md).

The detector (core.py) looks for an onset inside a job: a node at its own level from its
first sweep in a job (a link degraded before the job began, a GPU slow since its last boot)
is read as a role the job did not name, and is judged only when far past its peers (STRONG
lines, `levelled` metrics) or not at all (step times). A role belongs to a rank, not to a
node: the next job puts the node elsewhere. A fault follows the node.

So each finished job's telemetry rollups (each node's mean over the job) are judged once
more, a job at a time, with the same lines as the sweeps (each [failslow.metrics.NAME]'s
direction, min_delta and margins, the qualification judge's tolerance). A job in which more
than max_outlier_share of a group's nodes are outlying says nothing (the workload's roles,
the fabric). Then, per node and metric, against the fleet's own rate. In each job, the
chance q that the node is outlying by the role it was given is the larger of
- the share of the job's nodes that are outlying, and
- how often the other nodes that held its place in their jobs' node lists were outlying
  (ranks are laid out in hostlist order: the node whose name sorts last in its partition
  holds the last pipeline stage in most jobs it runs).
Under that chance alone, the number of the node's jobs it was outlying in is a sum of
independent draws, one per job, each q (Poisson-binomial). A node is a suspect when it was
outlying in at least recurring_min_jobs of its jobs, and in so many that the chance of as
many is at most recurring_alpha. (A Poisson tail with the same mean was tried: with jobs of 4
and 8 nodes, q of 1/4 and 1/8, it is wider by orders of magnitude, and a node outlying in 7 of
its 7 jobs stayed under the line.)

Runs of one workload (the same user and job name) over the same set of nodes (a requeued job,
a training resubmitted onto the same nodes) are one placement: the same ranks on the same
nodes give the same roles, and would be counted again as if they were chance. Another
workload on the same nodes lays its own roles out: a placement of its own. A node's jobs
before its last ended suspect episode are not counted (`counted_from`): a qualification that
cleared it saw what they showed.

Pure: `recurring_frame(rollups, rules, ...)` -> [SuspectEvidence]; `load.detect` reads the
rollups.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import numpy as np
import pandas as pd

from rsc_health.historian.failslow.core import Rules, _deviation, lines, peers
from rsc_health.historian.failslow.evidence import STEPS, TELEMETRY, SuspectEvidence

# One row per finished multi-node job and node and metric: the node's mean over the job;
# `workload` names what ran (the user and the job name): a frame without it is judged as if
# every job on the same nodes were the same workload (the wider tail).
ROLLUP_COLUMNS = ("job_id", "node", "group", "metric", "value", "start", "end", "workload")
# The detail's marker: evidence judged across jobs, not inside one.
ACROSS_JOBS = "across jobs"


@dataclass(frozen=True)
class Across:
    """[failslow] recurring_days, recurring_alpha, recurring_min_jobs, recurring_every_min
    (default_config.toml). `every`: the time between two judgements, at most half of
    [suspects] expire_after_h (an episode found across jobs is renewed before it expires)."""

    days: float
    alpha: float
    min_jobs: int
    every: timedelta = timedelta(0)

    @classmethod
    def from_config(cls, cfg: Any) -> Across:
        days = float(cfg.get("failslow.recurring_days"))
        alpha = float(cfg.get("failslow.recurring_alpha"))
        min_jobs = int(cfg.get("failslow.recurring_min_jobs"))
        every_min = float(cfg.get("failslow.recurring_every_min"))
        expire_h = float(cfg.get("suspects.expire_after_h"))
        if not 0.0 < alpha < 1.0:
            raise ValueError(f"[failslow] recurring_alpha {alpha!r}: must be a chance between "
                             f"0 and 1 (1e-5: the default)")
        if not (days >= 0 and np.isfinite(days)):
            raise ValueError(f"[failslow] recurring_days {days!r}: must be 0 (off) or more")
        if not (every_min >= 0 and np.isfinite(every_min)):
            raise ValueError(f"[failslow] recurring_every_min {every_min!r}: must be 0 (every "
                             f"pass) or more")
        cap = expire_h * 30.0 if expire_h > 0 and np.isfinite(expire_h) else every_min
        return cls(days=days, alpha=alpha, min_jobs=max(1, min_jobs),
                   every=timedelta(minutes=min(every_min, cap)))

    def due(self, last: datetime | None, now: datetime) -> bool:
        """Whether a pass at `now` judges across jobs, the last judgement made at `last` (None:
        never, or not readable). A `last` after `now` (the clock stepped back, a garbled
        record) is no reason to wait: judged now."""
        return self.days > 0 and (last is None or last > now or now - last >= self.every)


def _with_nodeset(rollups: pd.DataFrame) -> pd.DataFrame:
    """The rows with `nodeset`: a key of the job's workload and (group's) set of nodes, the
    same for every run of one workload over the same nodes (the set: two 40-bit sums of
    per-node hashes and the count, a collision between two of a fleet's week of jobs about 1
    in 10^18), and `place` (`_positions`)."""
    work = (rollups["workload"].fillna("").astype(str) if "workload" in rollups
            else pd.Series("", index=rollups.index))
    r = rollups.assign(job_id=rollups["job_id"].astype(str), node=rollups["node"].astype(str),
                       workload=work)
    one = r.drop_duplicates(["job_id", "group", "node"])
    mask = np.uint64((1 << 40) - 1)
    h1 = (pd.util.hash_pandas_object(one["node"], index=False).to_numpy() & mask).astype("int64")
    h2 = (pd.util.hash_pandas_object(one["node"], index=False, hash_key="rsc-health-nodes"
                                     ).to_numpy() & mask).astype("int64")
    sums = (pd.DataFrame({"job_id": one["job_id"].to_numpy(), "group": one["group"].to_numpy(),
                          "a": h1, "b": h2})
            .groupby(["job_id", "group"], sort=False).agg(a=("a", "sum"), b=("b", "sum"),
                                                           c=("a", "size")))
    key = (sums["a"].astype(str) + ":" + sums["b"].astype(str) + ":" + sums["c"].astype(str))
    r = r.join(key.rename("nodeset"), on=["job_id", "group"])
    r["nodeset"] = r["nodeset"] + "\n" + r["workload"]
    return r.join(_positions(one), on=["job_id", "node"])


def _natural(name: str) -> str:
    """Slurm's hostlist order: digit runs compared as numbers (gpu9 before gpu10)."""
    return re.sub(r"\d+", lambda m: m.group(0).rjust(12, "0"), name)


def _positions(one: pd.DataFrame) -> pd.Series:
    """Each (job, node)'s place in its job's node list as ranks are laid out (block: the
    hostlist's order): "first" (rank 0's node), "last", or the eighth of the list it is in.
    A role is a place's: the last pipeline stage, rank 0's extra work."""
    nodes = one.drop_duplicates(["job_id", "node"])[["job_id", "node"]]
    order = nodes.assign(k=nodes["node"].map({n: _natural(n) for n in nodes["node"].unique()}))
    i = order.groupby("job_id")["k"].rank(method="first").to_numpy(dtype=int) - 1
    n = order.groupby("job_id")["k"].transform("size").to_numpy(dtype=int)
    place = np.where(i == 0, "first", np.where(i == n - 1, "last",
                                              np.char.add("part", (8 * i // n).astype(str))))
    return pd.Series(place, index=pd.MultiIndex.from_frame(order[["job_id", "node"]]),
                     name="place")


def placements(rollups: pd.DataFrame) -> pd.DataFrame:
    """Runs of one workload over the same (group, node set) as one placement: each node's
    median value over them, the first start and the last end (the rows' `nodeset` when they
    have one)."""
    r = rollups if "nodeset" in rollups else _with_nodeset(rollups)
    return (r.groupby(["nodeset", "group", "metric", "node"], sort=False)
            .agg(value=("value", "median"), start=("start", "min"), end=("end", "max"),
                 place=("place", "first"))
            .reset_index())


def judge_placements(p: pd.DataFrame, rules: Rules) -> pd.DataFrame:
    """Each node's mean against its placement's other nodes (the sweeps' lines); outlier,
    deviation, the placement's median and line; placements past max_outlier_share dropped."""
    p = p[p["metric"].isin(list(rules.metrics))]
    p = p[np.isfinite(p["value"].to_numpy(dtype=float))]
    key = ["nodeset", "group", "metric"]
    p, rel = peers(p, key, rules.min_nodes)
    if p.empty:
        return p.assign(line=[], bad=[], outlier=[], deviation=[], q=[])
    _tol, line, bad, outlier = lines(p, rel, rules)
    p = p.assign(line=line, bad=bad, outlier=outlier, deviation=_deviation(bad, line, rules.k))
    out = p.groupby(key, sort=False)["outlier"].transform("sum")
    allowed = np.maximum(1, np.floor(rules.max_outlier_share * p["n"]))
    p = p[out <= allowed]
    return p.assign(q=np.maximum(out[p.index] / p["n"], _place_rate(p)))


def _place_rate(p: pd.DataFrame) -> np.ndarray:
    """For each row: how often the other nodes were outlying in the same place of their jobs'
    node lists (its metric; `_positions`), this node's own rows left out. A place whose rank
    has a role (the last stage, rank 0) is outlying whoever holds it: a node that holds it in
    job after job is that often outlying by chance (its name sorts last in its partition)."""
    o = p["outlier"].astype(float)
    key = [p["metric"], p["place"]]
    total = o.groupby(key, sort=False).transform("sum") - o.groupby(
        [p["node"], *key], sort=False).transform("sum")
    seen = o.groupby(key, sort=False).transform("size") - o.groupby(
        [p["node"], *key], sort=False).transform("size")
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(seen > 0, total / seen.where(seen > 0, 1), 0.0)


MAX_TAIL = 64  # counts past this are judged as this many (a wider tail: no suspect more)


def chance_at_least(rows: pd.DataFrame, per: pd.DataFrame) -> np.ndarray:
    """For each (node, metric) of `per` (x: outlying placements): P(X >= x) where X is the sum
    of one draw per row of `rows` of that (node, metric), each 1 with probability q (exact,
    by dynamic programming over the placements, all pairs at once; x past MAX_TAIL counts as
    MAX_TAIL)."""
    pair = pd.Series(range(len(per)), index=per.index)
    at = pair.reindex(pd.MultiIndex.from_frame(rows[["node", "metric"]])).to_numpy()
    q = pd.Series(rows["q"].to_numpy(dtype=float)).groupby(at).agg(list).reindex(
        range(len(per)), fill_value=[])
    width = max((len(v) for v in q), default=0)
    mat = np.zeros((len(per), width))
    for i, v in enumerate(q):
        mat[i, :len(v)] = v
    k = int(min(MAX_TAIL, per["x"].max()))
    dist = np.zeros((len(per), k + 1))
    dist[:, 0] = 1.0
    for t in range(width):
        p = mat[:, t:t + 1]
        nxt = dist * (1 - p)
        nxt[:, 1:] += dist[:, :-1] * p
        nxt[:, k] += dist[:, k] * p[:, 0]  # k is "k or more"
        dist = nxt
    x = np.minimum(per["x"].to_numpy(dtype=int), k)
    cum = np.cumsum(dist[:, ::-1], axis=1)[:, ::-1]  # cum[:, i] = P(X >= i)
    return cum[np.arange(len(per)), x]


def recurring_frame(rollups: pd.DataFrame, rules: Rules, *, alpha: float, min_jobs: int,
                    counted_from: Mapping[str, datetime] | None = None,
                    now: datetime | None = None) -> list[SuspectEvidence]:
    """Suspects from finished jobs' rollups (ROLLUP_COLUMNS): nodes outlying in at least
    min_jobs placements, with a chance of that under their jobs' own rates of at most alpha.
    counted_from: per node, the time before which its jobs are not counted. now: when the
    judgement is made, the evidence's `last` (the judgement holds now, while the window holds
    those jobs: a node found on a week of history, its last slow job ended days ago, is a
    suspect until qualification says otherwise, not an episode that expires as it opens);
    without it, the last outlying job's end."""
    if rollups.empty:
        return []
    r = _with_nodeset(rollups)
    j = judge_placements(placements(r), rules)
    if counted_from and len(j):
        # after judging: the node's earlier jobs still hold their other nodes' peers
        cut = pd.to_datetime(j["node"].map(dict(counted_from)))
        j = j[cut.isna().to_numpy() | (pd.to_datetime(j["start"]) >= cut).to_numpy()]
    if j.empty:
        return []
    per = j.groupby(["node", "metric"], sort=False).agg(x=("outlier", "sum"), mean=("q", "sum"),
                                                         judged=("q", "size"))
    per = per[per["x"] >= max(1, min_jobs)]
    if per.empty:
        return []
    cand = j.join(per, on=["node", "metric"], how="inner")
    per = per.assign(chance=chance_at_least(cand, per))
    per = per[per["chance"] <= alpha]
    jobs_by = r.groupby("nodeset")["job_id"].unique()
    hits = j[j["outlier"].to_numpy()].join(per[[]], on=["node", "metric"], how="inner")
    out = []
    for (node, metric), hit in hits.groupby(["node", "metric"], sort=True):
        row = per.loc[(node, metric)]
        jobs = tuple(sorted({str(x) for ns in hit["nodeset"] for x in jobs_by[ns]}))
        value, peers = float(hit["value"].median()), float(hit["median"].median())
        share = f"{value / peers:.3g}x" if peers else f"{value:.3g} over 0"
        out.append(SuspectEvidence(
            node=str(node), metric=str(metric), value=value, peer_median=peers,
            deviation=float(hit["deviation"].median()),
            since=pd.Timestamp(hit["start"].min()).to_pydatetime(),
            last=now or pd.Timestamp(hit["end"].max()).to_pydatetime(), job_ids=jobs,
            source=STEPS if metric == rules.steps_metric else TELEMETRY,
            detail=(f"{ACROSS_JOBS}: {metric} off its peers in {int(row['x'])} of its "
                    f"{int(row['judged'])} placements (jobs over one node set count once; "
                    f"{row['mean']:.2f} expected from its jobs' own rates, chance of as many "
                    f"{row['chance']:.1e}), at {share} its peers' median, the last ended "
                    f"{pd.Timestamp(hit['end'].max()):%Y-%m-%d %H:%M}; jobs "
                    f"{','.join(jobs[-8:])}")[:1000]))
    return out
