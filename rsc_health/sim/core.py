"""`simulate(config, out_dir)`: plan the jobs, plant the failures and lemons, let them meet,
and write every file with the ground truth beside it."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from rsc_health.hostlist import compress
from rsc_health.sim import writers
from rsc_health.sim.config import SimConfig
from rsc_health.sim.failures import (
    ADMIN_USER,
    SLURM_USER,
    FailurePlan,
    disruption_events,
    plan_failures,
)
from rsc_health.sim.jobs import HOUR, Instances, Jobs, plan_jobs
from rsc_health.sim.schedule import close_horizon, lemon_job_failures
from rsc_health.sim.scheduler import schedule
from rsc_health.sim.stream import all_clear_intervals

FILES = ("sacct.txt", "events.txt", "checks.jsonl", "exclusions.jsonl", "tickets.csv",
         "truth.json", "spool/pending.jsonl")

Progress = Callable[[str], None]


@dataclass
class SimResult:
    out_dir: Path
    files: dict[str, Path]
    jobs: int  # distinct JobIDs
    instances: int  # sacct rows
    failures: int
    lemons: list[str]
    rf_true: float  # injected failures per node-day of up time
    wall_s: float
    timings: dict[str, float] = field(default_factory=dict)
    schedule: dict = field(default_factory=dict)  # region size, lanes, instances preempted


def _exclusions(cfg: SimConfig, jobs: Jobs, inst: Instances, plan: FailurePlan, n_nodes: int,
                rng: np.random.Generator) -> list[tuple[int, int, int]]:
    """Users exclude nodes mostly at random (`excl_jobid_count` was weakly correlated with
    real faults); a minority avoid a node that failed recently."""
    first = np.flatnonzero(inst.parent < 0)
    pick = first[rng.random(len(first)) < cfg.exclusion_job_share]
    fail_t = np.asarray([f.time for f in plan.failures], dtype=np.int64)
    fail_n = np.asarray([f.node for f in plan.failures], dtype=np.int64)
    order = np.argsort(fail_t)
    fail_t, fail_n = fail_t[order], fail_n[order]
    rows = []
    for i in pick.tolist():
        t = int(inst.submit[i])
        for _ in range(int(rng.integers(1, 4))):
            node = int(rng.integers(0, n_nodes))
            if rng.random() < cfg.exclusion_informed_share and len(fail_t):
                lo, hi = np.searchsorted(fail_t, [t - 14 * 24 * HOUR, t])
                if hi > lo:
                    node = int(fail_n[rng.integers(lo, hi)])
            rows.append((int(jobs.job_id[inst.job[i]]), node, t))
    return rows


def simulate(config: SimConfig, out_dir: str | Path, progress: Progress | None = None) -> SimResult:
    say = progress or (lambda _msg: None)
    t0 = time.perf_counter()
    timings: dict[str, float] = {}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cfg = config
    # Independent streams per part, so changing one part's draws leaves the others alone.
    # A sixth stream for the disruptions: spawn(6) begins with spawn(5)'s five.
    seeds = np.random.SeedSequence(cfg.seed).spawn(6)
    rng_jobs, rng_fail, rng_apply, rng_write, rng_excl, rng_disrupt = (
        np.random.default_rng(s) for s in seeds
    )
    horizon = int(cfg.days * 24 * HOUR)
    epoch = np.datetime64(cfg.start, "s")

    def lap(name: str) -> None:
        timings[name] = round(time.perf_counter() - t0 - sum(timings.values()), 3)

    say("planning jobs")
    fleet, jobs, inst = plan_jobs(cfg, rng_jobs)
    lap("jobs")
    say("planting failures and lemons")
    plan = plan_failures(cfg, fleet.size, rng_fail)
    lap("failures")
    say("scheduling jobs around the outages")
    inst, sched = schedule(cfg, jobs, inst, fleet.big_hi, fleet.size, plan.failures, rng_apply,
                           horizon)
    nodesets = sched.pop("nodesets")
    lemon_fails = lemon_job_failures(cfg, inst, plan, rng_apply)
    inst = close_horizon(inst, horizon)
    lap("apply")

    say("writing sacct.txt")
    n_rows = writers.write_sacct(out / "sacct.txt", epoch, fleet.names, fleet.partitions, jobs,
                                 inst, nodesets=nodesets)
    lap("sacct")
    say("writing events, checks, tickets, exclusions")
    names = fleet.names
    disruptions = disruption_events(cfg, fleet.size, horizon, rng_disrupt)
    event_rows = writers.event_rows(plan.failures, horizon, rng_write)
    if disruptions:
        event_rows = sorted(event_rows + disruptions, key=lambda r: (r[1], r[0]))
    writers.write_events(out / "events.txt", epoch, names, event_rows, horizon)
    check_rows = sorted(
        [r for f in plan.failures for r in f.rows] + plan.transients, key=lambda r: (r.time, r.node)
    )
    all_clear = all_clear_intervals(plan, fleet.size, horizon, int(cfg.sweep_interval_s))
    writers.write_checks(out / "checks.jsonl", epoch, names, check_rows, all_clear)
    writers.write_heartbeats(out / "spool" / "pending.jsonl", epoch, names, all_clear, horizon,
                             int(cfg.sweep_interval_s))
    writers.write_tickets(out / "tickets.csv", epoch, names, plan.failures, horizon)
    writers.write_exclusions(out / "exclusions.jsonl", epoch, names,
                             _exclusions(cfg, jobs, inst, plan, fleet.size, rng_excl))
    def ts(seconds: int) -> str:
        return str(writers.slurm_times(epoch, np.asarray([seconds]))[0])

    node_days_up = plan.node_seconds_up / 86400
    rf_true = len(plan.failures) / node_days_up if node_days_up else 0.0
    lemon_names = [names[n] for n in sorted(plan.lemons)]
    truth = {
        "seed": cfg.seed, "nodes": cfg.nodes, "days": cfg.days, "start": cfg.start,
        "gpus_per_node": cfg.gpus_per_node,
        "partitions": {p: compress(names[lo:hi]) for p, lo, hi in
                       zip(fleet.partitions, fleet.part_lo.tolist(), fleet.part_hi.tolist(),
                           strict=True)},
        "rf_per_node_day": cfg.rf,
        "rf_lemon_per_node_day": cfg.rf * cfg.lemon_rf_multiplier,
        # Injected failures per node-day the nodes were up, lemons included: what an estimate
        # of r_f from the whole fleet's history should recover.
        "rf_true_fleet": rf_true,
        "node_days": cfg.nodes * cfg.days,
        "node_days_up": node_days_up,
        "lemon_nodes": lemon_names,
        "lemons": [{"node": names[n], "cause": c, "job_failures": lemon_fails.get(n, 0)}
                   for n, c in sorted(plan.lemons.items())],
        "jobs": int(np.count_nonzero(np.bincount(inst.job))),
        "sacct_rows": n_rows,
        "transient_events": len(plan.transients),
        "maintenance_events": sum(r[5] == ADMIN_USER for r in disruptions),
        "fleet_event_rows": sum(r[5] == SLURM_USER for r in disruptions),
        "failures": [
            {"node": names[f.node], "time": ts(f.time),
             "mode": f.mode, "codes": [r.code for r in f.rows], "lemon": f.lemon,
             "repair_end": ts(f.repair_end if f.repair_end < horizon else -1),
             "job_state": "NODE_FAIL" if f.node_fail else "FAILED",
             "ticket": f.ticket is not None, "jobs": f.jobs, "preempted_jobs": f.preempted}
            for f in sorted(plan.failures, key=lambda f: (f.time, f.node))
        ],
    }
    (out / "truth.json").write_text(json.dumps(truth, indent=1) + "\n", encoding="utf-8")
    lap("other_files")
    return SimResult(
        out_dir=out, files={name: out / name for name in FILES}, jobs=truth["jobs"],
        instances=n_rows, failures=len(plan.failures), lemons=lemon_names, rf_true=rf_true,
        wall_s=round(time.perf_counter() - t0, 3), timings=timings,
        schedule={"big_region_nodes": fleet.big_hi, **sched},
    )
