"""MTTF by job size (paper Fig. 7): measured, with a 90% Gamma interval, next to the projection
MTTF = 1 / (N_nodes r_f).

Sizes: GPUs rounded up to the next multiple of 8, then grouped into power-of-two buckets
(8, 16, 32, ..., 1024, and an open "2048+"); a 24-GPU job falls in the 32 bucket.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import pandas as pd
from sqlalchemy import Engine, case, func, select

from rsc_health.historian.metrics._sql import (
    ALL_TIME,
    DEFAULT_BUCKETS,
    Window,
    bucket_label,
    bucket_of,
    infra_failure,
    poisson_rate_ci,
    rounded_gpus,
    runtime_s,
)
from rsc_health.historian.schema import jobs

GPUS_PER_NODE = 8


def projected_mttf_hours(gpus: float, r_f: float, gpus_per_node: int = GPUS_PER_NODE) -> float:
    """MTTF = (N_nodes r_f)^-1 in hours, r_f per node-day (paper section III). An r_f of 0
    (no failure in the window: a healthy week) projects an unbounded MTTF, inf, not a
    ZeroDivisionError; an unmeasured r_f (NaN) projects NaN."""
    if gpus <= 0:
        raise ValueError(f"a job size of {gpus} GPUs has no MTTF")
    n_nodes = gpus / gpus_per_node
    if r_f == 0:
        return math.inf
    return 24.0 / (n_nodes * r_f)


def mttf_by_size(
    engine: Engine,
    window: Window = ALL_TIME,
    r_f: float | None = None,
    buckets: Sequence[int] = DEFAULT_BUCKETS,
    gpus_per_node: int = GPUS_PER_NODE,
    confidence: float = 0.9,
) -> pd.DataFrame:
    """Per size bucket: jobs, runtime hours, failures, MTTF hours and its CI, projected MTTF.

    MTTF = total runtime of the bucket's jobs / their infra failures (NODE_FAIL + attributed
    FAILED). The interval inverts the Gamma interval of the failure rate; with no failures the
    upper bound is infinite. `r_f` (per node-day) drives the projection column when given.
    """
    rg = rounded_gpus().label("rounded")
    q = (
        select(
            rg,
            func.count().label("jobs"),
            func.sum(runtime_s()).label("runtime_s"),
            func.sum(case((infra_failure(), 1), else_=0)).label("failures"),
        )
        .where(jobs.c.gpus > 0, *window.clauses())
        .group_by(rg)
    )
    with engine.connect() as conn:
        df = pd.DataFrame(
            conn.execute(q).all(), columns=["rounded", "jobs", "runtime_s", "failures"]
        )
    cols = [
        "size",
        "gpus",
        "jobs",
        "runtime_hours",
        "failures",
        "mttf_hours",
        "ci_low_hours",
        "ci_high_hours",
        "projected_hours",
    ]
    if df.empty:
        return pd.DataFrame(columns=cols)
    df["gpus"] = [bucket_of(int(g), buckets) for g in df["rounded"]]
    out = df.groupby("gpus", as_index=False).agg(
        jobs=("jobs", "sum"), runtime_s=("runtime_s", "sum"), failures=("failures", "sum")
    )
    out["runtime_hours"] = out["runtime_s"].astype(float) / 3600.0
    out["failures"] = out["failures"].astype(int)
    out["mttf_hours"] = out["runtime_hours"] / out["failures"].where(out["failures"] > 0)
    pairs = zip(out["failures"], out["runtime_hours"], strict=True)
    ci = [poisson_rate_ci(k, t, confidence) for k, t in pairs]
    out["ci_low_hours"] = [1.0 / hi if hi > 0 else float("nan") for _, hi in ci]
    out["ci_high_hours"] = [1.0 / lo if lo > 0 else float("inf") for lo, _ in ci]
    out["projected_hours"] = (
        [projected_mttf_hours(g, r_f, gpus_per_node) for g in out["gpus"]] if r_f else float("nan")
    )
    out["size"] = [bucket_label(int(g), buckets) for g in out["gpus"]]
    return out[cols].sort_values("gpus").reset_index(drop=True)
