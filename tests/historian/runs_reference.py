"""Frozen reference: ETTR run linking exactly as rsc_health.historian.metrics.runs computed it
before the speed work (commit b02618e), kept as the oracle for test_runs_linking.py. Do not
optimise this copy: it exists to prove that the fast implementation returns the same runs.
It reuses RunOptions from the real module so both read the same options.

One deliberate change since (issue 13 point 6): a submission that started before the latest end
among its key's earlier submissions (it ran beside one of them) starts a run of its own, so no
run adds up concurrent jobs and measured ETTR stays <= 1. Written here in the reference's own
plain terms (one more CASE branch, one more pandas mask), not copied from the fast code.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from sqlalchemy import Engine, case, func, select

from rsc_health.historian.metrics._sql import (
    ALL_TIME,
    SECONDS_PER_DAY,
    Window,
    runtime_s,
    seconds_between,
)
from rsc_health.historian.metrics.ettr import expected_ettr
from rsc_health.historian.metrics.runs import RunOptions
from rsc_health.historian.schema import jobs


def _submissions(window: Window, min_gpus: int):
    """One row per Job ID: its requeue chain folded up (first eligible, last end, ...)."""
    elig = func.coalesce(jobs.c.eligible, jobs.c.submit)
    return (
        select(
            jobs.c.job_id,
            func.min(jobs.c.name).label("name"),
            func.min(jobs.c.user).label("user"),
            func.min(elig).label("first"),
            func.max(jobs.c.end).label("last"),
            func.min(jobs.c.start).label("first_start"),
            func.count().label("instances"),
            func.sum(case((jobs.c.state != "COMPLETED", 1), else_=0)).label("interruptions"),
            func.sum(runtime_s()).label("runtime_s"),
            func.max(jobs.c.nnodes).label("nodes"),
            func.max(jobs.c.gpus).label("gpus"),
        )
        .where(jobs.c.start.is_not(None), jobs.c.gpus >= min_gpus, *window.clauses())
        .group_by(jobs.c.job_id)
        .subquery("sub")
    )


_RUN_COLS = [
    "job_ids",
    "name",
    "user",
    "gpus",
    "nodes",
    "instances",
    "interruptions",
    "runtime_s",
    "first",
    "last",
]


def _runs_in_sql(engine: Engine, window: Window, opts: RunOptions) -> pd.DataFrame:
    """Link submissions into runs with window functions, aggregate, keep the long ones.

    prev_end = latest end among the key's earlier submissions; a submission starts a new run
    when there is none or it became eligible more than gap_s later; the running sum of those
    starts numbers the runs. Only runs of at least min_run_hours leave the database.
    """
    sub = _submissions(window, opts.min_gpus)
    key = [sub.c.job_id] if opts.link_by == "job_id" else [sub.c.name, sub.c.user]
    order = [sub.c.first, sub.c.job_id]
    prev_end = func.max(sub.c.last).over(partition_by=key, order_by=order, rows=(None, -1))
    w1 = select(sub, prev_end.label("prev_end")).subquery("w1")
    starts_run = case(
        (w1.c.prev_end.is_(None), 1),
        (seconds_between(w1.c.prev_end, w1.c.first) > opts.gap_s, 1),
        (seconds_between(w1.c.prev_end, w1.c.first_start) < 0, 1),  # ran beside an earlier one
        else_=0,
    )
    k1 = [w1.c.job_id] if opts.link_by == "job_id" else [w1.c.name, w1.c.user]
    run_no = func.sum(starts_run).over(
        partition_by=k1, order_by=[w1.c.first, w1.c.job_id], rows=(None, 0)
    )
    w2 = select(w1, run_no.label("run_no")).subquery("w2")
    k2 = [w2.c.job_id] if opts.link_by == "job_id" else [w2.c.name, w2.c.user]
    total = func.sum(w2.c.runtime_s)
    q = (
        select(
            func.count().label("job_ids"),
            func.min(w2.c.name),
            func.min(w2.c.user),
            func.max(w2.c.gpus),
            func.max(w2.c.nodes),
            func.sum(w2.c.instances),
            func.sum(w2.c.interruptions),
            total,
            func.min(w2.c.first),
            func.max(w2.c.last),
        )
        .group_by(*k2, w2.c.run_no)
        .having(total >= opts.min_run_hours * 3600.0)
    )
    with engine.connect() as conn:
        return pd.DataFrame(conn.execute(q).all(), columns=_RUN_COLS)


def _runs_by_tag(engine: Engine, window: Window, opts: RunOptions) -> pd.DataFrame:
    """The same linking in pandas, for regex tags (regular expressions are not portable SQL)."""
    sub = _submissions(window, opts.min_gpus)
    with engine.connect() as conn:
        df = pd.DataFrame(conn.execute(select(sub)).all(), columns=list(sub.c.keys()))
    if df.empty:
        return pd.DataFrame(columns=_RUN_COLS)
    for c in ("first", "last", "first_start"):
        df[c] = pd.to_datetime(df[c])
    tag = df["name"].str.extract(opts.tag_regex, expand=False)
    df["key"] = ("tag\0" + tag).fillna("job\0" + df["job_id"])
    df = df.sort_values(["key", "first", "job_id"])
    # Latest end so far among the key's earlier submissions (built-in group ops, no lambdas).
    prev_end = df.groupby("key")["last"].cummax().groupby(df["key"]).shift()
    gap = (df["first"] - prev_end).dt.total_seconds()
    overlaps = df["first_start"] < prev_end
    df["run"] = ((df["key"] != df["key"].shift()) | ~(gap <= opts.gap_s) | overlaps).cumsum()
    runs = df.groupby("run").agg(
        job_ids=("job_id", "size"),
        name=("name", "first"),
        user=("user", "first"),
        gpus=("gpus", "max"),
        nodes=("nodes", "max"),
        instances=("instances", "sum"),
        interruptions=("interruptions", "sum"),
        runtime_s=("runtime_s", "sum"),
        first=("first", "min"),
        last=("last", "max"),
    )
    return runs[runs["runtime_s"] >= opts.min_run_hours * 3600.0][_RUN_COLS]


def job_runs(
    engine: Engine, r_f: float, window: Window = ALL_TIME, opts: RunOptions | None = None
) -> pd.DataFrame:
    """One row per job run of at least `min_run_hours` runtime, longest first."""
    opts = opts or RunOptions()
    cols = [
        "job_ids",
        "name",
        "user",
        "gpus",
        "nodes",
        "instances",
        "interruptions",
        "runtime_hours",
        "wallclock_hours",
        "queue_hours",
        "productive_hours",
        "checkpoint_interval_min",
        "measured_ettr",
        "expected_ettr",
    ]
    fetch = _runs_by_tag if opts.link_by == "tag" else _runs_in_sql
    runs = fetch(engine, window, opts)
    if runs.empty:
        return pd.DataFrame(columns=cols)
    for c in ("first", "last"):
        runs[c] = pd.to_datetime(runs[c])
    runs["runtime_s"] = runs["runtime_s"].astype(float)
    day = SECONDS_PER_DAY
    runtime = runs["runtime_s"].to_numpy() / day
    wall = (runs["last"] - runs["first"]).dt.total_seconds().to_numpy() / day
    nodes = runs["nodes"].to_numpy(dtype=float)
    lam = nodes * r_f
    with np.errstate(divide="ignore"):
        dt = np.sqrt(2.0 * opts.w_cp / lam) if opts.dt_cp is None else np.full_like(lam, opts.dt_cp)
    ints = runs["interruptions"].to_numpy(dtype=float)
    inst_n = runs["instances"].to_numpy(dtype=float)
    ckpt_share = np.where(np.isinf(dt), 0.0, opts.w_cp / (dt + opts.w_cp))
    lost = opts.u0 * inst_n + ints * np.where(np.isinf(dt), 0.0, dt / 2.0) + runtime * ckpt_share
    productive = np.clip(runtime - lost, 0.0, None)
    queue = np.clip(wall - runtime, 0.0, None)
    runs["runtime_hours"] = runtime * 24
    runs["wallclock_hours"] = wall * 24
    runs["queue_hours"] = queue * 24
    runs["productive_hours"] = productive * 24
    runs["checkpoint_interval_min"] = dt * 1440
    runs["measured_ettr"] = np.where(wall > 0, productive / wall, np.nan)
    # Expected ETTR for the same N, productive runtime, r_f and this run's mean queue per instance.
    with np.errstate(divide="ignore", invalid="ignore"):
        runs["expected_ettr"] = expected_ettr(
            nodes,
            r_f,
            np.maximum(productive, 1e-9),
            u0=opts.u0,
            w_cp=opts.w_cp,
            dt_cp=None if opts.dt_cp is None else np.full_like(lam, opts.dt_cp),
            queue=queue / inst_n,
        )
    runs["interruptions"] = runs["interruptions"].astype(int)
    runs = runs.sort_values("runtime_hours", ascending=False).reset_index(drop=True)
    return runs[cols]
