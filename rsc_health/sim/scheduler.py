"""A capacity-respecting scheduler: where and when every job instance runs, failures included.

Every job is placed so that a node never has more than its 8 GPUs allocated at an instant and
no job starts on a node while it is out for repair. The fleet is split in two regions, each
sized so its share of the offered GPU time keeps it at the target utilisation:

* The **small-job region** (the last nodes; `dev` and `eval` share them with `learn`) runs the
  single-node jobs (1-8 GPUs). Its GPUs are cut into fixed *lanes* of 1, 2, 4 or 8 GPUs, as
  many of each as that job size's share of the region's GPU time; a lane runs one job at a time,
  so a node's lanes never hold more than its 8 GPUs. Each lane size is an FCFS multi-server queue
  (a heap of lane free times): a job starts at max(eligible, the earliest free lane).

* The **big-job region** (the first nodes, `learn`) runs the multi-node jobs as one pool of
  nodes (Slurm hands out any idle nodes; the allocation is written as a hostlist, ranges where
  it is contiguous). Each node keeps when it is free (the end of the last instance booked on
  it, or of a repair it was caught in) and one idle gap before that booking. A job, in eligible
  order, takes the w nodes free first and starts when the last of them is (FCFS, so wide jobs
  are never starved); if w nodes' gaps hold it earlier, it is backfilled there instead. Both
  are a handful of vectorised calls over the region (np.partition), whatever the job's size.

* **Priority requeues.** A big job (>= requeue_min_gpus GPUs) requeued after a failure starts
  at its eligible time if enough nodes are free then or run a job that started
  preempt_min_runtime_h ago and is the last booked on that node; those victims end PREEMPTED
  at that second and requeue (same JobID, eligible 121 s later), and the failure records them.

Node outages are known in advance (the failure plan does not depend on jobs), as per-node
sorted (time, repair end) arrays. A start inside an outage moves past the repair (the node is
passed over); a job may start before a failure and run into it: it is then killed (NODE_FAIL or
FAILED, a few minutes after the failure) and the failed node is free when its repair ends. A
killed job that requeues (big jobs always, small ones sometimes) comes back under the same
JobID, eligible 121 s later, for the work since its last checkpoint, and queues like any other
job; so do the jobs preempted-and-requeued by their own plan.

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
from rsc_health.sim.jobs import (
    HOUR,
    INSTANCE_DTYPES,
    INSTANCE_FIELDS,
    E,
    Instances,
    Jobs,
    S,
)

MAX_ROUNDS = 8  # requeue generations; a crash loop longer than this is cut short
INF = np.int64(1) << 60
SHIFT = 40  # (node << SHIFT) + time: one sort key for a region's outages; times stay < 2**40


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
    cause: int = -1  # the failure whose kill this instance requeues after (-1: none)


class Output:
    """Placed instances: segments of numpy columns (a lane pool's first instances, reserved in
    one block) and growing Python lists for the rest; one index space over them, in order."""

    def __init__(self) -> None:
        self.segments: list[dict[str, np.ndarray]] = []
        self.cols: dict[str, list[int]] = {k: [] for k in INSTANCE_FIELDS}
        self.base = 0  # index of the first row in `cols`
        self.nodesets: list[np.ndarray] = []  # the nodes of allocations that are not one range

    def add(self, r: Request, start: int, end: int, where, state: int, exit_code: int) -> int:
        """`where`: one node (an int), or an allocation's sorted node indices."""
        c = self.cols
        if isinstance(where, int):
            first, nnodes, nodeset = where, 1, -1
        else:
            first, nnodes, nodeset = int(where[0]), len(where), -1
            if int(where[-1]) - first + 1 != nnodes:
                nodeset = len(self.nodesets)
                self.nodesets.append(where.astype(np.int32))
        c["nodeset"].append(nodeset)
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
        return self.base + len(c["job"]) - 1

    def get(self, i: int, key: str) -> int:
        return self.cols[key][i - self.base]

    def set(self, i: int, key: str, value: int) -> None:
        self.cols[key][i - self.base] = value

    def _flush(self) -> None:
        n = len(self.cols["job"])
        if n:
            self.segments.append({k: np.asarray(v, dtype=INSTANCE_DTYPES.get(k, np.int64))
                                  for k, v in self.cols.items()})
            self.cols = {k: [] for k in INSTANCE_FIELDS}
            self.base += n

    def block(self, seg: dict[str, np.ndarray]) -> int:
        """Reserve a segment of rows (filled in place later); returns its first index."""
        self._flush()
        base = self.base
        self.segments.append(seg)
        self.base += len(seg["job"])
        return base

    def instances(self) -> Instances:
        self._flush()
        if not self.segments:
            return Instances(
                **{k: np.zeros(0, dtype=INSTANCE_DTYPES.get(k, np.int64)) for k in INSTANCE_FIELDS}
            )
        return Instances(
            **{k: np.concatenate([g[k] for g in self.segments]) for k in INSTANCE_FIELDS}
        )


