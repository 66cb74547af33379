"""Job arrivals, sizes, runtimes and planned outcomes, all drawn as whole numpy arrays.

A job is planned once (size, runtime, what the user's program will do); its *instances* are what
sacct prints: a requeued job has several instances with the same JobID.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rsc_health.sim.config import SimConfig
from rsc_health.sim.fleet import Fleet, build_fleet

# sacct State values, indexed by the small ints the arrays hold.
STATES = (
    "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "PREEMPTED", "REQUEUED",
    "NODE_FAIL", "RUNNING",
)
S = {name: i for i, name in enumerate(STATES)}
HOUR = 3600

JOB_NAMES = np.array(
    ["bash", "train", "eval", "pretrain_llm", "finetune", "sweep", "jupyter", "interactive",
     "data_prep", "benchmark", "submitit", "inference", "ablation", "probe", "debug"]
)


@dataclass
class Instances:
    """One row per job instance (column arrays of equal length)."""

    job: np.ndarray  # index of the planned job
    submit: np.ndarray  # seconds since the simulation start
    eligible: np.ndarray
    start: np.ndarray
    end: np.ndarray
    first: np.ndarray  # first node index of the contiguous allocation
    nnodes: np.ndarray
    state: np.ndarray  # index into STATES
    exit_code: np.ndarray  # index into EXIT_CODES
    parent: np.ndarray  # instance this one continues (requeue), -1 for the first
    work_before: np.ndarray  # seconds of the job's work its earlier instances kept
    nodeset: np.ndarray  # index into the scheduler's node lists when not one range, else -1

    def __len__(self) -> int:
        return len(self.job)

    def take(self, idx: np.ndarray) -> Instances:
        return Instances(**{k: v[idx] for k, v in self.__dict__.items()})

    @staticmethod
    def concat(parts: list[Instances]) -> Instances:
        return Instances(
            **{k: np.concatenate([getattr(p, k) for p in parts]) for k in INSTANCE_FIELDS}
        )


INSTANCE_FIELDS = tuple(Instances.__dataclass_fields__)
# Column types other than int64 (state and exit code are small indexes).
INSTANCE_DTYPES = {"state": np.int8, "exit_code": np.int8}

EXIT_CODES = ("0:0", "1:0", "2:0", "127:0", "0:9", "0:15", "0:125", "0:6", "139:0")
E = {code: i for i, code in enumerate(EXIT_CODES)}


@dataclass
class Jobs:
    """Per planned job: attributes shared by all its instances."""

    job_id: np.ndarray
    gpus: np.ndarray
    user: np.ndarray
    name: np.ndarray
    partition: np.ndarray
    runtime: np.ndarray  # planned seconds of work (before any failure)
    limit: np.ndarray  # time limit in seconds


def _sizes(cfg: SimConfig, big_nodes: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The job sizes that fit: single-node sizes always, multi-node ones within the big-job
    region."""
    gpus = np.asarray(cfg.size_gpus)
    weights = np.asarray(cfg.size_weights, dtype=float)
    medians = np.asarray(cfg.runtime_median_h, dtype=float)
    nn = np.ceil(gpus / cfg.gpus_per_node)
    fits = (gpus <= cfg.gpus_per_node) | (nn <= big_nodes)
    return gpus[fits], weights[fits] / weights[fits].sum(), medians[fits]


def _outcomes(
    cfg: SimConfig, runtime: np.ndarray, gpus: np.ndarray, rng: np.random.Generator
) -> np.ndarray:
    """What each job's own program does. Preemption needs two hours of runtime and spares the
    big high-priority jobs, so the preempted share is drawn among the jobs that qualify."""
    n = len(runtime)
    shares = dict(cfg.outcome_shares)
    p_pre = shares.pop("PREEMPTED", 0.0)
    p_req = shares.pop("REQUEUED", 0.0)
    names = list(shares)
    p = np.asarray([shares[k] for k in names], dtype=float)
    outcome = np.asarray([S[k] for k in names], dtype=np.int8)[
        rng.choice(len(names), size=n, p=p / p.sum())
    ]
    qualifies = (runtime > cfg.preempt_min_runtime_h * HOUR + 60) & (gpus < 256)
    share_q = max(qualifies.mean(), 1e-9)
    p_hit = min(0.9, (p_pre + p_req) / share_q)
    u = rng.random(n)
    pre = qualifies & (u < p_hit)
    outcome[pre] = S["PREEMPTED"]
    if p_pre + p_req > 0:
        outcome[pre & (u < p_hit * p_req / (p_pre + p_req))] = S["REQUEUED"]
    return outcome


