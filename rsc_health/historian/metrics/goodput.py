"""Goodput lost to infra failures and to the preemptions their requeues cause (paper Fig. 8).

Each lost job costs min(runtime, 30 min) x GPUs: the paper assumes hourly checkpoints, so half
an hour of work on average. A PREEMPTED job is charged to a failure when it ended within
`preempt_window_s` of the start of the next instance of an infra-failed Job ID (its requeue;
the next only, not every later one) and shared a node with that instance -- the requeue took
its nodes.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
from sqlalchemy import Engine, and_, case, exists, func, select, true

from rsc_health.historian.metrics._sql import (
    ALL_TIME,
    DEFAULT_BUCKETS,
    Window,
    bucket_label,
    bucket_of,
    infra_failure,
    runtime_s,
    seconds_between,
    shifted,
)
from rsc_health.historian.schema import job_nodes, jobs

LOST_WORK_CAP_S = 1800.0


def _requeue_preemptions(engine: Engine, window: Window, preempt_window_s: float) -> pd.DataFrame:
    """PREEMPTED instances displaced by the requeue of an infra-failed job instance."""
    failed = (
        select(jobs.c.id, jobs.c.job_id, jobs.c.cluster, jobs.c.end)
        .where(infra_failure(), *window.clauses())
        .cte("failed")
    )
    nxt = jobs.alias("nxt")
    # The requeue: the next instance of the same Job ID, the first to start at or after the
    # failure, on the same cluster (another cluster in the historian counts its own job ids).
    # Only the next: a job requeued again later (preempted itself, a user's requeue) started
    # those instances for causes of their own, and the preemptions around them were charged
    # to this failure too.
    later = (
        select(
            nxt.c.id.label("rq_pk"), nxt.c.start.label("rq_start"),
            func.row_number().over(partition_by=failed.c.id,
                                   order_by=(nxt.c.start, nxt.c.id)).label("nth"),
        )
        .select_from(
            failed.join(nxt, and_(nxt.c.job_id == failed.c.job_id,
                                  nxt.c.cluster == failed.c.cluster, nxt.c.id != failed.c.id))
        )
        .where(nxt.c.start.is_not(None), nxt.c.start >= failed.c.end)
        .subquery("later")
    )
    requeue = (
        select(later.c.rq_pk, later.c.rq_start)
        .where(later.c.nth == 1)
        .distinct()
        .cte("requeue")
    )
    victim = jobs.alias("victim")
    vn, rn = job_nodes.alias("vn"), job_nodes.alias("rn")
    # Victims by end time first (ix_jobs_end range per requeue), then the node overlap by key.
    near = and_(
        victim.c.end >= shifted(requeue.c.rq_start, -preempt_window_s),
        victim.c.end <= shifted(requeue.c.rq_start, preempt_window_s),
    )
    # Correlated to the requeue and victim outside it, also from inside the LATERAL below
    # (two levels up), never with a FROM requeue of its own.
    shares_node = exists(
        select(rn.c.node)
        .select_from(rn.join(vn, vn.c.node == rn.c.node))
        .where(rn.c.job_pk == requeue.c.rq_pk, vn.c.job_pk == victim.c.id)
        .correlate_except(rn, vn)
    )
    if engine.dialect.name == "sqlite":
        q = (
            select(
                victim.c.id.label("job_pk"),
                victim.c.gpus,
                case_runtime(victim).label("runtime_s"),
            )
            .select_from(requeue.join(victim, near))
            # coalesce() keeps SQLite from driving the join off an index on state (~10% of all
            # jobs are PREEMPTED) instead of the narrow ix_jobs_end range per requeue.
            .where(func.coalesce(victim.c.state, "") == "PREEMPTED", shares_node)
            .distinct()
        )
    else:
        # PostgreSQL misjudges the requeues (200,000 guessed, 5,700 at the paper's scale) and
        # would loop over every PREEMPTED job comparing it with every requeue (2.1 billion
        # pairs, 200 s). LATERAL makes it look up each requeue's +-window on ix_jobs_end.
        victims = (
            select(victim.c.id, victim.c.gpus, case_runtime(victim).label("runtime_s"))
            .where(near, victim.c.state == "PREEMPTED", shares_node)
            .lateral("victims")
        )
        q = (
            select(victims.c.id.label("job_pk"), victims.c.gpus, victims.c.runtime_s)
            .select_from(requeue.join(victims, true()))
            .distinct()
        )
    with engine.connect() as conn:
        return pd.DataFrame(conn.execute(q).all(), columns=["job_pk", "gpus", "runtime_s"])


def case_runtime(t):
    """runtime_s() for an aliased jobs table."""
    return case((t.c.start.is_(None), 0.0), else_=seconds_between(t.c.start, t.c.end))


def goodput_lost(
    engine: Engine,
    window: Window = ALL_TIME,
    buckets: Sequence[int] = DEFAULT_BUCKETS,
    preempt_window_s: float = 300.0,
) -> pd.DataFrame:
    """GPU-hours lost by job size (the lost job's own size) and kind: failure | preemption."""
    q = select(jobs.c.id, jobs.c.gpus, runtime_s()).where(infra_failure(), *window.clauses())
    with engine.connect() as conn:
        failed = pd.DataFrame(conn.execute(q).all(), columns=["job_pk", "gpus", "runtime_s"])
    failed["kind"] = "failure"
    pre = _requeue_preemptions(engine, window, preempt_window_s)
    pre["kind"] = "preemption"
    lost = pd.concat([failed, pre], ignore_index=True)
    cols = ["size", "gpus", "kind", "jobs", "gpu_hours_lost"]
    if lost.empty:
        return pd.DataFrame(columns=cols)
    lost["gpu_hours_lost"] = (
        lost["runtime_s"].astype(float).clip(upper=LOST_WORK_CAP_S) * lost["gpus"] / 3600.0
    )
    rounded = ((lost["gpus"].astype(int) + 7) // 8) * 8
    lost["gpus"] = [bucket_of(int(g), buckets) for g in rounded]
    out = lost.groupby(["gpus", "kind"], as_index=False).agg(
        jobs=("job_pk", "nunique"), gpu_hours_lost=("gpu_hours_lost", "sum")
    )
    out["size"] = [bucket_label(int(g), buckets) for g in out["gpus"]]
    return out[cols].sort_values(["gpus", "kind"]).reset_index(drop=True)
