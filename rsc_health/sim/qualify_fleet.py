"""What qualification buys a fleet's big jobs: a node-level model of failures, bad repairs and
lemons, run under three policies (nothing, lemon drains, qualification + lemon drains), with jobs
of 512+ GPUs sampled over it (issue 24, item 5; benchmarks/bench_fleet_qualify.py, the demo).

The model, and where each part comes from:

* **Visible failures** (a health check fires, the node is drained and repaired): Poisson per
  node at the background rate r0, a lemon at `lemon_rf_multiplier` x r0 (the simulator's
  [sim] values). r0 is set so the fleet's visible rate is the paper's r_f (RSC-1: 6.5 per
  1000 node-days). A repair takes the simulator's log-normal repair time.
* **Silent defects** (the RSC paper's lemons, IV-A: "servers that cause repeating job failures
  but cannot be identified by existing mechanisms like health checks and repair workflows"):
  a defective node stays in service and kills the big job it is in at `silent_per_day`.
  Two kinds: **lemons** (`lemon_share` of the nodes, the paper's 1.2% of RSC-1; repairs do not
  fix them), and **bad repairs** (Aegis: "wiring mistakes caused by repairs"; its three-strikes
  backstop): each repair leaves the node defective with probability `bad_repair_share`
  (an assumption, swept in the benchmark), and until it is fixed it fails like a lemon, both
  visibly (the multiplier) and silently. Healthy nodes' rate is then fitted so the whole
  fleet's visible rate is still the paper's r_f (`fit_background`). Without rsc-health a bad
  repair is re-opened by a person after `human_fix_days` on average (users report the
  failures); a lemon is not.
* **Lemon drains** ([lemon] window_days 28, out_count_history 3): a node with
  `lemon_count` job failures attributed to it (visible or silent) inside `lemon_window_days` is
  drained at the next nightly run and goes to a deep repair (replacement) that fixes it.
* **Qualification** (policy "qualify", on top of lemon drains): after every repair the node
  spends `qualify_hours` in the root-only reservation. A defective node fails it when its
  defect is testable (`testable_share`: the paper's "more than 85% of identified lemon nodes
  failed one of the tests") and the product's peer judge catches the degradation it causes
  (a size drawn log-uniform in `degradation`, judged by rsc_health.qualify.judge on the real
  per-device spreads of tests/fixtures; see `catch_table`). A failed node is repaired again
  (the failed test names the part), then qualified again. A healthy node fails at the judge's
  measured false-fail rate and pays a wasted repair. Three strikes ([qualify] strikes within
  strikes_window_days) after a pass send the node to the deep repair.
* **Jobs** of 512+ GPUs are observers: sizes, weights and log-normal runtimes from [sim]
  (the 512-4096 GPU classes), scaled by `exposure`; each takes nodes uniformly among those in
  service at its start and fails when any of them has a visible failure or a silent kill before
  it ends. Not modelled: the scheduler handing freshly returned nodes to the next job (which
  makes defective nodes worse than modelled), degraded-but-working nodes (fail-slow), requeues.

Nothing here is fitted to qualification's result: `calibrate` fits `exposure` and
`silent_per_day` to the paper's two measured points (14% of 512+ GPU jobs failing before lemon
detection, 4% after, IV-A) under the policies "none" and "lemon"; the "qualify" figure is then
what the model predicts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from rsc_health.sim.config import SimConfig

DAY = 86400.0
POLICIES = ("none", "lemon", "qualify")
HEALTHY, BAD, LEMON = 0, 1, 2
# The paper's two measured points (IV-A): 512+ GPU job failure rate before and after lemon
# detection.
PAPER_BEFORE, PAPER_AFTER_LEMON = 0.14, 0.04
FIXTURES = Path(__file__).resolve().parents[2] / "tests" / "fixtures"
# The real spreads a defect's metric is judged against: GEMM, HBM, collective-like IB bandwidth.
SPREADS = ("bf16 GEMM run median x8 (H200)", "HBM copy run median x8 (H200)",
           "ib_write 8 MiB per HCA (NDv4 fleet)", "gpu-burn per GPU (8x A100)")


@dataclass
class FleetModel:
    nodes: int = 1024
    days: float = 240.0
    warmup_days: float = 60.0  # jobs start after it: bad repairs have reached their steady share
    seed: int = 0
    jobs: int = 12000
    rf_per_1000_node_days: float = 6.5
    lemon_share: float = 0.012
    bad_repair_share: float = 0.10
    # Fitted by `calibrate` (benchmarks/bench_fleet_qualify.py prints the fit of every run;
    # these are its figures for the defaults above, seed 0, 12,000 jobs): the demo uses them.
    silent_per_day: float = 1.72
    human_fix_days: float = 14.0
    deep_repair_days: float = 5.0
    qualify_hours: float = 0.5
    testable_share: float = 0.85
    degradation: tuple[float, float] = (0.01, 0.30)
    lemon_count: int = 3
    lemon_window_days: float = 28.0
    strikes: int = 3
    strikes_window_days: float = 30.0
    # Policy "qualify" also qualifies a node in service once this many job failures are
    # attributed to it inside lemon_window_days, short of a lemon drain (a pre-lemon suspect:
    # undrained, at the next nightly run, qualify_hours out of service; a fail sends it to
    # repair). 0 = off: qualification only after repairs (the product's flow today).
    qualify_after_kills: int = 0
    exposure: float = 0.0582
    # Visible failures per 1000 node-days of a healthy node; None: rf as if only lemons were
    # above it (`fit_background` sets it so the "none" fleet's visible rate is rf).
    background_per_1000: float | None = 5.66
    sim: SimConfig = field(default_factory=SimConfig)

    @property
    def r0(self) -> float:
        """Background visible failures per node-day."""
        if self.background_per_1000 is not None:
            return self.background_per_1000 / 1000
        m = self.sim.lemon_rf_multiplier
        return self.rf_per_1000_node_days / 1000 / (1 + self.lemon_share * (m - 1))


@dataclass
class Catch:
    """What the product's judge does to a defect: P(fail | defective), P(fail | healthy)."""

    defective: float
    healthy: float
    by_degradation: dict[float, float]


