"""Failure rates: r_f per node-day, outcome breakdown (Fig. 3), rate by cause (Fig. 4), and the
30-day rolling rate by mode (Fig. 5). Aggregation runs in the database; pandas shapes the rest."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import pandas as pd
from sqlalchemy import Engine, and_, case, func, literal, or_, select

from rsc_health.historian.attribute import FAILED_STATES, HOST_FAIL_STATES
from rsc_health.historian.metrics._sql import (
    ALL_TIME,
    SECONDS_PER_DAY,
    Window,
    infra_failure,
    poisson_rate_ci,
    runtime_s,
)
from rsc_health.historian.schema import attributions, jobs

DEFAULT_LARGE_JOB_GPUS = 128


@dataclass(frozen=True)
class FailureRate:
    """Cluster failure rate r_f, in failures per node-day, with its confidence interval."""

    failures: int
    node_days: float
    jobs: int
    r_f: float
    ci_low: float
    ci_high: float
    confidence: float
    large_job_gpus: int

    def per_1000(self) -> dict[str, float]:
        return {k: getattr(self, k) * 1000 for k in ("r_f", "ci_low", "ci_high")}

    def to_dict(self) -> dict:
        return asdict(self)


def failure_rate(
    engine: Engine,
    window: Window = ALL_TIME,
    large_job_gpus: int = DEFAULT_LARGE_JOB_GPUS,
    confidence: float = 0.9,
) -> FailureRate:
    """NODE_FAIL + attributed FAILED among jobs with more than `large_job_gpus` GPUs, over the
    node-days (runtime days x allocated nodes) of those same jobs (paper section III)."""
    node_seconds = runtime_s() * jobs.c.nnodes
    q = select(
        func.count(),
        func.coalesce(func.sum(node_seconds), 0.0),
        func.coalesce(func.sum(_as_int(infra_failure())), 0),
    ).where(jobs.c.gpus > large_job_gpus, *window.clauses())
    with engine.connect() as conn:
        n_jobs, node_s, failures = conn.execute(q).one()
    node_days = float(node_s) / SECONDS_PER_DAY
    failures = int(failures)
    rate = failures / node_days if node_days > 0 else float("nan")
    lo, hi = poisson_rate_ci(failures, node_days, confidence)
    return FailureRate(failures, node_days, int(n_jobs), rate, lo, hi, confidence, large_job_gpus)


def _as_int(cond):
    return case((cond, 1), else_=0)


def outcomes(engine: Engine, window: Window = ALL_TIME) -> pd.DataFrame:
    """Job outcome breakdown by count and by GPU-hours (Fig. 3); hw marks infra failures."""
    hw = _as_int(infra_failure()).label("hw")
    gpu_s = func.sum(runtime_s() * jobs.c.gpus).label("gpu_seconds")
    q = (
        select(jobs.c.state, hw, func.count().label("jobs"), gpu_s)
        .where(*window.clauses())
        .group_by(jobs.c.state, hw)
    )
    with engine.connect() as conn:
        df = pd.DataFrame(conn.execute(q).all(), columns=["state", "hw", "jobs", "gpu_seconds"])
    df["hw"] = df["hw"].astype(bool)
    df["gpu_hours"] = df["gpu_seconds"].astype(float) / 3600.0
    df = df.drop(columns="gpu_seconds")
    df["outcome"] = df["state"] + df["hw"].map({True: " (HW)", False: ""})
    total_jobs, total_h = df["jobs"].sum(), df["gpu_hours"].sum()
    df["job_share"] = df["jobs"] / total_jobs if total_jobs else 0.0
    df["gpu_hour_share"] = df["gpu_hours"] / total_h if total_h else 0.0
    cols = ["outcome", "state", "hw", "jobs", "job_share", "gpu_hours", "gpu_hour_share"]
    return df[cols].sort_values("jobs", ascending=False).reset_index(drop=True)


def infra_failure_causes(engine: Engine, window: Window = ALL_TIME, min_gpus: int = 0):
    """One row per (failed job instance, cause): what each infra failure was attributed to.

    A NODE_FAIL with no attribution row at all counts as 'unattributed'; a FAILED job only
    counts through its check/event attributions.
    """
    a = attributions
    cause = func.coalesce(a.c.cause, literal("unattributed"))
    counted = or_(
        jobs.c.state.in_(HOST_FAIL_STATES),
        and_(jobs.c.state.in_(("FAILED", "REQUEUED")), a.c.kind != "unattributed"),
    )
    q = (
        select(jobs.c.id.label("job_pk"), jobs.c.end, jobs.c.gpus, cause.label("cause"))
        .select_from(jobs.outerjoin(a, a.c.job_pk == jobs.c.id))
        .where(
            jobs.c.state.in_(FAILED_STATES),
            counted,
            jobs.c.gpus > min_gpus,
            *window.clauses(),
        )
        .distinct()
    )
    with engine.connect() as conn:
        df = pd.DataFrame(conn.execute(q).all(), columns=["job_pk", "end", "gpus", "cause"])
    # A NODE_FAIL attributed to real causes should not also count as 'unattributed'.
    if not df.empty:
        real = (df["cause"] != "unattributed").groupby(df["job_pk"]).transform("any")
        df = df[~(real & (df["cause"] == "unattributed"))]
    return df


def causes(engine: Engine, window: Window = ALL_TIME) -> pd.DataFrame:
    """Failures per GPU-hour of all jobs in the window, by attributed cause (Fig. 4).

    A failure with several causes counts once for each; `cooccurring` is how many of a cause's
    failures also had another cause (the paper: PCIe errors with XID 79)."""
    with engine.connect() as conn:
        gpu_s = conn.execute(
            select(func.coalesce(func.sum(runtime_s() * jobs.c.gpus), 0.0)).where(*window.clauses())
        ).scalar_one()
    gpu_hours = float(gpu_s) / 3600.0
    df = infra_failure_causes(engine, window)
    cols = ["cause", "failures", "cooccurring", "per_gpu_hour", "share"]
    if df.empty:
        return pd.DataFrame(columns=cols)
    n_causes = df.groupby("job_pk")["cause"].transform("size")
    df = df.assign(multi=n_causes > 1)
    out = df.groupby("cause").agg(failures=("job_pk", "nunique"), cooccurring=("multi", "sum"))
    out["per_gpu_hour"] = out["failures"] / gpu_hours if gpu_hours else float("nan")
    out["share"] = out["failures"] / df["job_pk"].nunique()
    out = out.reset_index().sort_values(["failures", "cause"], ascending=[False, True])
    out["cooccurring"] = out["cooccurring"].astype(int)
    return out[cols].reset_index(drop=True)


def cooccurrence(engine: Engine, window: Window = ALL_TIME) -> pd.DataFrame:
    """Pairs of causes attributed to the same failure, with counts."""
    df = infra_failure_causes(engine, window)
    pairs = df.merge(df, on="job_pk")
    pairs = pairs[pairs["cause_x"] < pairs["cause_y"]]
    out = pairs.groupby(["cause_x", "cause_y"]).size().rename("failures").reset_index()
    return out.rename(columns={"cause_x": "cause_a", "cause_y": "cause_b"})


def rolling(
    engine: Engine,
    window: Window = ALL_TIME,
    days: int = 30,
    large_job_gpus: int = DEFAULT_LARGE_JOB_GPUS,
) -> pd.DataFrame:
    """Rolling failure rate per 1000 node-days by failure mode (Fig. 5), one row per day.

    Jobs count on the day they ended. A failure with k causes adds 1/k to each mode, so the
    modes stack up to the total rate. Columns: date, total, then one column per mode."""
    node_s = runtime_s() * jobs.c.nnodes
    q = select(jobs.c.end, node_s).where(jobs.c.gpus > large_job_gpus, *window.clauses())
    with engine.connect() as conn:
        exposure = pd.DataFrame(conn.execute(q).all(), columns=["end", "node_seconds"])
    if exposure.empty:
        return pd.DataFrame(columns=["date", "total"])
    exposure["date"] = pd.to_datetime(exposure["end"]).dt.floor("D")
    node_days = exposure.groupby("date")["node_seconds"].sum().astype(float) / SECONDS_PER_DAY
    fails = infra_failure_causes(engine, window, min_gpus=large_job_gpus)
    index = pd.date_range(node_days.index.min(), node_days.index.max(), freq="D")
    node_days = node_days.reindex(index, fill_value=0.0)
    if fails.empty:
        by_mode = pd.DataFrame(index=index)
    else:
        fails["date"] = pd.to_datetime(fails["end"]).dt.floor("D")
        fails["weight"] = 1.0 / fails.groupby("job_pk")["cause"].transform("size")
        by_mode = fails.pivot_table(
            index="date", columns="cause", values="weight", aggfunc="sum", fill_value=0.0
        ).reindex(index, fill_value=0.0)
    roll_nd = node_days.rolling(days, min_periods=1).sum()
    rates = by_mode.rolling(days, min_periods=1).sum().div(roll_nd, axis=0) * 1000.0
    rates = rates.fillna(0.0)
    rates.insert(0, "total", rates.sum(axis=1))
    rates.insert(0, "node_days", roll_nd)
    rates.index.name = "date"
    rates.columns.name = None
    return rates.reset_index()
