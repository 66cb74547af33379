"""A capacity-respecting scheduler: where and when every job instance runs, failures included.

Every job is placed so that a node never has more than its 8 GPUs allocated at an instant and
no job starts on a node while it is out for repair. The fleet is split in two regions, each
sized so its share of the offered GPU time keeps it at the target utilisation:

* The **small-job region** (the last nodes; `dev` and `eval` share them with `learn`) runs the
  single-node jobs (1-8 GPUs). Its GPUs are cut into fixed *lanes* of 1, 2, 4 or 8 GPUs, as
  many of each as that job size's share of the region's GPU time; a lane runs one job at a time,
  so a node's lanes never hold more than its 8 GPUs. Each lane size is an FCFS multi-server queue
  (a heap of lane free times): a job starts at max(eligible, the earliest free lane).

* The **big-job region** (the first nodes, `learn`) runs the multi-node jobs on contiguous
  blocks that start on a leaf-switch boundary (multiples of min(size, 8) nodes),
  by conservative backfilling with exact runtimes: each job, in eligible order, takes the
  block where it can start earliest, possibly inside a *hole* an earlier reservation
  left. Each node keeps a few free intervals (holes, the last one open-ended); finding the
  earliest start is a vectorised fixed-point over all blocks (a node's earliest fitting start at
  or after t, the block's maximum, repeat), refined block by block.

Node outages are known in advance (the failure plan does not depend on jobs): a node's free
intervals end where it fails, and restart when the repair ends. A job may start before a failure
and run into it (it is then killed: NODE_FAIL or FAILED, a few minutes after the failure), but no
job starts inside an outage. A killed job that requeues (big jobs always, small ones sometimes)
comes back under the same JobID, eligible 121 s later, for the work since its last checkpoint,
and queues like any other job; so do the jobs preempted-and-requeued by their own plan.

Everything is processed in eligible-time order in one pass per lane size and one for the big
region, so a node failure kills exactly the jobs running on that node.
"""

from __future__ import annotations

import bisect
import heapq
from dataclasses import dataclass

import numpy as np

from rsc_health.sim.config import SimConfig
from rsc_health.sim.failures import Failure
from rsc_health.sim.jobs import HOUR, E, Instances, Jobs, S

MAX_ROUNDS = 8  # requeue generations; a crash loop longer than this is cut short
INF = np.int64(1) << 60
LOOKAHEAD = 3 * 24 * HOUR  # outages are entered into the big region's holes this far ahead
HOLES = 6  # free intervals kept per big-region node (a shorter one is dropped to fit a new one)
MIN_HOLE = 60
ALIGN = 8  # multi-node blocks start at multiples of this many nodes (a leaf switch)


@dataclass
class Request:
    """A job instance waiting to be placed."""

    job: int
    submit: int
    eligible: int
    elapsed: int  # how long it runs if nothing kills it
    state: int
    exit_code: int
    parent: int
    work_before: int
    generation: int


class Output:
    """Placed instances, as growing Python lists (turned into Instances at the end)."""

    def __init__(self) -> None:
        self.cols: dict[str, list[int]] = {k: [] for k in Instances.__dataclass_fields__}

    def add(self, r: Request, start: int, end: int, first: int, nnodes: int, state: int,
            exit_code: int) -> int:
        c = self.cols
        c["job"].append(r.job)
        c["submit"].append(r.submit)
        c["eligible"].append(r.eligible)
        c["start"].append(start)
        c["end"].append(end)
        c["first"].append(first)
        c["nnodes"].append(nnodes)
        c["state"].append(state)
        c["exit_code"].append(exit_code)
        c["parent"].append(r.parent)
        c["work_before"].append(r.work_before)
        return len(c["job"]) - 1

    def instances(self) -> Instances:
        dtypes = {"state": np.int8, "exit_code": np.int8}
        return Instances(**{k: np.asarray(v, dtype=dtypes.get(k, np.int64))
                            for k, v in self.cols.items()})