def catch_table(model: FleetModel, *, nodes: int = 300, seed: int = 11) -> Catch:
    """Run rsc_health.qualify.judge (via the lab's stand-in fleet) on the real spreads: the
    recall at each degradation size, averaged over the metrics, and the healthy false-fail."""
    from rsc_health.qualify.judge import Rules
    from rsc_health.sim.qualify_tools import real_spreads, simulate

    spreads = real_spreads(FIXTURES)
    lo, hi = model.degradation
    grid = np.geomspace(lo, hi, 7)
    rules = Rules()
    recall: dict[float, float] = {}
    false_fail = []
    for d in grid.tolist():
        rs = []
        for name in SPREADS:
            ff, r = simulate(spreads[name], nodes=nodes, degrade=d, seed=seed, rules=rules)
            rs.append(r)
            false_fail.append(ff)
        recall[round(d, 4)] = float(np.mean(rs))
    # log-uniform degradation: the grid is evenly spaced in log, so a plain mean (trapezoid)
    vals = list(recall.values())
    mean_recall = float((sum(vals) - (vals[0] + vals[-1]) / 2) / (len(vals) - 1))
    return Catch(model.testable_share * mean_recall, float(np.mean(false_fail)), recall)


@dataclass
class Timeline:
    kills: np.ndarray  # (node << 40) + second: every event that kills a running big job
    out_lo: list[np.ndarray]  # per node: out-of-service intervals (sorted)
    out_hi: list[np.ndarray]
    out_seconds: float
    visible: int
    silent: int
    lemon_drains: int
    qualify_fails: int
    qualify_false_fails: int
    strikes: int


