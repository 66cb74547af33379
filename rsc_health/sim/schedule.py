"""After placement: the silent job failures of lemon nodes, and the end of the window."""

from __future__ import annotations

import numpy as np

from rsc_health.sim.config import SimConfig
from rsc_health.sim.failures import FailurePlan
from rsc_health.sim.jobs import E, Instances, S


def lemon_job_failures(
    cfg: SimConfig, inst: Instances, plan: FailurePlan, rng: np.random.Generator
) -> dict[int, int]:
    """Single-node jobs on a lemon node fail now and then with no health check firing: the
    `single_node_node_fails` signal of Sec. IV-A. Returns node -> count."""
    lemon_nodes = np.fromiter(plan.lemons.keys(), dtype=np.int64, count=len(plan.lemons))
    ok = inst.state == S["COMPLETED"]
    on_lemon = (inst.nnodes == 1) & np.isin(inst.first, lemon_nodes) & ok
    sel = np.flatnonzero(on_lemon & (rng.random(len(inst)) < cfg.lemon_job_fail_share))
    frac = rng.random(len(sel))
    ran = (inst.end[sel] - inst.start[sel]) * frac
    inst.end[sel] = inst.start[sel] + np.maximum(30, ran).astype(np.int64)
    nf = rng.random(len(sel)) < 0.3
    inst.state[sel] = np.where(nf, S["NODE_FAIL"], S["FAILED"])
    inst.exit_code[sel] = np.where(nf, E["0:0"], E["0:9"])
    nodes, counts = np.unique(inst.first[sel], return_counts=True)
    return {int(n): int(c) for n, c in zip(nodes, counts, strict=True)}


def close_horizon(inst: Instances, horizon: int) -> Instances:
    """At the end of the window: jobs not yet started are not in `sacct -X` output with a
    start, and those still running show RUNNING with End `Unknown` (end = -1)."""
    started = inst.start < horizon
    if not started.all():
        inst = inst.take(np.flatnonzero(started))
    running = inst.end >= horizon
    inst.state[running] = S["RUNNING"]
    inst.exit_code[running] = E["0:0"]
    inst.end[running] = -1
    return inst
