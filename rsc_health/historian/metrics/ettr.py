"""Expected ETTR: the paper's closed forms (Eq. 1-3, Appendix A Eq. 8-11) and a Monte Carlo check.

Units: days throughout, because the paper states r_f in failures per node-day. The helpers
`minutes()` / `hours()` convert. ETTR = R / W with W = R + U + Q (productive, unproductive
scheduled, and queued time of one job run).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

MINUTES_PER_DAY = 1440.0
FIVE_MINUTES = 5.0 / MINUTES_PER_DAY  # the paper's default u0 and w_cp, in days


def minutes(m: float) -> float:
    """Minutes -> days."""
    return m / MINUTES_PER_DAY


def hours(h: float) -> float:
    """Hours -> days."""
    return h / 24.0


def daly_young_interval(n_nodes: float, r_f: float, w_cp: float) -> float:
    """Eq. (3)/(9): the Daly-Young optimal checkpoint interval sqrt(2 w_cp / (N r_f)), in days."""
    rate = n_nodes * r_f
    if rate <= 0:
        return math.inf
    return math.sqrt(2.0 * w_cp / rate)


def _share(value: float) -> float:
    """ETTR is a share of wall time: a closed form past where it holds is held to [0, 1]."""
    return min(1.0, max(0.0, value)) if value == value else value


@dataclass(frozen=True)
class EttrModel:
    """The paper's job-run model. Times in days; r_f in failures per node-day.

    dt_cp=None means the Daly-Young interval for this N, r_f and w_cp.
    """

    n_nodes: float
    r_f: float
    runtime: float = 30.0  # R, productive training time the run needs
    u0: float = minutes(5)  # restart overhead, paid at the start of every job instance
    w_cp: float = minutes(5)  # synchronous checkpoint write
    dt_cp: float | None = None
    queue: float = 0.0  # q, expected queue time after submission and after every interruption

    @property
    def interval(self) -> float:
        if self.dt_cp is not None:
            return self.dt_cp
        return daly_young_interval(self.n_nodes, self.r_f, self.w_cp)

    @property
    def mttf(self) -> float:
        """(N r_f)^-1, in days."""
        rate = self.n_nodes * self.r_f
        return math.inf if rate <= 0 else 1.0 / rate

    def closed_form_holds(self) -> bool:
        """Whether Eq. (1)/(2) describe this run: they assume lam (u0 + dt_cp/2) < 1, a restart
        and half an interval of lost work shorter than the MTTF. Past it the run mostly
        requeues and the closed forms go negative (a 256k-GPU run at the paper's r_f: -0.20),
        where ETTR = R / W is a share of wall time; the Monte Carlo still answers."""
        lam = self.n_nodes * self.r_f
        return lam <= 0 or lam * (self.u0 + self.interval / 2.0) < 1.0

    def expected(self) -> float:
        """Eq. (1) = Appendix A Eq. (8), the full form (a lower bound by Jensen's inequality),
        held to [0, 1] (see closed_form_holds)."""
        lam = self.n_nodes * self.r_f
        dt, w, u0, q, r = self.interval, self.w_cp, self.u0, self.queue, self.runtime
        ckpt = 0.0 if math.isinf(dt) else w / dt
        num = 1.0 - lam * (u0 + dt / 2.0) if lam > 0 else 1.0
        den = 1.0 + (u0 + q) / r + ckpt + lam * q * (1.0 + ckpt - dt / (2.0 * r))
        return _share(num / den)

    def expected_long_run(self) -> float:
        """Eq. (2) = Eq. (10): long-running high-priority jobs, q ~ 0, R >> u0 + dt_cp/2,
        held to [0, 1] (see closed_form_holds)."""
        lam = self.n_nodes * self.r_f
        dt = self.interval
        if math.isinf(dt):
            return 1.0
        return _share((1.0 - lam * (self.u0 + dt / 2.0)) / (1.0 + self.w_cp / dt))

    def expected_failures(self) -> float:
        """Eq. (5): E[N_f] for the run."""
        lam = self.n_nodes * self.r_f
        dt = self.interval
        ckpt = 0.0 if math.isinf(dt) else self.w_cp / dt
        r = self.runtime
        return r * lam * (1.0 + self.u0 / r + ckpt) / (1.0 - lam * (self.u0 + dt / 2.0))

    def what_if(self, rf_scale: float = 1.0, w_cp: float | None = None) -> EttrModel:
        """The same run with a scaled failure rate and/or another checkpoint write time.

        An explicit dt_cp is kept; a Daly-Young one is re-derived, as in the paper's Fig. 10.
        """
        return replace(self, r_f=self.r_f * rf_scale, w_cp=self.w_cp if w_cp is None else w_cp)


def expected_ettr(
    n_nodes, r_f, runtime, u0=FIVE_MINUTES, w_cp=FIVE_MINUTES, dt_cp=None, queue=0.0
) -> np.ndarray:
    """Eq. (1)/(8) over numpy arrays (broadcasting), for many runs at once.

    dt_cp None (or NaN entries) means Daly-Young. Same algebra as `EttrModel.expected`.
    """
    lam = np.asarray(n_nodes, dtype=float) * np.asarray(r_f, dtype=float)
    w = np.asarray(w_cp, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        dy = np.sqrt(2.0 * w / lam)
        dt = dy if dt_cp is None else np.where(np.isnan(dt_cp), dy, dt_cp)
        ckpt = np.where(np.isinf(dt), 0.0, w / dt)
        num = np.where(lam > 0, 1.0 - lam * (u0 + dt / 2.0), 1.0)
        late = np.where(lam > 0, lam * queue * (1.0 + ckpt - dt / (2.0 * runtime)), 0.0)
        # A share of wall time: past lam (u0 + dt/2) >= 1 the form goes negative (NaN kept).
        return np.clip(num / (1.0 + (u0 + queue) / runtime + ckpt + late), 0.0, 1.0)


def eq11_daly_young(n_nodes: float, r_f: float, u0: float, w_cp: float) -> float:
    """Eq. (11): Eq. (10) with the Daly-Young interval substituted."""
    lam = n_nodes * r_f
    return _share((1.0 - lam * (u0 + math.sqrt(w_cp / (2.0 * lam))))
                  / (1.0 + math.sqrt(lam * w_cp / 2.0)))


# Requeues one Monte Carlo run may take before it is scored as it stands.
MAX_ROUNDS = 2_000


@dataclass(frozen=True)
class MonteCarloResult:
    mean: float
    std: float
    runs: int
    mean_failures: float
    unfinished: int = 0  # runs still requeueing after MAX_ROUNDS (scored by progress so far)

    @property
    def stderr(self) -> float:
        return self.std / math.sqrt(self.runs)


def monte_carlo(model: EttrModel, runs: int = 20_000, seed: int = 0) -> MonteCarloResult:
    """Simulate `runs` independent job runs of the same model, all at once (numpy, seeded).

    Each job instance waits q (exponential, mean q), pays u0, then alternates dt_cp of training
    with a w_cp checkpoint write. Failures arrive as a Poisson process at rate N r_f over the
    scheduled time; a failure loses everything since the last completed checkpoint and the run
    requeues. The run ends when R of training is done (the last stretch is checkpointed too).
    """
    rng = np.random.default_rng(seed)
    lam = model.n_nodes * model.r_f
    dt, w, u0, q, r = model.interval, model.w_cp, model.u0, model.queue, model.runtime
    if math.isinf(dt):
        dt = r  # no failures: a single checkpoint at the end
    done = np.zeros(runs)  # checkpointed progress
    wall = np.zeros(runs)
    failures = np.zeros(runs, dtype=np.int64)
    active = np.ones(runs, dtype=bool)
    rounds = 0
    # Failures faster than a checkpoint cycle: a run makes (almost) no progress and never ends
    # (100,000 nodes at the paper's r_f ran past 100 s). Bounded: a run still going after
    # MAX_ROUNDS requeues is scored by the progress it made in the time it spent.
    while active.any() and rounds < MAX_ROUNDS:
        rounds += 1
        idx = np.flatnonzero(active)
        n = idx.size
        wait = rng.exponential(q, n) if q > 0 else np.zeros(n)
        remaining = r - done[idx]
        cycles = np.ceil(remaining / dt - 1e-12)
        needed = u0 + remaining + cycles * w
        ttf = rng.exponential(1.0 / lam, n) if lam > 0 else np.full(n, np.inf)
        ok = ttf >= needed
        spent = np.where(ok, needed, ttf)
        wall[idx] += wait + spent
        # Completed checkpoint cycles before the failure; progress is capped by what remained.
        got = np.floor(np.maximum(ttf - u0, 0.0) / (dt + w)) * dt
        done[idx] = np.where(ok, r, done[idx] + np.minimum(got, remaining))
        failures[idx[~ok]] += 1
        active[idx[ok]] = False
    with np.errstate(invalid="ignore", divide="ignore"):
        ettr = np.where(active, np.divide(done, wall, out=np.zeros(runs), where=wall > 0),
                        r / wall)
    return MonteCarloResult(
        mean=float(ettr.mean()),
        std=float(ettr.std(ddof=1)) if runs > 1 else 0.0,
        runs=runs,
        unfinished=int(active.sum()),
        mean_failures=float(failures.mean()),
    )
