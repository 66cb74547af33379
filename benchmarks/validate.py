"""Validation: do the historian's metrics recover the simulator's ground truth?

    python3 benchmarks/validate.py [--seeds 201-205] [--nodes 256] [--days 90] [--workdir DIR]

For each seed: simulate a fleet, ingest every file into a fresh SQLite historian, attribute,
and hold r_f, MTTF by job size and ETTR of long runs against truth.json. Prints one table per
measure (the figures in docs/validation.md come from here). tests/validation/ imports these
functions, so the tests and the table measure the same thing.

Ground truth used (all from truth.json, none hard-coded):
- `rf_true_fleet`: injected failures per node-day of up time over the whole fleet.
- the per-node intensity: `rf_per_node_day` for healthy nodes, `rf_lemon_per_node_day` for the
  nodes in `lemon_nodes`. Weighted by the node-days that large jobs actually ran on each node, it
  gives the rate the large-job estimate should recover (`rf_exposure`): large jobs sample the
  fleet, and which lemons they happened to sit on moves the target by several percent. Unlike
  the realised fleet rate it carries no Poisson noise of its own, which is what a 90% interval
  of the estimate's own Poisson noise is built to cover.
"""

from __future__ import annotations

import argparse
import tempfile
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import numpy as np
import pandas as pd
from sqlalchemy import Engine, select

from rsc_health.historian import db as hdb
from rsc_health.historian.metrics import mttf, rates, runs
from rsc_health.historian.metrics._sql import (
    DEFAULT_BUCKETS,
    SECONDS_PER_DAY,
    Window,
    bucket_of,
    poisson_rate_ci,
    runtime_s,
)
from rsc_health.historian.metrics.ettr import hours
from rsc_health.historian.schema import job_nodes, jobs
from rsc_health.sim.config import SimConfig
from rsc_health.sim.historian import simulated_historian

VALIDATION_SEEDS = (201, 202, 203, 204, 205)  # lemon tuning used 1-10, held out 11-15, 101-110
LARGE_JOB_GPUS = 128
CONFIDENCE = 0.9

# What the simulator assumes about a job's checkpoints (rsc_health/sim/jobs.py `continuation`):
# hourly checkpoints, an interrupted instance loses min(runtime, 30 min) = dt_cp / 2 of work,
# no modelled restart overhead (u0) or checkpoint write time (w_cp), and the requeued instance
# queues 121 s + Exp(600 s). ETTR is measured and projected with those same parameters.
SIM_DT_CP = hours(1.0)
SIM_U0 = 0.0
SIM_W_CP = 0.0
LONG_RUN_HOURS = 24.0
# A fleet failing ~5x as often as the paper's, so the failure term of ETTR is not lost in noise.
STRESS_RF = 30.0
STRESS_SEED = 206
STRESS_DAYS = 60.0


@dataclass
class Fleet:
    seed: int
    out: Path
    engine: Engine
    truth: dict
    as_of: datetime

    @property
    def window(self) -> Window:
        return Window(until=self.as_of)

    def node_rate(self, nodes: pd.Series) -> pd.Series:
        """Injected failure intensity per node-day of each node (truth.json)."""
        lemon = nodes.isin(set(self.truth["lemon_nodes"]))
        return pd.Series(np.where(lemon, self.truth["rf_lemon_per_node_day"],
                                  self.truth["rf_per_node_day"]), index=nodes.index)


def build_fleet(seed: int, workdir: Path, *, nodes: int = 256, days: float = 90,
                **sim_overrides) -> Fleet:
    """Simulate one fleet, ingest it into a fresh SQLite historian and attribute (as the demo)."""
    fleet = simulated_historian(SimConfig(nodes=nodes, days=days, seed=seed, **sim_overrides),
                                Path(workdir) / f"seed{seed}-{nodes}x{days:g}")
    return Fleet(seed, fleet.out, hdb.connect(fleet.url, create_missing=True), fleet.truth,
                 fleet.as_of)