class _Node:
    """One node's history under a policy: its state, its clocks, its out-of-service intervals."""

    def __init__(self, model: FleetModel, policy: str, catch: Catch, lemon: bool, seed: int,
                 stats: dict[str, int]):
        self.m, self.catch, self.stats = model, catch, stats
        # Failures and repairs draw from one stream, qualification's verdicts from another,
        # so a node's first failures are the same draws under every policy.
        self.g, self.gq = (np.random.default_rng(x) for x in np.random.SeedSequence(seed).spawn(2))
        self.qualify = policy == "qualify"
        self.lemon_drains = model.lemon_count > 0 and policy in ("lemon", "qualify")
        self.state = LEMON if lemon else HEALTHY
        self.recent: list[float] = []  # attributed job failures, for the lemon rule
        self.since_pass: list[float] = []  # failures since the last qualification pass
        self.passed = False
        self.los: list[float] = []
        self.his: list[float] = []
        self.kills: list[float] = []

    def repair_s(self) -> float:
        sim = self.m.sim
        return float(math.exp(self.g.normal(math.log(sim.repair_median_h * 3600),
                                            sim.repair_sigma)))

    def after_repair(self, t: float) -> float:
        """The node comes back from a repair at t: maybe badly repaired, then qualified."""
        m, g = self.m, self.g
        if self.state == BAD:
            self.state = HEALTHY
        if self.state == HEALTHY and g.random() < m.bad_repair_share:
            self.state = BAD
        while self.qualify:
            t += m.qualify_hours * 3600
            defective = self.state != HEALTHY
            if self.gq.random() < (self.catch.defective if defective else self.catch.healthy):
                self.stats["qualify_fails" if defective else "qualify_false_fails"] += 1
                t += self.repair_s()  # the failed test names the part: it is fixed
                self.state = BAD if g.random() < m.bad_repair_share else HEALTHY
                continue
            self.passed = True
            self.since_pass.clear()
            break
        return t

    def suspect_qualify(self, t: float) -> float:
        """Qualified in service (qualify_after_kills): a fail is repaired like a fail after a
        repair (the failed test names the part), a pass puts it back as it was."""
        t += self.m.qualify_hours * 3600
        defective = self.state != HEALTHY
        if self.gq.random() < (self.catch.defective if defective else self.catch.healthy):
            self.stats["qualify_fails" if defective else "qualify_false_fails"] += 1
            self.state = HEALTHY
            self.recent.clear()
            return self.after_repair(t + self.repair_s())
        self.passed = True
        self.since_pass.clear()
        return t

    def deep(self, t: float) -> float:
        """A lemon drain or three strikes: the node is replaced or rebuilt, then qualified."""
        t += float(self.g.exponential(self.m.deep_repair_days * DAY))
        self.recent.clear()
        self.since_pass.clear()
        self.passed = False
        self.state = HEALTHY
        return self.after_repair(t)

    def out(self, start: float, back: float) -> None:
        if back > start:
            self.los.append(start)
            self.his.append(back)

    def run(self, horizon: float) -> None:
        m, g = self.m, self.g
        r0 = m.r0 / DAY
        t = 0.0
        while True:
            vis = r0 * (m.sim.lemon_rf_multiplier if self.state != HEALTHY else 1.0)
            sil = m.silent_per_day / DAY if self.state != HEALTHY else 0.0
            fix = 1 / (m.human_fix_days * DAY) if self.state == BAD else 0.0
            rate = vis + sil + fix
            t += float(g.exponential(1 / rate))
            if t >= horizon:
                return
            u = g.random() * rate
            if u >= vis + sil:  # a person re-opens the bad repair
                back = self.after_repair(t + self.repair_s())
                self.out(t, back)
                t = back
                continue
            visible = u < vis
            self.kills.append(t)
            self.stats["visible" if visible else "silent"] += 1
            self.recent[:] = [x for x in self.recent if x >= t - m.lemon_window_days * DAY]
            self.recent.append(t)
            self.since_pass.append(t)
            start = back = t
            if visible:
                back = self.after_repair(t + self.repair_s())
            struck = self.qualify and self.passed and m.strikes > 0 and sum(
                x >= t - m.strikes_window_days * DAY for x in self.since_pass) >= m.strikes
            suspect = (self.qualify and not visible and m.qualify_after_kills > 0
                       and len(self.recent) >= m.qualify_after_kills)
            if struck or (self.lemon_drains and len(self.recent) >= m.lemon_count):
                self.stats["strikes" if struck else "lemon_drains"] += 1
                nightly = math.ceil(t / DAY) * DAY  # the nightly verdict drains it
                if not visible:
                    start = nightly
                back = self.deep(max(back, nightly))
            elif suspect:
                start = math.ceil(t / DAY) * DAY
                back = self.suspect_qualify(start)
            self.out(start, back)
            t = back


