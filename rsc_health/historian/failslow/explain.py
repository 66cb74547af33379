"""Why a job's nodes were, or were not, flagged: the detector's judgement of one job, node by
node and metric by metric, for an operator (`healthctl suspects job JOB`).

The detector's frame (`core.judged`) already holds what an operator asks at 3 a.m. about a slow
job that flagged no one: which nodes were judged at all (a peer group under `min_nodes` is
not), how many sweeps each was off its peers, how many of those were the job's own move (a
checkpoint, a phase, a leaf switch: `job_wide`, flagging no one), and the longest run of
outlying sweeps against the `persist_sweeps` it needed. This module judges one job's span the
way a pass judges its window and tells it apart per (node, metric).

What it does not re-judge: the fleet's own rate (`fleet_chance`), read from every job of a
pass's window (here only the job's nodes are read), so a run it made wait a sweep reads as
found here a sweep sooner; the suspects table says what was recorded (`recorded`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from typing import Any

import numpy as np
import pandas as pd

from rsc_health.historian.failslow.core import (
    STEP_COLUMNS,
    Rules,
    _group_key,
    delivered,
    find_runs,
    judged,
    shared_samples,
    step_observations,
    telemetry_observations,
)

# The longest stretch of a job judged at once (hours, ending at its end or now): a week-long
# job's whole span would read every sample of its nodes for the week.
MAX_HOURS = 24.0


@dataclass
class NodeMetric:
    """One node's judgement in one metric over the job's span."""

    node: str
    metric: str
    group: str  # "GPU model|stage" ('' parts: unknown / none named)
    peers: int  # nodes in its peer group (the most in any slot)
    sampled: int  # slots with a value
    judged: int  # slots judged against peers (0: the group was under min_nodes)
    outlying: int  # slots past its line, on its own
    job_wide: int  # slots past its line while the job moved with it (flag no one)
    longest: int  # longest run of consecutive outlying slots
    needed: int  # outlying slots in a row a suspect needs (the metric's persist_sweeps)
    worst: float | None  # largest deviation in an outlying slot (the line is k)
    worst_value: float | None
    worst_median: float | None
    worst_at: datetime | None
    suspect: bool  # the judgement found a run (re-judged here; see `recorded`)
    why: str  # one line: the verdict's reason
    # slots with a value not judged yet: not every node of the job has delivered them
    # (core.delivered, [failslow] complete_after_s)
    waiting: int = 0


@dataclass
class JobExplanation:
    job_id: str
    since: datetime | None
    until: datetime | None
    nodes: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    rows: list[NodeMetric] = field(default_factory=list)

    def as_dict(self) -> dict:
        d = asdict(self)
        for k in ("since", "until"):
            d[k] = d[k].isoformat() if d[k] is not None else None
        for r in d["rows"]:
            r["worst_at"] = r["worst_at"].isoformat() if r["worst_at"] is not None else None
        return d


def _needed(rules: Rules, metric: str) -> int:
    rule = rules.metrics.get(metric)
    return int(rule.persist) if rule is not None and rule.persist else rules.persist_sweeps


def _longest(slots: np.ndarray) -> int:
    """The longest run of consecutive slot numbers."""
    if not len(slots):
        return 0
    s = np.sort(np.unique(slots))
    breaks = np.flatnonzero(np.diff(s) != 1)
    edges = np.concatenate(([0], breaks + 1, [len(s)]))
    return int(np.max(np.diff(edges)))


def _finite(x: Any) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if np.isfinite(v) else None


def explain_frame(job_id: str, samples: pd.DataFrame, members: pd.DataFrame,
                  steps: pd.DataFrame | None, rules: Rules, now: Any = None) -> JobExplanation:
    """The job's judgement from frames (no I/O): `members` every multi-node job of the span
    (a node another judged job shared is judged in neither), `samples` and `steps` at least
    the job's nodes'; `now` the pass's time (core.delivered: slots not every node of the job
    has delivered yet are not judged)."""
    job_id = str(job_id)
    out = JobExplanation(job_id, None, None)
    members = members.assign(job_id=members["job_id"].astype(str))
    mine = members[members["job_id"] == job_id]
    if mine.empty:
        out.notes.append(f"job {job_id}: no run of two or more nodes in the span read "
                         "(one-node jobs have no peers to be judged against)")
        return out
    out.nodes = sorted(set(mine["node"].astype(str)))
    obs = pd.concat([telemetry_observations(samples, members, rules),
                     step_observations(steps, members, rules)], ignore_index=True)
    obs = obs[obs["job_id"].astype(str) == job_id]
    if obs.empty:
        out.notes.append("no telemetry sample and no step time of its nodes inside its run: "
                         "nothing to judge (are the nodes' spools delivered? "
                         "`healthctl freshness`)")
        return out
    frame = judged(samples, members, steps, rules, now=now)
    frame = frame[frame["job_id"].astype(str) == job_id]
    runs = find_runs(frame, rules) if len(frame) else pd.DataFrame()
    found = set() if runs.empty else set(zip(runs["node"].astype(str),
                                             runs["metric"].astype(str), strict=True))
    groups = _group_key(mine, rules.min_nodes)
    sizes = groups.value_counts()
    if len(sizes) > 1:
        out.notes.append("peer groups (GPU model|stage): " + ", ".join(
            f"{g or '?|'} {n} nodes" for g, n in sizes.items()))
    per_slot = obs.groupby(["group", "metric", "slot"])["node"].transform("nunique")
    obs = obs.assign(peers=per_slot)
    # the slots a pass would hold back, waiting for the job's nodes to flush them
    whole = delivered(obs.astype({"slot": "int64"}), samples, members, rules, now)
    ready = set(zip(whole["node"].astype(str), whole["metric"].astype(str),
                    whole["slot"].astype("int64"), strict=True))
    obs = obs.assign(waiting=[(str(n), str(m), int(t)) not in ready for n, m, t in zip(
        obs["node"], obs["metric"], obs["slot"], strict=True)])
    by = dict(iter(frame.groupby(["node", "metric"], sort=False)))  # one pass, not per row
    empty = frame.iloc[:0]
    for (node, metric), o in obs.groupby(["node", "metric"], sort=True):
        j = by.get((node, metric), empty)
        bad = j[j["outlier"].astype(bool)]
        needed = _needed(rules, str(metric))
        worst = bad.loc[bad["deviation"].idxmax()] if len(bad) else None
        peers = int(o["peers"].max())
        row = NodeMetric(
            node=str(node), metric=str(metric), group=str(o["group"].iloc[0]), peers=peers,
            sampled=int(o["slot"].nunique()), judged=int(j["slot"].nunique()),
            outlying=int(len(bad)), job_wide=int(j["job_wide"].astype(bool).sum()),
            longest=_longest(bad["slot"].to_numpy()), needed=needed,
            worst=None if worst is None else _finite(worst["deviation"]),
            worst_value=None if worst is None else _finite(worst["value"]),
            worst_median=None if worst is None else _finite(worst["median"]),
            worst_at=None if worst is None else pd.Timestamp(worst["time"]).to_pydatetime(),
            suspect=(str(node), str(metric)) in found, why="",
            waiting=int(o.loc[o["waiting"], "slot"].nunique()))
        row.why = _why(row, rules)
        out.rows.append(row)
    return out


def _why(r: NodeMetric, rules: Rules) -> str:
    if r.suspect:
        return (f"suspect: {r.longest} outlying sweeps in a row (needs {r.needed}), "
                f"worst {r.worst:.3g} lines past (the line is {rules.k:g})"
                if r.worst is not None else "suspect")
    if r.judged == 0 and r.waiting:
        return (f"not judged yet: its {r.waiting} sweep(s) wait for every node of the job to "
                f"deliver them (a node's flush; [failslow] complete_after_s "
                f"{rules.complete_s} s at most)")
    if r.judged == 0:
        return (f"not judged: its peer group had {r.peers} node(s) with a value, under "
                f"[failslow] min_nodes {rules.min_nodes}")
    if r.outlying == 0 and r.job_wide == 0:
        return "in line with its peers in every judged sweep"
    if r.outlying == 0:
        return (f"off its peers only while the job moved with it ({r.job_wide} sweeps: a "
                "checkpoint, a phase or the fabric, not the node)")
    if r.longest < r.needed:
        return (f"off its peers in {r.outlying} sweeps, at most {r.longest} in a row "
                f"(needs {r.needed})" + (f"; {r.job_wide} more with its job" if r.job_wide
                                          else ""))
    return (f"{r.longest} outlying sweeps in a row but no run kept: a changing GPU/port/rank, "
            "a role from its start, or a corroborating metric missing (docs/failslow.md, How)")


def explain_job(engine, job_id: str, now: datetime, cfg: Any,
                hours: float = MAX_HOURS) -> JobExplanation:
    """One job's judgement over its run (its last `hours` at most, ending at its end or now),
    from the historian. HistorianUnavailable (one line) when it cannot be read."""
    from sqlalchemy.exc import InterfaceError, OperationalError, ProgrammingError

    from rsc_health.historian.failslow.load import _unavailable

    try:
        return _explain_job(engine, job_id, now, cfg, hours)
    except (OperationalError, InterfaceError, ProgrammingError) as exc:
        raise _unavailable(engine, exc, f"job {str(job_id)[:64]}'s judgement") from exc


def _explain_job(engine, job_id: str, now: datetime, cfg: Any, hours: float
                 ) -> JobExplanation:
    from sqlalchemy import func, select

    from rsc_health.historian import schema
    from rsc_health.historian.failslow.load import (
        _gpu_models,
        co_tenants,
        membership,
        one_cluster_per_job,
        with_stages,
    )
    from rsc_health.historian.telemetry import load_samples

    rules = Rules.from_config(cfg)
    job_id = str(job_id).strip()
    # ID@CLUSTER: a job id two clusters' jobs share, as the detector names each of them
    plain, _, cluster = job_id.partition("@")
    j = schema.jobs
    with engine.connect() as conn:
        q = select(j.c.start, j.c.end, j.c.cluster).where(j.c.job_id == plain,
                                                          j.c.start.is_not(None))
        if cluster:
            q = q.where(j.c.cluster == cluster)
        spans = conn.execute(q).all()
        gpus = _gpu_models(conn)
        untold = not spans and not cluster
        if untold:  # sacct has not told of it (yet): its nodes' prologs may have
            s = schema.job_starts
            first = conn.execute(select(func.min(s.c.time)).where(s.c.job_id == plain)).scalar()
            spans = [(first, None, "")] if first is not None else []
    if not spans:
        return JobExplanation(job_id, None, None,
                              notes=[f"job {job_id}: not in the historian with a start time"])
    clusters = sorted({str(c or "") for _, _, c in spans})
    if not cluster and len(clusters) > 1:
        return JobExplanation(job_id, None, None, notes=[
            f"job {job_id} is held by the jobs of {len(clusters)} clusters ("
            + ", ".join(c or "''" for c in clusters) + f"): ask for one, {job_id}@CLUSTER"])
    until = min(max((e if e is not None else now) for _, e, _ in spans), now)
    since = max(min(s for s, _, _ in spans), until - timedelta(hours=max(0.25, float(hours))))
    st = schema.step_times
    with engine.connect() as conn:
        step_rows = pd.DataFrame(conn.execute(
            select(st.c.job_id, st.c.rank, st.c.node, st.c.stage, st.c.step, st.c.seconds,
                   st.c.time).where(st.c.job_id == plain, st.c.time >= since,
                                    st.c.time <= until)).all(), columns=list(STEP_COLUMNS))
    # as a pass reads them: a job id two clusters hold in the span is ID@CLUSTER each
    members, step_rows = one_cluster_per_job(membership(engine, since, until, gpus), step_rows)
    members = members.assign(job_id=members["job_id"].astype(str))
    if "cluster" in members:
        members = members.drop(columns="cluster")
    ids = set(members["job_id"])
    target = next((t for t in (job_id, f"{plain}@{clusters[0]}", plain) if t in ids), job_id)
    nodes = sorted(set(members.loc[members["job_id"] == target, "node"].astype(str)))
    members = with_stages(members, step_rows)
    samples = load_samples(engine, since, until, nodes) if nodes else None
    # as a pass reads them: a one-node job beside the job on a node shares its samples
    samples = shared_samples(samples, co_tenants(engine, since, until))
    out = explain_frame(target, samples if samples is not None else pd.DataFrame(
        columns=["node", "time", "metric", "value", "component"]), members,
        step_rows if len(step_rows) else None, rules, now)
    out.since, out.until = since, until
    if len(spans) > 1:
        out.notes.insert(0, f"{len(spans)} runs of job {job_id} (a requeue) judged together")
    if untold:
        out.notes.insert(0, f"job {job_id}: not yet told by `ingest sacct`; its nodes are those "
                            "whose prologs told, once all of its nodelist had (job_starts)")
    return out