def exposure(fleet: Fleet) -> pd.DataFrame:
    """One row per ended job instance: gpus, runtime days, and the expected number of injected
    failures over its nodes (sum of node intensity x runtime) -- the truth side of r_f and MTTF."""
    q = (
        select(jobs.c.id, jobs.c.gpus, (runtime_s() / SECONDS_PER_DAY).label("days"),
               job_nodes.c.node)
        .select_from(jobs.join(job_nodes, job_nodes.c.job_pk == jobs.c.id))
        .where(jobs.c.gpus > 0, *fleet.window.clauses())
    )
    with fleet.engine.connect() as conn:
        df = pd.DataFrame(conn.execute(q).all(), columns=["id", "gpus", "days", "node"])
    df["expected"] = df["days"].astype(float) * fleet.node_rate(df["node"])
    df["node_days"] = df["days"].astype(float)
    return df.groupby("id").agg(gpus=("gpus", "first"), days=("days", "first"),
                                node_days=("node_days", "sum"), expected=("expected", "sum"))


def lemon_job_kills(fleet: Fleet) -> int:
    """Single-node NODE_FAIL instances on lemon nodes that no injected failure explains: the
    simulator's lemon job kills (truth.json counts them per lemon as `job_failures`, FAILED
    ones included, which count only if attributed)."""
    explained = {str(j) for f in fleet.truth["failures"] for j in f["jobs"]}
    q = select(jobs.c.job_id).where(
        jobs.c.state == "NODE_FAIL", jobs.c.nnodes == 1,
        jobs.c.nodelist.in_(fleet.truth["lemon_nodes"]), *fleet.window.clauses())
    with fleet.engine.connect() as conn:
        kills = sum(1 for (job_id,) in conn.execute(q) if job_id not in explained)
    assert kills <= sum(lem["job_failures"] for lem in fleet.truth["lemons"])
    return kills


def rf_check(fleet: Fleet, large_job_gpus: int = LARGE_JOB_GPUS) -> dict:
    """Estimated large-job r_f and its interval next to the simulator's truth (per 1000)."""
    est = rates.failure_rate(fleet.engine, fleet.window, large_job_gpus, CONFIDENCE)
    ex = exposure(fleet)
    big = ex[ex["gpus"] > large_job_gpus]
    rf_exposure = float(big["expected"].sum() / big["node_days"].sum())
    with fleet.engine.connect() as conn:
        large_ids = {j for (j,) in conn.execute(
            select(jobs.c.job_id).where(jobs.c.gpus > large_job_gpus, *fleet.window.clauses()))}
    # Injected failures that hit a large job instance (a requeued job hit twice counts twice).
    per_failure = [sum(str(j) in large_ids for j in f["jobs"]) for f in fleet.truth["failures"]]
    per_failure = [k for k in per_failure if k]
    truth_hits = sum(per_failure)
    return {
        "seed": fleet.seed,
        "failures": est.failures,
        "truth_hits": truth_hits,
        # The simulator places jobs without a per-node capacity, so one node failure can kill
        # several large jobs at once: counts come in clusters, and the Poisson interval is
        # too narrow by about sqrt(overdispersion) (compound Poisson: E[k^2] / E[k]).
        "distinct_failures": len(per_failure),
        "overdispersion": sum(k * k for k in per_failure) / truth_hits if truth_hits else 1.0,
        "node_days": est.node_days,
        "rf_est": est.r_f * 1000,
        "ci_low": est.ci_low * 1000,
        "ci_high": est.ci_high * 1000,
        "rf_true_fleet": fleet.truth["rf_true_fleet"] * 1000,
        "rf_exposure": rf_exposure * 1000,
        "expected_failures": float(big["expected"].sum()),
        "inside": bool(est.ci_low <= rf_exposure <= est.ci_high),
        "inside_fleet": bool(est.ci_low <= fleet.truth["rf_true_fleet"] <= est.ci_high),
    }