def timeline(model: FleetModel, policy: str, catch: Catch) -> Timeline:
    """Every node's history under `policy`; the same seed draws the same lemons and the same
    first failures under every policy."""
    if policy not in POLICIES:
        raise ValueError(f"policy {policy!r}: one of {', '.join(POLICIES)}")
    horizon = model.days * DAY
    rng = np.random.default_rng(model.seed)
    n = model.nodes
    lemons = set(rng.choice(n, size=int(round(model.lemon_share * n)), replace=False).tolist())
    node_seeds = rng.integers(0, 2**63, size=n)
    stats = dict(visible=0, silent=0, lemon_drains=0, qualify_fails=0, qualify_false_fails=0,
                 strikes=0)
    kills: list[int] = []
    out_lo: list[np.ndarray] = []
    out_hi: list[np.ndarray] = []
    out_total = 0.0
    for node in range(n):
        nd = _Node(model, policy, catch, node in lemons, int(node_seeds[node]), stats)
        nd.run(horizon)
        kills.extend((node << 40) + int(x) for x in nd.kills)
        lo = np.minimum(np.asarray(nd.los, dtype=float), horizon)
        hi = np.minimum(np.asarray(nd.his, dtype=float), horizon)
        out_lo.append(lo)
        out_hi.append(hi)
        out_total += float(np.sum(hi - lo))
    return Timeline(np.sort(np.asarray(kills, dtype=np.int64)), out_lo, out_hi, out_total,
                    **stats)



@dataclass
class JobDraws:
    """The big jobs, drawn once and replayed under every policy (common random numbers)."""

    start: np.ndarray  # seconds
    base_runtime: np.ndarray  # seconds at exposure 1
    nodes: np.ndarray  # nodes per job
    order_seed: int  # each job's random node order (taken in batches: see `placement`)


