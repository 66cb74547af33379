"""Where failures meet jobs: jobs wait out a node's repair, the jobs running on a failing node
end NODE_FAIL or FAILED, and those that requeue come back under the same JobID."""

from __future__ import annotations

import numpy as np

from rsc_health.sim.config import SimConfig
from rsc_health.sim.failures import Failure, FailurePlan
from rsc_health.sim.fleet import Fleet
from rsc_health.sim.jobs import E, Instances, Jobs, S, continuation, place

MAX_ROUNDS = 8  # requeue generations; a crash loop longer than this is cut short


def _on_node(inst: Instances, idx: np.ndarray, node: int) -> np.ndarray:
    return (inst.first[idx] <= node) & (inst.first[idx] + inst.nnodes[idx] > node)


class StartIndex:
    """Instances by (node, start), so each failure finds the jobs on its node in O(log n):
    single-node jobs keyed by node then start, multi-node blocks by start then node range."""

    SHIFT = 40  # start seconds stay below 2**40

    def __init__(self, inst: Instances, idx: np.ndarray):
        self.inst = inst
        single = idx[inst.nnodes[idx] == 1]
        multi = idx[inst.nnodes[idx] > 1]
        key = (inst.first[single] << self.SHIFT) + inst.start[single]
        order = np.argsort(key, kind="stable")
        self.single, self.key = single[order], key[order]
        self.multi = multi[np.argsort(inst.start[multi], kind="stable")]
        self.mstart = inst.start[self.multi]

    def starting(self, node: int, t0: int, t1: int) -> np.ndarray:
        """Instances on `node` whose start is in [t0, t1)."""
        base = node << self.SHIFT
        lo, hi = np.searchsorted(self.key, [base + t0, base + t1])
        single = self.single[lo:hi]
        lo, hi = np.searchsorted(self.mstart, [t0, t1])
        multi = self.multi[lo:hi]
        multi = multi[_on_node(self.inst, multi, node)]
        return np.concatenate([single, multi]) if len(multi) else single


def wait_out_repairs(
    inst: Instances, idx: np.ndarray, failures: list[Failure], fleet: Fleet, jobs: Jobs,
    rng: np.random.Generator, max_rounds: int = 40,
) -> None:
    """No job starts on a node while it is out for repair: like the scheduler, a job that
    would is given other nodes, and after bouncing twice it also waits for the repair."""
    check = idx
    f_time = np.asarray([f.time for f in failures], dtype=np.int64)
    f_end = np.asarray([f.repair_end for f in failures], dtype=np.int64)
    for rounds in range(max_rounds):
        if not len(check) or not failures:
            return
        index = StartIndex(inst, check)
        blocked: dict[int, int] = {}  # instance -> end of the latest repair it ran into
        # Only outages that some checked job starts inside need a look (late rounds: few).
        starts = np.sort(inst.start[check])
        lo = np.searchsorted(starts, f_time)
        hi = np.searchsorted(starts, f_end)
        for k in np.flatnonzero(hi > lo).tolist():
            f = failures[k]
            for i in index.starting(f.node, f.time, f.repair_end).tolist():
                blocked[i] = max(blocked.get(i, 0), f.repair_end)
        if not blocked:
            return
        bad = np.fromiter(blocked.keys(), dtype=np.int64, count=len(blocked))
        part = jobs.partition[inst.job[bad]]
        inst.first[bad] = place(fleet.part_lo[part], fleet.part_hi[part], inst.nnodes[bad], rng)
        if rounds >= 2:
            until = np.fromiter(blocked.values(), dtype=np.int64, count=len(blocked))
            shift = np.maximum(0, until + 60 - inst.start[bad])
            inst.start[bad] += shift
            inst.end[bad] += shift
        check = bad


def find_hits(inst: Instances, idx: np.ndarray, failures: list[Failure]) -> dict[int, int]:
    """instance -> index of the earliest failure on one of its nodes while it ran."""
    hits: dict[int, int] = {}
    if not len(idx) or not failures:
        return hits
    index = StartIndex(inst, idx)
    longest = int((inst.end[idx] - inst.start[idx]).max())
    for k, f in enumerate(failures):  # failures are in time order per node, not globally
        cand = index.starting(f.node, f.time - longest, f.time + 1)
        for i in cand[inst.end[cand] > f.time].tolist():
            if i not in hits or failures[hits[i]].time > f.time:
                hits[i] = k
    return hits