def pooled_rf(rows: list[dict]) -> dict:
    """All seeds together: one Poisson rate over the summed failures and node-days."""
    k = sum(r["failures"] for r in rows)
    nd = sum(r["node_days"] for r in rows)
    lo, hi = poisson_rate_ci(k, nd, CONFIDENCE)
    truth = sum(r["expected_failures"] for r in rows) / nd
    return {"failures": k, "node_days": nd, "rf_est": k / nd * 1000, "ci_low": lo * 1000,
            "ci_high": hi * 1000, "rf_exposure": truth * 1000,
            "inside": bool(lo <= truth <= hi)}


def mttf_check(fleet: Fleet, r_f: float) -> pd.DataFrame:
    """Measured MTTF per size bucket with its 90% Gamma interval, next to two projections:
    `projected_hours` = 1/(N_nodes r_f) at the bucket's size with the measured r_f (the metric's
    own column), and `truth_hours` = the bucket's runtime over its expected injected failures
    (each job's node count and nodes' intensities from truth.json)."""
    m = mttf.mttf_by_size(fleet.engine, fleet.window, r_f=r_f, confidence=CONFIDENCE)
    ex = exposure(fleet)
    ex["bucket"] = [bucket_of(int((g + 7) // 8 * 8), DEFAULT_BUCKETS) for g in ex["gpus"]]
    per = ex.groupby("bucket").agg(days=("days", "sum"), expected=("expected", "sum"))
    # Lemons also kill single-node jobs outside the Poisson process (sim `lemon_job_failures`);
    # those that end NODE_FAIL are infra failures by the paper's rule, so they join the truth.
    smallest = min(per.index)
    per.loc[smallest, "expected"] += lemon_job_kills(fleet)
    truth_h = (per["days"] * 24 / per["expected"]).rename("truth_hours")
    m = m.merge(truth_h, left_on="gpus", right_index=True, how="left")
    m["seed"] = fleet.seed
    m["inside"] = (m["ci_low_hours"] <= m["truth_hours"]) & (m["truth_hours"] <= m["ci_high_hours"])
    return m


def long_runs(fleet: Fleet, r_f: float, min_gpus: int = LARGE_JOB_GPUS) -> pd.DataFrame:
    """Long runs (requeue chains of one Job ID) measured and projected with the simulator's own
    checkpoint model (SIM_DT_CP, SIM_U0, SIM_W_CP) and the measured r_f."""
    opts = runs.RunOptions(link_by="job_id", u0=SIM_U0, w_cp=SIM_W_CP, dt_cp=SIM_DT_CP,
                           min_run_hours=LONG_RUN_HOURS, min_gpus=min_gpus)
    df = runs.job_runs(fleet.engine, r_f, fleet.window, opts)
    df["seed"] = fleet.seed
    return df


def ettr_agreement(df: pd.DataFrame) -> dict:
    """Mean measured ETTR vs mean Eq. (1) ETTR over the runs, with the standard error of the
    paired difference. Eq. (1) gets each run's N, productive runtime and its own mean queue per
    instance, so what is under test is the failure term: interruptions at rate N r_f, each
    costing dt_cp/2 of work plus a queue."""
    d = df["measured_ettr"] - df["expected_ettr"]
    return {
        "runs": len(df),
        "interruptions": int(df["interruptions"].sum()),
        "measured": float(df["measured_ettr"].mean()),
        "expected": float(df["expected_ettr"].mean()),
        "diff": float(d.mean()),
        "se": float(d.std(ddof=1) / np.sqrt(len(d))) if len(d) > 1 else float("nan"),
    }


def lemon_scores(seeds: list[int], nodes: int, days: float) -> pd.DataFrame:
    """Precision and recall of the packaged lemon rules per seed and over all of them."""
    from rsc_health.historian.lemons.verdicts import LemonRules
    from rsc_health.sim.tune import labelled_from_sim, score

    rules = LemonRules.from_config()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        fleets = [labelled_from_sim(s, Path(tmp), nodes=nodes, days=days) for s in seeds]
    for seed, fleet in zip([*seeds, "all"], [*([f] for f in fleets), fleets], strict=True):
        sc = score(fleet, rules)
        rows.append({"seed": seed, "planted": sc.tp + sc.fn, "found": sc.tp + sc.fp,
                     "tp": sc.tp, "precision": round(sc.precision, 2),
                     "recall": round(sc.recall, 2), "fpr": round(sc.fpr, 4)})
    return pd.DataFrame(rows)


def _seeds(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="201-205")
    ap.add_argument("--nodes", type=int, default=256)
    ap.add_argument("--days", type=float, default=90)
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--lemons", action="store_true",
                    help="also score the default lemon rules on these seeds (another pass)")
    ap.add_argument("--stress-rf", type=float, default=STRESS_RF,
                    help="also measure ETTR on a fleet at this r_f per 1000 node-days (0: skip)")
    args = ap.parse_args(argv)
    pd.set_option("display.width", 160)
    pd.set_option("display.max_columns", 30)
    with tempfile.TemporaryDirectory() as tmp:
        work = args.workdir or Path(tmp)
        rf_rows, mttf_rows, run_rows, ettr_rows = [], [], [], []
        for seed in _seeds(args.seeds):
            fleet = build_fleet(seed, work, nodes=args.nodes, days=args.days)
            try:
                rf = rf_check(fleet)
                rf_rows.append(rf)
                r_f = rf["rf_est"] / 1000
                mttf_rows.append(mttf_check(fleet, r_f))
                lr = long_runs(fleet, r_f)
                run_rows.append(lr)
                ettr_rows.append({"seed": seed, **ettr_agreement(lr)})
            finally:
                fleet.engine.dispose()
    print(f"## r_f, large jobs (> {LARGE_JOB_GPUS} GPUs), per 1000 node-days, "
          f"{args.nodes} nodes x {args.days:g} days")
    print(pd.DataFrame(rf_rows).round(2).to_string(index=False))
    print("pooled:", {k: round(v, 2) if isinstance(v, float) else v
                      for k, v in pooled_rf(rf_rows).items()})
    print("\n## MTTF by job size (hours): measured [90% CI] vs projections")
    m = pd.concat(mttf_rows)
    cols = ["seed", "size", "jobs", "failures", "mttf_hours", "ci_low_hours", "ci_high_hours",
            "projected_hours", "truth_hours", "inside"]
    print(m[cols].round(1).to_string(index=False))
    tested = m[m["failures"] >= 5]
    print(f"buckets with >= 5 failures: {len(tested)}, truth inside the 90% CI: "
          f"{int(tested['inside'].sum())}")
    print(f"\n## ETTR of long runs (>= {LONG_RUN_HOURS:g} h, > {LARGE_JOB_GPUS - 1} GPUs), "
          "sim's checkpoint model")
    print(pd.DataFrame(ettr_rows).round(4).to_string(index=False))
    print("all seeds:", _rounded(ettr_agreement(pd.concat(run_rows))))
    if args.lemons:
        print("\n## Lemons: default [lemon] rules vs planted lemons "
              "(tests/lemons/test_accuracy_on_simulator.py holds seeds 101-103 to this)")
        print(lemon_scores(_seeds(args.seeds), args.nodes, args.days).to_string(index=False))
    if args.stress_rf:
        with tempfile.TemporaryDirectory() as tmp:
            fleet = build_fleet(STRESS_SEED, args.workdir or Path(tmp), nodes=args.nodes,
                                days=STRESS_DAYS, rf_per_1000_node_days=args.stress_rf)
            try:
                rf = rf_check(fleet)
                lr = long_runs(fleet, rf["rf_est"] / 1000)
            finally:
                fleet.engine.dispose()
        print(f"\n## ETTR at r_f = {args.stress_rf:g} per 1000 node-days (seed {STRESS_SEED}, "
              f"{args.nodes} nodes x {STRESS_DAYS:g} days): r_f est {rf['rf_est']:.1f} "
              f"[{rf['ci_low']:.1f}, {rf['ci_high']:.1f}], truth {rf['rf_exposure']:.1f}")
        print(_rounded(ettr_agreement(lr)))


def _rounded(d: dict) -> dict:
    return {k: round(v, 4) if isinstance(v, float) else v for k, v in d.items()}

if __name__ == "__main__":
    main()