def draw_jobs(model: FleetModel) -> JobDraws:
    sim = model.sim
    rng = np.random.default_rng(model.seed + 1_000_003)
    gpus = np.asarray(sim.size_gpus)
    big = gpus >= 512
    w = np.asarray(sim.size_weights, dtype=float)[big]
    med = np.asarray(sim.runtime_median_h, dtype=float)[big]
    need = np.minimum(gpus[big] // sim.gpus_per_node, model.nodes // 2)
    k = rng.choice(len(w), size=model.jobs, p=w / w.sum())
    runtime = np.exp(rng.normal(np.log(med[k] * 3600), sim.runtime_sigma))
    start = rng.uniform(model.warmup_days * DAY, model.days * DAY, size=model.jobs)
    return JobDraws(start, runtime, need[k], int(rng.integers(2**63)))


def placement(model: FleetModel, tl: Timeline, jobs: JobDraws, batch: int = 512
              ) -> tuple[np.ndarray, np.ndarray]:
    """(job, node) pairs: each job takes, in its own random order, the first nodes in service
    at its start (fewer when fewer are in service). Vectorised over batches of jobs (a jobs x
    nodes matrix each)."""
    n = model.nodes
    nodes = np.arange(n, dtype=np.int64)
    counts = [len(lo) for lo in tl.out_lo]
    owner = np.repeat(nodes, counts)
    lo = np.concatenate(tl.out_lo) if sum(counts) else np.zeros(0)
    hi = np.concatenate(tl.out_hi) if sum(counts) else np.zeros(0)
    keys = (owner << 40) + lo.astype(np.int64)
    rng = np.random.default_rng(jobs.order_seed)
    pj, pn = [], []
    for first in range(0, len(jobs.start), batch):
        t = jobs.start[first:first + batch]
        b = len(t)
        q = (nodes[None, :] << 40) + t.astype(np.int64)[:, None]
        i = np.searchsorted(keys, q.ravel(), side="right").reshape(b, n) - 1
        ic = np.maximum(i, 0)
        out = (i >= 0) & (owner[ic] == nodes[None, :]) & (hi[ic] > t[:, None]) \
            if len(keys) else np.zeros((b, n), dtype=bool)
        # A random key per node, out-of-service ones last: a job takes its w smallest.
        r = rng.random((b, n)) + out
        need = jobs.nodes[first:first + b]
        for w in np.unique(need).tolist():
            rows = np.flatnonzero(need == w)
            w = min(int(w), n)
            part = r[rows]
            pick = np.argpartition(part, w - 1, axis=1)[:, :w] if w < n else \
                np.broadcast_to(nodes, (len(rows), n))
            ok = np.take_along_axis(part, pick, axis=1) < 1.0  # in service
            jj = np.broadcast_to((rows + first)[:, None], pick.shape)
            pj.append(jj[ok])
            pn.append(pick[ok])
    return np.concatenate(pj).astype(np.int64), np.concatenate(pn).astype(np.int64)


def job_failures(model: FleetModel, tl: Timeline, jobs: JobDraws, exposure: float,
                 placed: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    """Per job: did any of its nodes see a kill while it ran (runtime x exposure, capped at
    [sim] time_limit_h and the horizon)."""
    pj, pn = placed if placed is not None else placement(model, tl, jobs)
    limit = model.sim.time_limit_h * 3600
    d = np.minimum(np.minimum(np.maximum(60.0, jobs.base_runtime * exposure), limit),
                   model.days * DAY - jobs.start)
    t0 = jobs.start.astype(np.int64)[pj]
    t1 = (jobs.start + d).astype(np.int64)[pj]
    key = pn << 40
    hits = (np.searchsorted(tl.kills, key + t1, side="left")
            - np.searchsorted(tl.kills, key + t0, side="left")) > 0
    return np.bincount(pj, weights=hits, minlength=len(jobs.start)) > 0


@dataclass
class PolicyResult:
    policy: str
    big_job_failure: float
    big_jobs_failed: int
    big_jobs: int
    schedulable: float  # share of node-time in service over the whole horizon
    rf_visible_per_1000: float
    silent_kills: int
    lemon_drains: int
    qualify_fails: int
    qualify_false_fails: int
    strikes: int


def run_policy(model: FleetModel, policy: str, catch: Catch, jobs: JobDraws | None = None,
               tl: Timeline | None = None) -> PolicyResult:
    tl = tl or timeline(model, policy, catch)
    jobs = jobs or draw_jobs(model)
    failed = job_failures(model, tl, jobs, model.exposure)
    node_s = model.nodes * model.days * DAY
    up_days = (node_s - tl.out_seconds) / DAY
    return PolicyResult(
        policy, float(failed.mean()), int(failed.sum()), len(failed),
        1 - tl.out_seconds / node_s, tl.visible / up_days * 1000, tl.silent, tl.lemon_drains,
        tl.qualify_fails, tl.qualify_false_fails, tl.strikes)


def fit_background(model: FleetModel, catch: Catch) -> FleetModel:
    """The healthy nodes' visible rate that gives the fleet (lemons and bad repairs included,
    under "none") the paper's r_f: a fixed point, three rounds."""
    m = model
    for _ in range(3):
        tl = timeline(m, "none", catch)
        up_days = (m.nodes * m.days * DAY - tl.out_seconds) / DAY
        measured = tl.visible / up_days * 1000
        m = replace(m, background_per_1000=m.r0 * 1000 * m.rf_per_1000_node_days / measured)
    return m


def _bisect(fn, lo: float, hi: float, target: float, steps: int = 14) -> float:
    """x in [lo, hi] (log scale) with fn(x) ~ target; fn increasing."""
    for _ in range(steps):
        mid = math.sqrt(lo * hi)
        if fn(mid) < target:
            lo = mid
        else:
            hi = mid
    return math.sqrt(lo * hi)


@dataclass
class Calibration:
    model: FleetModel  # with background, exposure and silent rate fitted
    none: float
    lemon: float


def calibrate(model: FleetModel, catch: Catch, *, before: float = PAPER_BEFORE,
              after: float = PAPER_AFTER_LEMON, grid: int = 7) -> Calibration:
    """Fit `exposure` and `silent_per_day` so "none" gives `before` and "lemon" gives `after`.
    For each silent rate on a grid the exposure is bisected to `before`; the silent rate whose
    lemon-drain result is nearest `after` (interpolated in log) is then refined once."""
    model = fit_background(model, catch)
    jobs = draw_jobs(model)

    def at(silent: float) -> tuple[float, float]:
        m = replace(model, silent_per_day=silent)
        none_tl = timeline(m, "none", catch)
        placed = placement(m, none_tl, jobs)
        exp = _bisect(lambda x: job_failures(m, none_tl, jobs, x, placed).mean(), 1e-3, 10.0,
                      before)
        lemon = job_failures(m, timeline(m, "lemon", catch), jobs, exp).mean()
        return exp, float(lemon)

    rates = np.geomspace(0.05, 5.0, grid).tolist()
    points = [(s, *at(s)) for s in rates]
    best = min(points, key=lambda p: abs(p[2] - after))
    # Interpolate between the neighbours that bracket `after`, in log silent rate.
    for a, b in zip(points, points[1:], strict=False):
        if (a[2] - after) * (b[2] - after) <= 0 and a[2] != b[2]:
            f = (after - a[2]) / (b[2] - a[2])
            s = math.exp(math.log(a[0]) + f * (math.log(b[0]) - math.log(a[0])))
            exp, lemon = at(s)
            if abs(lemon - after) < abs(best[2] - after):
                best = (s, exp, lemon)
            break
    s, exp, lemon = best
    return Calibration(replace(model, exposure=exp, silent_per_day=s), before, lemon)


def compare(model: FleetModel, catch: Catch) -> dict[str, PolicyResult]:
    jobs = draw_jobs(model)
    return {p: run_policy(model, p, catch, jobs) for p in POLICIES}


def limits(model: FleetModel, catch: Catch) -> dict[str, float]:
    """What keeps policy "qualify" above the floor, on the same draws: `qualify` (as is);
    `perfect_test` (every defective node that reaches qualification fails it: what is left is
    nodes qualification never tests, or tests too late); `floor` (healthy nodes only)."""
    jobs = draw_jobs(model)
    perfect = replace(catch, defective=1.0)
    return {
        "qualify": run_policy(model, "qualify", catch, jobs).big_job_failure,
        "perfect_test": run_policy(model, "qualify", perfect, jobs).big_job_failure,
        "floor": floor(model, catch),
    }


def floor(model: FleetModel, catch: Catch) -> float:
    """The big-job failure rate from healthy nodes' own visible failures alone: what no policy
    that acts on defective nodes can go under."""
    m = replace(model, lemon_share=0.0, bad_repair_share=0.0)
    return run_policy(m, "none", catch).big_job_failure


__all__ = ["Catch", "Calibration", "FleetModel", "POLICIES", "PolicyResult", "calibrate",
           "catch_table", "compare", "demo_lines", "draw_jobs", "fit_background", "floor",
           "job_failures", "limits", "placement", "run_policy", "timeline"]


def demo_lines(seed: int = 0, *, nodes: int = 1024, jobs: int = 12000) -> list[str]:
    """The demo's two lines: big-job failures under the three policies and what
    qualification prevented, with the fitted defaults (about 2 s)."""
    model = FleetModel(nodes=nodes, jobs=jobs, seed=seed)
    res = compare(model, catch_table(model, nodes=100))
    none, lemon, qual = (res[p] for p in POLICIES)
    return [
        f"qualification (fleet model, {nodes} nodes, {jobs:,} jobs of 512+ GPUs): failed "
        f"{none.big_job_failure:.1%} with nothing, {lemon.big_job_failure:.1%} with lemon "
        f"drains, {qual.big_job_failure:.1%} with qualification + lemon drains; "
        f"{qual.schedulable:.1%} of node-time schedulable",
        f"  big-job failures prevented: {none.big_jobs_failed - qual.big_jobs_failed} of "
        f"{none.big_jobs_failed} ({lemon.big_jobs_failed - qual.big_jobs_failed} by "
        f"qualification beyond lemon drains; {qual.qualify_fails} bad repairs or lemons failed "
        f"qualification, {qual.qualify_false_fails} healthy nodes did)",
    ]