def apply_failures(
    cfg: SimConfig, fleet: Fleet, jobs: Jobs, inst: Instances, plan: FailurePlan,
    rng: np.random.Generator,
) -> Instances:
    failures = plan.failures
    todo = np.arange(len(inst))
    wait_out_repairs(inst, todo, failures, fleet, jobs, rng)
    # Preempted jobs that requeue come back under the same JobID for the rest of their work
    # (planned only now that their own start is final).
    req = np.flatnonzero(inst.state == S["REQUEUED"])
    if len(req):
        base = len(inst)
        inst = Instances.concat([inst, continuation(cfg, fleet, jobs, inst, req, rng)])
        wait_out_repairs(inst, np.arange(base, len(inst)), failures, fleet, jobs, rng)
        todo = np.arange(len(inst))
    alive = np.ones(len(inst), dtype=bool)
    for _ in range(MAX_ROUNDS):
        hits = find_hits(inst, todo, failures)
        if not hits:
            break
        hit_idx = np.fromiter(hits.keys(), dtype=np.int64, count=len(hits))
        # A preempted-and-requeued instance whose parent died earlier never happened.
        orphans = todo[np.isin(inst.parent[todo], hit_idx)]
        alive[orphans] = False
        for i in orphans.tolist():
            hits.pop(i, None)
        hit_idx = np.fromiter(hits.keys(), dtype=np.int64, count=len(hits))
        fidx = np.fromiter(hits.values(), dtype=np.int64, count=len(hits))
        t = np.asarray([failures[k].time for k in fidx], dtype=np.int64)
        node_fail = np.asarray([failures[k].node_fail for k in fidx], dtype=bool)
        # NODE_FAIL ends when slurmctld gives up on the node; a crashed program exits sooner.
        lag = np.where(node_fail, rng.integers(60, 300, len(t)), rng.integers(5, 240, len(t)))
        inst.end[hit_idx] = np.maximum(inst.start[hit_idx] + 1, t + lag)
        inst.state[hit_idx] = np.where(node_fail, S["NODE_FAIL"], S["FAILED"])
        inst.exit_code[hit_idx] = np.where(
            node_fail, E["0:0"], np.where(rng.random(len(t)) < 0.7, E["1:0"], E["0:6"])
        )
        for i, k in zip(hit_idx.tolist(), fidx.tolist(), strict=True):
            failures[k].jobs.append(int(jobs.job_id[inst.job[i]]))
        gpus = jobs.gpus[inst.job[hit_idx]]
        requeue = (gpus >= cfg.requeue_min_gpus) | (rng.random(len(t)) < cfg.requeue_share_small)
        rq = hit_idx[requeue]
        inst.state[rq] = np.where(inst.state[rq] == S["NODE_FAIL"], S["NODE_FAIL"], S["REQUEUED"])
        inst.exit_code[rq] = E["0:0"]
        if not len(rq):
            break
        nxt = continuation(cfg, fleet, jobs, inst, rq, rng)
        base = len(inst)
        inst = Instances.concat([inst, nxt])
        alive = np.concatenate([alive, np.ones(len(nxt), dtype=bool)])
        todo = np.arange(base, len(inst))
        wait_out_repairs(inst, todo, failures, fleet, jobs, rng)
        cause = dict(zip(todo.tolist(), fidx[requeue].tolist(), strict=True))
        for c, victims in preempt_for_requeues(cfg, jobs, inst, alive, todo, rng):
            failures[cause[c]].preempted.extend(int(jobs.job_id[inst.job[v]]) for v in victims)
    return inst if alive.all() else inst.take(np.flatnonzero(alive))


def preempt_for_requeues(
    cfg: SimConfig, jobs: Jobs, inst: Instances, alive: np.ndarray, new: np.ndarray,
    rng: np.random.Generator,
) -> list[tuple[int, np.ndarray]]:
    """A requeued big job is high priority: when it restarts it preempts the smaller jobs on
    its nodes that have run for at least two hours (Obs. 9's second-order cost)."""
    big = new[jobs.gpus[inst.job[new]] >= cfg.requeue_min_gpus]
    if not len(big):
        return []
    min_run = int(cfg.preempt_min_runtime_h * 3600)
    # The only possible victims: small jobs that end on their own and run past two hours.
    pool = np.flatnonzero(
        (inst.state == S["COMPLETED"]) & alive & (inst.end - inst.start > min_run + 60)
        & (jobs.gpus[inst.job] < cfg.requeue_min_gpus)
    )
    if not len(pool):
        return []
    order = pool[np.argsort(inst.start[pool], kind="stable")]
    starts = inst.start[order]
    longest = int((inst.end[pool] - inst.start[pool]).max())
    out = []
    for c in big.tolist():
        s, b0 = int(inst.start[c]), int(inst.first[c])
        b1 = b0 + int(inst.nnodes[c])
        lo, hi = np.searchsorted(starts, [s - longest, s - min_run - 60 + 1])
        cand = order[lo:hi]
        overlaps = (inst.first[cand] < b1) & (inst.first[cand] + inst.nnodes[cand] > b0)
        # Earlier victims in this loop are PREEMPTED already and drop out here.
        sel = cand[overlaps & (inst.end[cand] > s) & (inst.state[cand] == S["COMPLETED"])]
        if len(sel):
            inst.end[sel] = s - rng.integers(5, 60, len(sel))
            inst.state[sel] = S["PREEMPTED"]
            inst.exit_code[sel] = E["0:0"]
            out.append((c, sel))
    return out


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