class Runner:
    """What happens around a placement: kills, requeues and the queue of continuations."""

    def __init__(self, cfg: SimConfig, jobs: Jobs, failures: list[Failure], out: Output,
                 rng: np.random.Generator, horizon: int):
        self.cfg, self.jobs, self.failures, self.out = cfg, jobs, failures, out
        self.rng, self.horizon = rng, horizon
        self.pending: list[tuple[int, int, Request]] = []
        self.seq = 0
        self.last_idx = -1  # output index of the instance finish() recorded last

    def finish(self, r: Request, start: int, where, killer: int) -> int:
        """Record the instance; returns the time its nodes are free (killed: the kill)."""
        if killer < 0:
            end = start + r.elapsed
            idx = self.last_idx = self.out.add(r, start, end, where, r.state, r.exit_code)
            if r.state == S["REQUEUED"]:
                self.requeue(r, idx, start, end)
            return end
        end, state, exit_code, again = self.killed(r, start, killer)
        idx = self.last_idx = self.out.add(r, start, end, where, state, exit_code)
        if again:
            self.requeue(r, idx, start, end, killer, keep_plan=True)
        return end

    def killed(self, r: Request, start: int, killer: int) -> tuple[int, int, int, bool]:
        """How a failure ends the instance: (end, state, exit code, whether it requeues)."""
        cfg, rng = self.cfg, self.rng
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
        f.jobs.append(int(self.jobs.job_id[r.job]))
        return end, state, exit_code, again

    def requeue(self, r: Request, idx: int, start: int, end: int, cause: int = -1,
                keep_plan: bool = False) -> None:
        """The next instance: same JobID, the work since the last checkpoint (hourly, Sec. III)
        lost, eligible after Slurm's requeue hold (credential lifetime + 1 s). After the job's own
        planned requeue it runs the rest of the job's work and completes; after a kill or a
        preemption (`keep_plan`) it runs the rest of what this instance was going to run and
        ends as it would have (a program that was going to crash still crashes), so failures
        do not turn early-ending jobs into full-length ones."""
        if r.generation + 1 >= MAX_ROUNDS or end + 121 >= self.horizon:
            return
        ran = end - start
        kept = max(0, ran - min(ran, HOUR // 2))
        done = r.work_before + kept
        if keep_plan:
            remaining, state, exit_code = max(60, r.elapsed - kept), r.state, r.exit_code
            if state == S["PREEMPTED"]:  # the preemption its plan had in store came early
                state, exit_code = S["COMPLETED"], E["0:0"]
        else:
            remaining = max(300, int(self.jobs.runtime[r.job]) - done)
            state, exit_code = S["COMPLETED"], E["0:0"]
        nxt = Request(r.job, end, end + 121, remaining, state, exit_code, idx, done,
                      r.generation + 1, cause)
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


def run_lanes(run: Runner, inst: Instances, sel: np.ndarray, lane_nodes: list[int],
              node_failures: dict) -> None:
    """One lane size: FCFS over its lanes, jobs waiting out repairs of their lane's node.

    The first instances (`sel`, eligible order) fill a reserved block of output rows; a lane
    remembers the time of the next failure on its node, so a job that ends before it costs a
    heap pop and push. Repairs, kills and continuations take the slow path."""
    out = run.out
    n = len(sel)
    seg = {k: getattr(inst, k)[sel] for k in INSTANCE_FIELDS}
    seg["nnodes"] = np.ones(n, dtype=np.int64)
    seg["parent"] = np.full(n, -1, dtype=np.int64)
    seg["work_before"] = np.zeros(n, dtype=np.int64)
    seg["nodeset"] = np.full(n, -1, dtype=np.int64)
    base = out.block(seg)
    elig = seg["eligible"].tolist()
    dur = (inst.end[sel] - inst.start[sel]).tolist()
    states = seg["state"].tolist()
    starts, ends, nodes = [0] * n, [0] * n, [0] * n
    fixed: list[tuple[int, int, int]] = []  # (row, state, exit code) of the killed
    never = int(INF)
    requeued = S["REQUEUED"]
    nxt = [node_failures[x][0][0] if x in node_failures else never for x in lane_nodes]
    free = [(0, k) for k in range(len(lane_nodes))]
    heapq.heapify(free)
    pending = run.pending
    pop, push = heapq.heappop, heapq.heappush

    def slot(lane: int, t: int, d: int) -> tuple[int, int, int]:
        """(start, killer or -1, when the lane is free) for d seconds at or after t."""
        ft, fe, fi = node_failures[lane_nodes[lane]]
        i = bisect.bisect_right(ft, t) - 1
        while i >= 0 and fe[i] > t:  # out for repair: wait for it
            t = fe[i] + 60
            i = bisect.bisect_right(ft, t) - 1
        j = i + 1
        if j < len(ft) and ft[j] < t + d:
            nxt[lane] = ft[j + 1] if j + 1 < len(ft) else never
            return t, fi[j], fe[j]
        nxt[lane] = ft[j] if j < len(ft) else never
        return t, -1, t + d

    def continuation(r: Request) -> None:
        free_t, lane = pop(free)
        t = max(r.eligible, free_t)
        if t + r.elapsed <= nxt[lane]:
            push(free, (run.finish(r, t, lane_nodes[lane], -1), lane))
            return
        t, killer, until = slot(lane, t, r.elapsed)
        end = run.finish(r, t, lane_nodes[lane], killer)
        push(free, (until if killer >= 0 else end, lane))

    for k in range(n):
        e = elig[k]
        while pending and pending[0][0] <= e:
            continuation(pop(pending)[2])
        free_t, lane = pop(free)
        t = e if e > free_t else free_t
        d = dur[k]
        end = t + d
        if end > nxt[lane]:
            t, killer, until = slot(lane, t, d)
            end = t + d
            if killer >= 0:
                r = Request(int(seg["job"][k]), int(seg["submit"][k]), e, d, states[k],
                            int(seg["exit_code"][k]), -1, 0, 0)
                end, state, exit_code, again = run.killed(r, t, killer)
                fixed.append((k, state, exit_code))
                if again:
                    run.requeue(r, base + k, t, end, killer, keep_plan=True)
                starts[k], ends[k], nodes[k] = t, end, lane_nodes[lane]
                push(free, (until, lane))
                continue
        starts[k], ends[k], nodes[k] = t, end, lane_nodes[lane]
        push(free, (end, lane))
        if states[k] == requeued:
            r = Request(int(seg["job"][k]), int(seg["submit"][k]), e, d, states[k],
                        int(seg["exit_code"][k]), -1, 0, 0)
            run.requeue(r, base + k, t, end)
    while pending:
        continuation(pop(pending)[2])
    seg["start"] = np.asarray(starts, dtype=np.int64)
    seg["end"] = np.asarray(ends, dtype=np.int64)
    seg["first"] = np.asarray(nodes, dtype=np.int64)
    for k, state, exit_code in fixed:
        seg["state"][k], seg["exit_code"][k] = state, exit_code


def _first(values: np.ndarray, w: int, cand: np.ndarray | None = None) -> np.ndarray:
    """The w candidates (indices into values; default all) with the smallest values, ties to
    the lower index, sorted."""
    v = values if cand is None else values[cand]
    kth = np.partition(v, w - 1)[w - 1]
    below = np.flatnonzero(v < kth)
    at = np.flatnonzero(v == kth)[: w - len(below)]
    pick = np.sort(np.concatenate([below, at]))
    return pick if cand is None else cand[pick]


class BigRegion:
    """The big-job region's nodes: when each is free (the end of the last instance placed on it,
    or of a repair it was caught in), that instance, one idle gap before it, and the region's
    outages by (node, time)."""

    def __init__(self, n: int, failures: list[Failure]):
        self.n = n
        self.free = np.zeros(n, dtype=np.int64)
        self.last = np.full(n, -1, dtype=np.int64)  # output index of the last instance placed
        self.last_start = np.full(n, INF, dtype=np.int64)
        self.last_end = np.full(n, -1, dtype=np.int64)
        self.victim_ok = np.zeros(n, dtype=bool)  # that instance may be preempted
        # One idle gap per node before its last booking: [hs, he) (empty: he = -1).
        self.hs = np.zeros(n, dtype=np.int64)
        self.he = np.full(n, -1, dtype=np.int64)
        ks = [k for k, f in enumerate(failures) if f.node < n]
        fn = np.asarray([failures[k].node for k in ks] + [n + 1], dtype=np.int64)
        ft = np.asarray([failures[k].time for k in ks] + [0], dtype=np.int64)
        fr = np.asarray([failures[k].repair_end for k in ks] + [0], dtype=np.int64)
        fk = np.asarray(ks + [-1], dtype=np.int64)
        order = np.lexsort((ft, fn))  # the sentinel (node n + 1) sorts last
        self.fn, self.ft, self.fr, self.fk = fn[order], ft[order], fr[order], fk[order]
        self.key = (self.fn << SHIFT) + self.ft
        by_time = np.argsort(self.ft[:-1], kind="stable")
        self.t_time = self.ft[:-1][by_time].tolist()
        self.t_node = self.fn[:-1][by_time].tolist()
        self.t_repair = self.fr[:-1][by_time].tolist()
        self.applied = 0

    def apply_outages(self, upto: int) -> None:
        """Nodes that failed by `upto` are busy until their repair ends."""
        i, free = self.applied, self.free
        tt, tn, tr = self.t_time, self.t_node, self.t_repair
        while i < len(tt) and tt[i] <= upto:
            if free[tn[i]] < tr[i]:
                free[tn[i]] = tr[i]
            i += 1
        self.applied = i

    def settle(self, nodes: np.ndarray, t: int) -> tuple[int, np.ndarray]:
        """The earliest start >= t on `nodes` outside every outage, and per node the index of
        its last outage beginning at or before that start."""
        base = nodes << SHIFT
        while True:
            i = np.searchsorted(self.key, base + t, side="right") - 1
            inside = (self.fn[i] == nodes) & (self.fr[i] > t)
            if not inside.any():
                return t, i
            t = int(self.fr[i][inside].max())

    def place(self, w: int, e: int) -> tuple[np.ndarray, int, np.ndarray]:
        """(nodes, start, outage indices): the w nodes free first (FCFS: nothing goes into
        earlier gaps), a node whose outage the start would fall in passed over."""
        free = self.free
        while True:
            nodes = _first(free, w)
            t = max(e, int(free[nodes].max()))
            i = np.searchsorted(self.key, (nodes << SHIFT) + t, side="right") - 1
            inside = (self.fn[i] == nodes) & (self.fr[i] > t)
            if not inside.any():
                return nodes, t, i
            if free is self.free:
                free = self.free.copy()
            free[nodes[inside]] = self.fr[i][inside]

    def backfill(self, w: int, e: int, d: int, before: int) -> tuple[np.ndarray | None, int,
                                                                      np.ndarray]:
        """(nodes, start, outage indices) of w nodes whose idle gaps all hold [start, start + d)
        for a start before `before` (the w-th earliest fitting start; the tightest gaps);
        nodes None if there are none."""
        s = np.maximum(self.hs, e)
        fits = np.flatnonzero(s + d <= self.he)
        if len(fits) < w:
            return None, 0, fits
        t = int(np.partition(s[fits], w - 1)[w - 1])
        if t >= before:
            return None, 0, fits
        cand = fits[s[fits] <= t]
        cand = cand[self.he[cand] >= t + d]
        if len(cand) < w:
            return None, 0, fits
        nodes = _first(self.he, w, cand)
        st, i = self.settle(nodes, t)
        if st != t:
            return None, 0, fits
        return nodes, t, i

    def preemptible(self, w: int, e: int, min_run: int) -> np.ndarray | None:
        """w nodes, each free at e or running a preemptible instance that started by
        e - min_run and is the last booked there (as few of those as can be); None if there
        are not enough, or if w nodes are free at e anyway."""
        free = self.free <= e
        busy = (self.victim_ok & (self.free == self.last_end) & (self.last_end > e)
                & (self.last_start <= e - min_run))
        nfree = int(free.sum())
        if nfree >= w or nfree + int(busy.sum()) < w:
            return None
        rank = np.where(free, 0, np.where(busy, 1, 2))
        return _first(rank, w)

    def book(self, nodes: np.ndarray, t: int, d: int, i: np.ndarray) -> tuple[int, np.ndarray]:
        """The failure (index, or -1) that strikes the nodes first during [t, t + d), and per
        node the index of its next outage after t."""
        j = i + 1
        hit = (self.fn[j] == nodes) & (self.ft[j] < t + d)
        if not hit.any():
            return -1, j
        m = int(np.argmin(np.where(hit, self.ft[j], INF)))
        return int(self.fk[j[m]]), j

    def _freed(self, nodes: np.ndarray, end: int, j: np.ndarray) -> np.ndarray:
        struck = (self.fn[j] == nodes) & (self.ft[j] < end)
        return np.where(struck, np.maximum(end, self.fr[j]), end)

    def filled(self, nodes: np.ndarray, t: int, end: int, j: np.ndarray) -> None:
        """An instance ran in the nodes' gaps from t to end: each node keeps the longer side."""
        free = self._freed(nodes, end, j)
        hs, he = self.hs[nodes], self.he[nodes]
        right = he - free >= t - hs
        self.hs[nodes] = np.where(right, free, hs)
        self.he[nodes] = np.where(right, he, t)

    def taken(self, nodes: np.ndarray, t: int, end: int, j: np.ndarray, idx: int,
              victim: bool) -> None:
        """Instance `idx` ran on the nodes from t to end; a node that failed meanwhile is free
        when its repair ends. The idle time before t becomes the node's gap."""
        free0 = self.free[nodes]
        gap = free0 < t
        self.hs[nodes] = np.where(gap, free0, self.hs[nodes])
        self.he[nodes] = np.where(gap, t, self.he[nodes])
        end_at = self._freed(nodes, end, j)
        self.free[nodes] = end_at
        self.last[nodes] = idx
        self.last_start[nodes] = t
        self.last_end[nodes] = np.where(end_at == end, end, -1)
        self.victim_ok[nodes] = victim


def run_big(run: Runner, initial: list[Request], n_nodes: int, failures: list[Failure]) -> int:
    """FCFS over the node pool with backfill into idle gaps; a failure-requeued big job preempts the
    jobs in its way. Returns the number of instances preempted."""
    region = BigRegion(n_nodes, failures)
    cfg, jobs, out = run.cfg, run.jobs, run.out
    gpn = cfg.gpus_per_node
    min_run = int(cfg.preempt_min_runtime_h * HOUR)
    victims: dict[int, tuple[Request, np.ndarray]] = {}
    preempted = 0
    for r in run.requests(initial):
        e = r.eligible
        region.apply_outages(e)
        gpus = int(jobs.gpus[r.job])
        w = min(n_nodes, 1 << max(0, (-(-gpus // gpn) - 1).bit_length()))  # a power of two
        priority = r.cause >= 0 and gpus >= cfg.requeue_min_gpus
        nodes = region.preemptible(w, e, min_run) if priority else None
        if nodes is not None:
            t, i = region.settle(nodes, e)
            if t != e:
                nodes = None
        if nodes is not None:
            busy = nodes[region.free[nodes] > e]
            for v in np.unique(region.last[busy]).tolist():
                vr, vnodes = victims.pop(v)
                mine = vnodes[region.last[vnodes] == v]
                region.free[mine] = e
                region.victim_ok[mine] = False
                region.last[mine] = -1
                out.set(v, "end", e)
                out.set(v, "state", S["PREEMPTED"])
                out.set(v, "exit_code", E["0:0"])
                run.requeue(vr, v, out.get(v, "start"), e, keep_plan=True)
                failures[r.cause].preempted.append(int(jobs.job_id[vr.job]))
                preempted += 1
        else:
            nodes, t, i = region.place(w, e)
            if t > e:
                bn, bt, bi = region.backfill(w, e, r.elapsed, t)
                if bn is not None:
                    killer, j = region.book(bn, bt, r.elapsed, bi)
                    end = run.finish(r, bt, bn, killer)
                    region.filled(bn, bt, end, j)
                    continue
        killer, j = region.book(nodes, t, r.elapsed, i)
        end = run.finish(r, t, nodes, killer)
        idx = run.last_idx
        victim = killer < 0 and r.state != S["REQUEUED"] and not priority
        if victim:
            victims[idx] = (r, nodes)
        region.taken(nodes, t, end, j, idx, victim)
    return preempted


def schedule(cfg: SimConfig, jobs: Jobs, inst: Instances, big_hi: int, n_nodes: int,
             failures: list[Failure], rng: np.random.Generator, horizon: int
             ) -> tuple[Instances, dict]:
    """Place every planned first instance (and the continuations that follow) on the fleet."""
    out = Output()
    gpus = jobs.gpus[inst.job]
    gpn = cfg.gpus_per_node
    order = np.argsort(inst.eligible, kind="stable")
    stats: dict = {"preempted": 0}
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
        lut = np.zeros(gpn + 1, dtype=np.int64)
        for g, pool in pool_of.items():
            lut[g] = pool
        small_pool = lut[gpus[small]]
        for pool in sizes:
            sel = small[small_pool == pool]
            if len(sel):
                run = Runner(cfg, jobs, failures, out, rng, horizon)
                run_lanes(run, inst, sel, pools[pool], node_failures)
        stats["lanes"] = {g: len(v) for g, v in pools.items()}
    big = order[gpus[order] > gpn]
    if len(big):
        run = Runner(cfg, jobs, failures, out, rng, horizon)
        stats["preempted"] = run_big(run, _initial(inst, big), big_hi, failures)
    stats["nodesets"] = out.nodesets
    return out.instances(), stats