def plan_jobs(
    cfg: SimConfig, rng: np.random.Generator
) -> tuple[Fleet, Jobs, Instances]:
    """The fleet's two regions and the jobs' first instances (start/end give the planned run
    time only; the scheduler places them)."""
    horizon = int(cfg.days * 24 * HOUR)
    # A pilot draw measures the GPU-seconds a job of each size really uses (failed, cancelled
    # and preempted jobs end early). Stratified: the same number of pilot jobs in every size
    # class, since the rare big classes carry most of the GPU time.
    per = 4000
    pilot_rng = np.random.default_rng(rng.integers(2**63))
    all_gpus = np.asarray(cfg.size_gpus)
    pilot_sizes = np.repeat(np.arange(len(all_gpus)), per)
    _, pi = _draw(cfg, len(pilot_sizes), horizon, pilot_rng, _sizes(cfg, 10**9),
                  size_idx=pilot_sizes)
    ran = np.bincount(pi.job, weights=pi.end - pi.start, minlength=len(pilot_sizes))
    per_class = ran.reshape(len(all_gpus), per).mean(axis=1)
    single = all_gpus <= cfg.gpus_per_node

    def split(big_nodes: int) -> tuple[float, float, int]:
        gpus, weights, _ = _sizes(cfg, big_nodes)
        used = weights * gpus * per_class[np.isin(all_gpus, gpus)]
        small_share = float(used[gpus <= cfg.gpus_per_node].sum() / used.sum())
        n_small = int(min(cfg.nodes, max(1, round(cfg.nodes * small_share))))
        if single.all() or cfg.nodes == 1:
            n_small = cfg.nodes
        return float(used.sum()), small_share, cfg.nodes - n_small

    # Region sizes follow the GPU-time shares of the sizes that fit, which depend on the
    # big region's size: two rounds settle it.
    _, _, big = split(cfg.nodes)
    used, _, big = split(big)
    fleet = build_fleet(cfg, big)
    capacity = cfg.nodes * cfg.gpus_per_node * horizon * cfg.utilisation
    n = max(1, int(round(capacity / used)))
    jobs, inst = _draw(cfg, n, horizon, rng, _sizes(cfg, big))
    return fleet, jobs, inst


def _draw(
    cfg: SimConfig, n: int, horizon: int, rng: np.random.Generator,
    classes: tuple[np.ndarray, np.ndarray, np.ndarray], size_idx: np.ndarray | None = None,
) -> tuple[Jobs, Instances]:
    sizes, weights, medians = classes
    sigma = cfg.runtime_sigma
    limit_s = cfg.time_limit_h * HOUR
    if size_idx is None:
        size_idx = rng.choice(len(sizes), size=n, p=weights)
    gpus = sizes[size_idx]
    runtime = np.exp(rng.normal(np.log(medians[size_idx] * HOUR), sigma))
    runtime = np.clip(runtime, 60, limit_s).astype(np.int64)
    submit = np.sort(rng.integers(0, horizon, size=n))
    nnodes = np.maximum(1, -(-gpus // cfg.gpus_per_node))
    eligible = submit.copy()
    start = eligible  # planned run time only: the scheduler sets the real start

    multi = nnodes > 1
    n_parts = len(cfg.partitions)
    part_shares = np.asarray(cfg.partition_shares[:n_parts], dtype=float)
    partition = rng.choice(n_parts, size=n, p=part_shares / part_shares.sum())
    partition[multi] = 0
    first = np.zeros(n, dtype=np.int64)

    outcome = _outcomes(cfg, runtime, gpus, rng)
    frac = rng.random(n)
    elapsed = runtime.copy()
    early = np.isin(outcome, (S["FAILED"], S["CANCELLED"], S["OUT_OF_MEMORY"]))
    elapsed[early] = np.maximum(30, (runtime[early] * frac[early])).astype(np.int64)
    min_pre = cfg.preempt_min_runtime_h * HOUR
    pre = np.isin(outcome, (S["PREEMPTED"], S["REQUEUED"]))
    elapsed[pre] = (min_pre + (runtime[pre] - min_pre) * frac[pre]).astype(np.int64)
    limit = np.full(n, int(limit_s), dtype=np.int64)
    timeout = outcome == S["TIMEOUT"]
    limit[timeout] = np.maximum(runtime[timeout] // 2, 600)
    elapsed[timeout] = limit[timeout]

    exit_code = np.zeros(n, dtype=np.int8)
    failed = outcome == S["FAILED"]
    exit_code[failed] = rng.choice(
        [E["1:0"], E["2:0"], E["127:0"], E["0:9"], E["139:0"]], size=failed.sum(),
        p=[0.7, 0.1, 0.05, 0.1, 0.05],
    )
    exit_code[outcome == S["CANCELLED"]] = E["0:15"]
    exit_code[outcome == S["OUT_OF_MEMORY"]] = E["0:125"]

    users = np.minimum(rng.zipf(1.3, size=n), cfg.users) - 1
    jobs = Jobs(
        job_id=cfg.first_job_id + np.arange(n, dtype=np.int64),
        gpus=gpus.astype(np.int64),
        user=users.astype(np.int32),
        name=rng.integers(0, len(JOB_NAMES), size=n).astype(np.int16),
        partition=partition.astype(np.int16),
        runtime=runtime,
        limit=limit,
    )
    inst = Instances(
        job=np.arange(n, dtype=np.int64),
        submit=submit,
        eligible=eligible,
        start=start,
        end=start + elapsed,
        first=first.astype(np.int64),
        nnodes=nnodes.astype(np.int64),
        state=outcome.astype(np.int8),
        exit_code=exit_code,
        parent=np.full(n, -1, dtype=np.int64),
        work_before=np.zeros(n, dtype=np.int64),
        nodeset=np.full(n, -1, dtype=np.int64),
    )
    return jobs, inst