class Runner:
    """What happens around a placement: kills, requeues and the queue of continuations."""

    def __init__(self, cfg: SimConfig, jobs: Jobs, failures: list[Failure], out: Output,
                 rng: np.random.Generator, horizon: int):
        self.cfg, self.jobs, self.failures, self.out = cfg, jobs, failures, out
        self.rng, self.horizon = rng, horizon
        self.pending: list[tuple[int, int, Request]] = []
        self.seq = 0

    def finish(self, r: Request, start: int, first: int, nnodes: int, killer: int) -> int:
        """Record the instance; returns the time its nodes are free (killed: the kill)."""
        cfg, rng = self.cfg, self.rng
        if killer < 0:
            end = start + r.elapsed
            idx = self.out.add(r, start, end, first, nnodes, r.state, r.exit_code)
            if r.state == S["REQUEUED"]:
                self.requeue(r, idx, start, end)
            return end
        f = self.failures[killer]
        # NODE_FAIL ends when slurmctld gives up on the node; a crashed program exits sooner.
        lag = int(rng.integers(60, 300)) if f.node_fail else int(rng.integers(5, 240))
        end = max(start + 1, f.time + lag)
        state = S["NODE_FAIL"] if f.node_fail else S["FAILED"]
        exit_code = E["0:0"] if f.node_fail else (E["1:0"] if rng.random() < 0.7 else E["0:6"])
        gpus = int(self.jobs.gpus[r.job])
        again = (gpus >= cfg.requeue_min_gpus or rng.random() < cfg.requeue_share_small)
        if again and state == S["FAILED"]:
            state, exit_code = S["REQUEUED"], E["0:0"]
        idx = self.out.add(r, start, end, first, nnodes, state, exit_code)
        f.jobs.append(int(self.jobs.job_id[r.job]))
        if again:
            self.requeue(r, idx, start, end)
        return end

    def requeue(self, r: Request, idx: int, start: int, end: int) -> None:
        """The next instance: same JobID, the work since the last checkpoint (hourly, Sec. III)
        lost, eligible after Slurm's requeue hold (credential lifetime + 1 s)."""
        if r.generation + 1 >= MAX_ROUNDS or end + 121 >= self.horizon:
            return
        ran = end - start
        done = r.work_before + max(0, ran - min(ran, HOUR // 2))
        remaining = max(300, int(self.jobs.runtime[r.job]) - done)
        nxt = Request(r.job, end, end + 121, remaining, S["COMPLETED"], E["0:0"], idx, done,
                      r.generation + 1)
        self.seq += 1
        heapq.heappush(self.pending, (nxt.eligible, self.seq, nxt))

    def requests(self, initial: list[Request]):
        """Initial requests (eligible order) merged with the continuations as they appear."""
        pending = self.pending
        for r in initial:
            while pending and pending[0][0] <= r.eligible:
                yield heapq.heappop(pending)[2]
            yield r
        while pending:
            yield heapq.heappop(pending)[2]


def _initial(inst: Instances, idx: np.ndarray) -> list[Request]:
    elapsed = (inst.end - inst.start)[idx].tolist()
    return [
        Request(j, s, e, d, st, ex, -1, 0, 0)
        for j, s, e, d, st, ex in zip(inst.job[idx].tolist(), inst.submit[idx].tolist(),
                                      inst.eligible[idx].tolist(), elapsed,
                                      inst.state[idx].tolist(), inst.exit_code[idx].tolist(),
                                      strict=True)
    ]


def lanes(cfg: SimConfig, lo: int, hi: int, load: dict[int, float]) -> dict[int, list[int]]:
    """Cut the small-job region's GPUs into lanes: lane size -> node of each lane. Sizes get
    GPUs in proportion to their load (at least one lane while GPUs last), 1-GPU lanes the rest."""
    total_gpus = (hi - lo) * cfg.gpus_per_node
    total = sum(load.values()) or 1.0
    out: dict[int, list[int]] = {}
    offset = 0
    sizes = sorted(load, reverse=True)
    for g in sizes:
        left = total_gpus - offset
        n = left // g if g == sizes[-1] else min(left // g, max(1, round(load[g] / total *
                                                                           total_gpus / g)))
        out[g] = [lo + (offset + k * g) // cfg.gpus_per_node for k in range(n)]
        offset += n * g
    return out


def _node_failures(failures: list[Failure]) -> dict[int, tuple[list[int], list[int], list[int]]]:
    by: dict[int, tuple[list[int], list[int], list[int]]] = {}
    for k, f in sorted(enumerate(failures), key=lambda kf: (kf[1].node, kf[1].time)):
        t, e, i = by.setdefault(f.node, ([], [], []))
        t.append(f.time)
        e.append(f.repair_end)
        i.append(k)
    return by


def run_lanes(run: Runner, initial: list[Request], lane_nodes: list[int],
              node_failures: dict) -> None:
    """One lane size: FCFS over its lanes, jobs waiting out repairs of their lane's node."""
    free = [(0, k) for k in range(len(lane_nodes))]
    heapq.heapify(free)
    for r in run.requests(initial):
        free_t, lane = heapq.heappop(free)
        node = lane_nodes[lane]
        t = max(r.eligible, free_t)
        killer = -1
        nf = node_failures.get(node)
        if nf is None:
            heapq.heappush(free, (run.finish(r, t, node, 1, -1), lane))
            continue
        ft, fe, fi = nf
        i = bisect.bisect_right(ft, t) - 1
        while i >= 0 and fe[i] > t:  # out for repair: wait for it
            t = fe[i] + 60
            i = bisect.bisect_right(ft, t) - 1
        j = i + 1
        if j < len(ft) and ft[j] < t + r.elapsed:
            killer = fi[j]
        end = run.finish(r, t, node, 1, killer)
        heapq.heappush(free, (fe[j] if killer >= 0 else end, lane))


class Holes:
    """Free intervals of the big region's nodes: hs/he (start, end) with `fk` the failure an
    interval ends at (-1: it ends at a reservation, or never). An empty slot has he = -1."""

    def __init__(self, n: int, k: int = HOLES):
        self.hs = np.full((n, k), INF, dtype=np.int64)
        self.he = np.full((n, k), -1, dtype=np.int64)
        self.fk = np.full((n, k), -1, dtype=np.int64)
        self.hs[:, 0], self.he[:, 0] = 0, INF
        self.conflicts = 0  # outages that fell on a reservation made before they were known

    def _put(self, node: int, s: int, e: int, fk: int) -> None:
        if e - s < MIN_HOLE:
            return
        he = self.he[node]
        empty = np.flatnonzero(he < 0)
        k = int(empty[0]) if len(empty) else int(np.argmin(he - self.hs[node]))
        self.hs[node, k], he[k], self.fk[node, k] = s, e, fk

    def outage(self, node: int, t: int, end: int, fk: int) -> None:
        hs, he = self.hs[node], self.he[node]
        inside = np.flatnonzero((hs <= t) & (t < he))
        if not len(inside):
            self.conflicts += 1
            return
        k = int(inside[0])
        old_e, old_f = int(he[k]), int(self.fk[node, k])
        he[k], self.fk[node, k] = t, fk
        if end < old_e:
            self._put(node, end, old_e, old_f)
        else:
            self.conflicts += 1

    def forget_before(self, t: int) -> None:
        dead = self.he <= t
        self.hs[dead], self.he[dead], self.fk[dead] = INF, -1, -1

    def _earliest(self, lo: int, hi: int, t, d: int) -> np.ndarray:
        """Each node's earliest start at or after t (per node) in a free interval that holds
        d seconds, or ends at a failure (the job may run into it; it is then killed)."""
        hs, he, soft = self.hs[lo:hi], self.he[lo:hi], self.fk[lo:hi] >= 0
        st = np.maximum(t, hs)
        ok = (st + d <= he) | (soft & (st < he))
        return np.where(ok, st, INF).min(axis=1)

    def place(self, w: int, t0: int, d: int) -> tuple[int, int]:
        """(first node, start) of the w-node block where a d-second job eligible at t0 starts
        earliest. Blocks are contiguous and start at multiples of min(w, ALIGN) nodes."""
        n = len(self.hs)
        step = min(w, ALIGN)
        firsts = np.arange(0, n - w + 1, step)
        ns = self._earliest(0, n, np.int64(t0), d)
        if step == w:
            lb = ns[: len(firsts) * w].reshape(len(firsts), w).max(axis=1)
        else:
            lb = np.lib.stride_tricks.sliding_window_view(ns, w)[firsts].max(axis=1)
        # lb is a lower bound per block: refine the best one until no other can beat it.
        while True:
            b = int(lb.argmin())
            f = int(firsts[b])
            t = lb[b]
            while True:
                nt = self._earliest(f, f + w, t, d).max()
                if nt == t:
                    break
                t = nt
            lb[b] = t
            if lb.min() == t:
                return f, int(t)

    def reserve(self, first: int, w: int, t: int, d: int) -> tuple[int, int]:
        """Take [t, t+d) on the block; a failure inside it (on any of its nodes) kills the job:
        returns (failure index or -1, the time the failure strikes or t+d)."""
        rows = np.arange(first, first + w)
        hs, he, fk = self.hs[rows], self.he[rows], self.fk[rows]
        k = ((hs <= t) & (t < he)).argmax(axis=1)
        r = np.arange(w)
        ohs, ohe, ofk = hs[r, k], he[r, k], fk[r, k]
        hit = (ofk >= 0) & (ohe < t + d)
        if hit.any():
            m = int(np.flatnonzero(hit)[np.argmin(ohe[hit])])
            killer, stop = int(ofk[m]), int(ohe[m])
        else:
            killer, stop = -1, t + d
        # The left part stays in place; the right part (if any) goes to a free slot.
        self.he[rows, k] = t
        self.fk[rows, k] = -1
        short = t - ohs < MIN_HOLE
        self.hs[rows[short], k[short]], self.he[rows[short], k[short]] = INF, -1
        return killer, stop, (rows, ohe, ofk)

    def release(self, rows, ohe, ofk, end: int) -> None:
        for node, e, f in zip(rows.tolist(), ohe.tolist(), ofk.tolist(), strict=True):
            if e > end:
                self._put(node, end, e, f)


def run_big(run: Runner, initial: list[Request], n_nodes: int, failures: list[Failure]) -> int:
    holes = Holes(n_nodes)
    outages = sorted((f.time, k) for k, f in enumerate(failures) if f.node < n_nodes)
    nxt = 0
    gpn = run.cfg.gpus_per_node

    def know(upto: int) -> None:
        """Enter the outages that begin before `upto` into the holes."""
        nonlocal nxt
        while nxt < len(outages) and outages[nxt][0] < upto:
            f = failures[outages[nxt][1]]
            holes.outage(f.node, f.time, f.repair_end, outages[nxt][1])
            nxt += 1

    for count, r in enumerate(run.requests(initial)):
        t0 = r.eligible
        know(t0 + LOOKAHEAD)
        if count % 64 == 0:
            holes.forget_before(t0)
        w = int(-(-int(run.jobs.gpus[r.job]) // gpn))
        while True:
            first, t = holes.place(w, t0, r.elapsed)
            # Every outage the reservation could meet must be known before it is made.
            if nxt >= len(outages) or outages[nxt][0] >= t + r.elapsed:
                break
            know(t + r.elapsed + LOOKAHEAD)
        killer, _stop, saved = holes.reserve(first, w, t, r.elapsed)
        end = run.finish(r, t, first, w, killer)
        holes.release(*saved, end)
    return holes.conflicts


def schedule(cfg: SimConfig, jobs: Jobs, inst: Instances, big_hi: int, n_nodes: int,
             failures: list[Failure], rng: np.random.Generator, horizon: int
             ) -> tuple[Instances, dict]:
    """Place every planned first instance (and the continuations that follow) on the fleet."""
    out = Output()
    gpus = jobs.gpus[inst.job]
    gpn = cfg.gpus_per_node
    order = np.argsort(inst.eligible, kind="stable")
    stats: dict = {"conflicts": 0}
    small = order[gpus[order] <= gpn]
    if len(small):
        load = {int(g): float(np.sum(gpus[small][gpus[small] == g] *
                                     (inst.end - inst.start)[small][gpus[small] == g]))
                for g in np.unique(gpus[small])}
        pools = lanes(cfg, big_hi, n_nodes, load)
        sizes = sorted(g for g, nodes in pools.items() if nodes)
        # A size with no lane of its own runs in the next bigger lanes.
        pool_of = {g: next((s for s in sizes if s >= g), sizes[-1]) for g in load}
        node_failures = _node_failures(failures)
        small_pool = np.asarray([pool_of[int(g)] for g in gpus[small]], dtype=np.int64)
        for pool in sizes:
            sel = small[small_pool == pool]
            if len(sel):
                run = Runner(cfg, jobs, failures, out, rng, horizon)
                run_lanes(run, _initial(inst, sel), pools[pool], node_failures)
        stats["lanes"] = {g: len(v) for g, v in pools.items()}
    big = order[gpus[order] > gpn]
    if len(big):
        run = Runner(cfg, jobs, failures, out, rng, horizon)
        stats["conflicts"] = run_big(run, _initial(inst, big), big_hi, failures)
    return out.instances(), stats
