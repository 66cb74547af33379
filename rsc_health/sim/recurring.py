"""Fail-slow lab across jobs: a fleet's finished multi-node jobs as telemetry rollups (each
node's mean over each job), with nodes slow from the start of every job they run (the lab;
the product never imports it).

Scheduling as Slurm's default does it: a job takes the first free nodes in name order (equal
weights, no topology), runs 1-12 hours, and some are requeued onto the same nodes (1-3
times: a failing job, a training resubmitted). A share of the jobs are a team's recurring
training (8 or 16 nodes, one pipeline stage a node): its last stage, on the allocation's
last node, moves 35-50% less over NVLink, so the node whose name sorts last among the free
ones holds a role past the line in job after job. So the same
low-named nodes are often a job's first ranks, the adversarial case for a role: a rank's place
is not random, the test's chance model assumes less.

Healthy spread, per job: a traffic level; each node a few percent off it (a fixed per-node
part: a node's own clocks and links, and a per-job part); a pipeline's last stage (by rank,
the allocation's last nodes) moving 5-40% less over NVLink; a job that reports no throughput
(NOT_SUPPORTED); clocks a percent or two under the maximum; brief throttling; IB error bursts
averaged over the job (a few bursts of at most the family's keep-in-service count).

Step times (since session 27): half the jobs write step files (docs/failslow.md), each
node's mean seconds a step (its slowest rank's) a per-job level, a node's own percent or so,
and 1% per job. Roles: the training's stage-less files carry its last stage (the last node)
10-30% longer; another job with a pipeline names its stages half the time (each stage its own
peers), and otherwise its last stage's nodes take 5-40% longer. A slow node's steps are slower
by what slows it: clocks held low by as much, HW slowdown by half its share, NVLink by 0-5%.

Slow from the start (the class the detector's onset rules read as a role): from a day on, a
node's every job sees it
- nvlink_low: NVLink carrying 30-70% of its peers' bytes (links down before the job);
- clock_low: SM clocks held 7-15% low (a power cap, a GPU that lost its boost);
- throttled: in HW slowdown 30-70% of each interval;
- steps_slow: its step times 5-15% longer and its telemetry level with its peers (a host
  slow outside the GPUs: CPU frequency capped, a degraded memory channel, a slow local disk
  feeding the data loader), seen only by jobs that write step files.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

KINDS = ("nvlink_low", "clock_low", "throttled", "steps_slow")
COLUMNS = ("job_id", "node", "group", "metric", "value", "start", "end", "workload")


@dataclass
class RecurringConfig:
    seed: int = 0
    nodes: int = 256
    days: int = 7
    jobs_per_day: int = 120
    sizes: tuple[int, ...] = (4, 8, 16, 32, 64)
    size_weights: tuple[float, ...] = (0.3, 0.3, 0.2, 0.12, 0.08)
    hours: tuple[float, float] = (1.0, 12.0)
    requeue_share: float = 0.1
    # jobs of a team's recurring training: 8 or 16 nodes, one pipeline stage a node, its last
    # stage (the loss and the head: the last rank's node) moving 35-50% less over NVLink
    training_share: float = 0.3
    slow_share: float = 0.02  # nodes slow from the start of every job, from a day on
    steps_share: float = 0.5  # jobs that write step files
    start: str = "2024-03-01T00:00:00"


@dataclass
class RecurringFleet:
    rollups: pd.DataFrame  # COLUMNS
    slow: pd.DataFrame  # node, kind, since


def simulate_recurring(cfg: RecurringConfig) -> RecurringFleet:
    rng = np.random.default_rng([cfg.seed, 2611])
    names = [f"rc{i:04d}" for i in range(cfg.nodes)]
    group = np.where(np.arange(cfg.nodes) < cfg.nodes // 2, "H100-SXM5-80GB", "A100-SXM4-80GB")
    t0 = np.datetime64(cfg.start)
    span_h = cfg.days * 24.0
    offset = rng.normal(0, 0.02, cfg.nodes)  # a node's own few percent, every job
    step_offset = rng.normal(0, 0.01, cfg.nodes)  # a host's own percent or so a step
    k = max(1, int(round(cfg.slow_share * cfg.nodes)))
    bad = rng.choice(cfg.nodes, size=k, replace=False)
    slow = pd.DataFrame({
        "node": [names[i] for i in bad],
        "kind": rng.choice(KINDS, size=k).astype(str),
        "since": [t0 + np.timedelta64(int(h * 3600), "s")
                  for h in rng.uniform(0, span_h / 2, k)],
    })
    kind_of = dict(zip(bad.tolist(), slow["kind"], strict=True))
    since_of = dict(zip(bad.tolist(), slow["since"], strict=True))
    size_p = np.asarray(cfg.size_weights) / sum(cfg.size_weights)
    free_at = np.zeros(cfg.nodes)  # hours
    rows: list[tuple] = []
    arrivals = np.sort(rng.uniform(0, span_h, cfg.jobs_per_day * cfg.days))
    job = 0
    for at in arrivals:
        g = int(rng.integers(0, 2))
        pool = np.flatnonzero((group == group[g * (cfg.nodes // 2)]) & (free_at <= at))
        training = rng.random() < cfg.training_share
        size = int(rng.choice([8, 16])) if training else int(rng.choice(cfg.sizes, p=size_p))
        if len(pool) < size:
            continue  # a real scheduler would queue it; the lab drops it
        alloc = pool[:size]  # the first free nodes in name order
        runs = 1 + (int(rng.integers(1, 4)) if rng.random() < cfg.requeue_share else 0)
        begin = at
        work = f"team{int(rng.integers(0, 3))}/train-{size}" if training else f"job{job + 1}"
        for _ in range(runs):
            hours = rng.uniform(*cfg.hours)
            job += 1
            rows += _job(rng, job, alloc, names, group, offset, kind_of, since_of,
                         t0, begin, hours, training, work)
            if rng.random() < cfg.steps_share:
                rows += _steps(rng, job, alloc, names, step_offset, kind_of, since_of,
                               t0, begin, hours, training, work)
            begin += hours
        free_at[alloc] = begin
    return RecurringFleet(pd.DataFrame(rows, columns=list(COLUMNS)), slow)


def _steps(rng, job: int, alloc: np.ndarray, names, step_offset, kind_of, since_of,
           t0, begin: float, hours: float, training: bool, work: str) -> list[tuple]:
    """One job's step_seconds rows as load.job_steps gives them: each node's mean over the
    job, group "stage:" plus the stage its files name ("" for none)."""
    n = len(alloc)
    start = t0 + np.timedelta64(int(begin * 3600), "s")
    end = start + np.timedelta64(int(hours * 3600), "s")
    sec = np.exp(rng.uniform(np.log(0.2), np.log(2.0))) * np.exp(
        step_offset[alloc] + rng.normal(0, 0.01, n))
    stage = np.full(n, "", dtype=object)
    if training:  # one stage a node, files naming none: the last node's stage is heavier
        sec[-1] *= rng.uniform(1.1, 1.3)
    elif n >= 8 and rng.random() < 0.5:
        pp = int(rng.choice([2, 4, 8]))
        which = np.arange(n) * pp // n
        if rng.random() < 0.5:
            stage = which.astype(str).astype(object)
            sec *= rng.uniform(0.8, 1.25, pp)[which]  # each stage its own level
        else:
            sec[which == pp - 1] *= rng.uniform(1.05, 1.4)
    for i, node in enumerate(alloc.tolist()):
        if node in kind_of and since_of[node] <= start:
            kind = kind_of[node]
            sec[i] *= {"nvlink_low": rng.uniform(1.0, 1.05),
                       "clock_low": 1 / rng.uniform(0.85, 0.93),
                       "throttled": 1 + rng.uniform(0.3, 0.7) / 2,
                       "steps_slow": rng.uniform(1.05, 1.15)}[kind]
    return [(str(job), names[node], f"stage:{stage[i]}", "step_seconds", float(sec[i]),
             pd.Timestamp(start).to_pydatetime(), pd.Timestamp(end).to_pydatetime(), work)
            for i, node in enumerate(alloc.tolist())]


def _job(rng, job: int, alloc: np.ndarray, names, group, offset, kind_of, since_of,
         t0, begin: float, hours: float, training: bool = False, work: str = ""
         ) -> list[tuple]:
    n = len(alloc)
    start = t0 + np.timedelta64(int(begin * 3600), "s")
    end = start + np.timedelta64(int(hours * 3600), "s")
    pp = int(rng.choice([1, 2, 4, 8])) if n >= 8 else 1
    last = np.arange(n) * pp // n == pp - 1 if pp > 1 else np.zeros(n, dtype=bool)
    level = np.exp(rng.uniform(np.log(2e10), np.log(2e11)))
    nvl = level * np.exp(offset[alloc] + rng.normal(0, 0.03, n))
    nvl[last] *= rng.uniform(0.6, 0.95)
    if training:  # one stage a node: the last rank's node is the last stage
        nvl[-1] *= rng.uniform(0.5, 0.65)
    has_nvl = rng.random() > 0.2
    clock = np.clip(0.99 + rng.normal(0, 0.005, n) + offset[alloc] / 4, 0, 1)
    hw = np.clip(rng.exponential(0.01, n), 0, 1)
    # a few one-sweep IB bursts of at most 21 errors over a job of hours: a small mean
    sweeps = max(1, int(hours * 12))
    ib = rng.binomial(sweeps, 0.01, n) * rng.integers(5, 22, n) / (sweeps * 300.0)
    for i, node in enumerate(alloc.tolist()):
        if node in kind_of and since_of[node] <= start:
            kind = kind_of[node]
            if kind == "nvlink_low":
                nvl[i] *= rng.uniform(0.3, 0.7)
            elif kind == "clock_low":
                clock[i] *= rng.uniform(0.85, 0.93)
            else:
                hw[i] = rng.uniform(0.3, 0.7)
    out = []
    for i, node in enumerate(alloc.tolist()):
        for metric, value in (("nvlink_data_rate", nvl[i] if has_nvl else None),
                              ("sm_clock_ratio", clock[i]), ("throttle_hw_frac", hw[i]),
                              ("ib_error_rate", ib[i])):
            if value is not None:
                out.append((str(job), names[node], str(group[node]), metric, float(value),
                            pd.Timestamp(start).to_pydatetime(),
                            pd.Timestamp(end).to_pydatetime(), work))
    return out
