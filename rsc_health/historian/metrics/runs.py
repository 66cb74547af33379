"""Measured ETTR per job run, next to the expected ETTR for the same run (paper Fig. 9).

A job run is the chain of instances of one Job ID across requeues, plus resubmissions linked by
a key (`link_by`): "job_id" (requeues only), "name_user" (same job name and user), or "tag"
(the first group of `tag_regex` in the job name -- the jobs table keeps no Comment column).
A submission joins the previous run with the same key when it became eligible no later than
`gap_s` after that run's last end.

Measured ETTR = productive runtime / wallclock from first eligibility to final end. As in the
paper, every instance that did not end COMPLETED counts as an interruption (so the measured
value is an underestimate), and productive runtime is the scheduled time less the paper's
unproductive terms (Appendix A, E[U]): u0 for every instance (the first start and each restart),
half a checkpoint interval per interruption, and w_cp per checkpoint interval of runtime.
The checkpoint interval is Daly-Young for the run's node count and the measured r_f unless set.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from sqlalchemy import Engine, func, select

from rsc_health.historian.metrics._sql import ALL_TIME, SECONDS_PER_DAY, Window, runtime_s
from rsc_health.historian.metrics.ettr import expected_ettr, minutes
from rsc_health.historian.schema import jobs

LINK_MODES = ("job_id", "name_user", "tag")


@dataclass(frozen=True)
class RunOptions:
    link_by: str = "name_user"
    tag_regex: str = r"run=(\S+)"
    gap_s: float = 6 * 3600.0
    u0: float = minutes(5)  # days
    w_cp: float = minutes(5)  # days
    dt_cp: float | None = None  # days; None -> Daly-Young
    min_run_hours: float = 48.0
    min_gpus: int = 1

    def __post_init__(self):
        if self.link_by not in LINK_MODES:
            raise ValueError(
                f"link_by must be one of {', '.join(LINK_MODES)}, not {self.link_by!r}"
            )


def _instances(engine: Engine, window: Window, min_gpus: int) -> pd.DataFrame:
    elig = func.coalesce(jobs.c.eligible, jobs.c.submit)
    q = select(
        jobs.c.job_id,
        jobs.c.name,
        jobs.c.user,
        jobs.c.state,
        elig,
        jobs.c.start,
        jobs.c.end,
        jobs.c.nnodes,
        jobs.c.gpus,
        runtime_s(),
    ).where(jobs.c.start.is_not(None), jobs.c.gpus >= min_gpus, *window.clauses())
    cols = [
        "job_id",
        "name",
        "user",
        "state",
        "eligible",
        "start",
        "end",
        "nnodes",
        "gpus",
        "runtime_s",
    ]
    with engine.connect() as conn:
        df = pd.DataFrame(conn.execute(q).all(), columns=cols)
    for c in ("eligible", "start", "end"):
        df[c] = pd.to_datetime(df[c])
    df["runtime_s"] = df["runtime_s"].astype(float)
    return df


def _link_key(df: pd.DataFrame, opts: RunOptions) -> pd.Series:
    if opts.link_by == "job_id":
        return df["job_id"]
    if opts.link_by == "name_user":
        return df["name"] + "\0" + df["user"]
    tag = df["name"].str.extract(opts.tag_regex, expand=False)
    return ("tag\0" + tag).fillna("job\0" + df["job_id"])


def assign_runs(df: pd.DataFrame, opts: RunOptions) -> pd.Series:
    """Run number for every instance row (vectorised: group, sort, cummax, cumsum)."""
    df = df.assign(key=_link_key(df, opts))
    sub = df.groupby("job_id").agg(
        key=("key", "first"), first=("eligible", "min"), last=("end", "max")
    )
    sub = sub.sort_values(["key", "first"])
    prev_end = sub.groupby("key")["last"].transform(lambda s: s.cummax().shift())
    gap = (sub["first"] - prev_end).dt.total_seconds()
    new = (sub["key"] != sub["key"].shift()) | ~(gap <= opts.gap_s)
    sub["run"] = new.cumsum()
    return df["job_id"].map(sub["run"])


def job_runs(
    engine: Engine, r_f: float, window: Window = ALL_TIME, opts: RunOptions = RunOptions()
) -> pd.DataFrame:
    """One row per job run of at least `min_run_hours` runtime, longest first."""
    inst = _instances(engine, window, opts.min_gpus)
    cols = [
        "run",
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
    if inst.empty:
        return pd.DataFrame(columns=cols)
    inst["run"] = assign_runs(inst, opts)
    inst["interrupted"] = inst["state"] != "COMPLETED"
    g = inst.groupby("run")
    runs = g.agg(
        job_ids=("job_id", "nunique"),
        name=("name", "first"),
        user=("user", "first"),
        gpus=("gpus", "max"),
        nodes=("nnodes", "max"),
        instances=("job_id", "size"),
        interruptions=("interrupted", "sum"),
        runtime_s=("runtime_s", "sum"),
        first=("eligible", "min"),
        last=("end", "max"),
    )
    runs = runs[runs["runtime_s"] >= opts.min_run_hours * 3600.0]
    if runs.empty:
        return pd.DataFrame(columns=cols)
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
    runs = runs.sort_values("runtime_hours", ascending=False).reset_index()
    return runs[cols]
