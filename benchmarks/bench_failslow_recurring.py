#!/usr/bin/env python3
"""Fail-slow across jobs (rsc_health/historian/failslow/recurring.py) on the lab's fleet
histories (rsc_health/sim/recurring.py): nodes slow from the start of every job, which the
in-job detector reads as a role, and a healthy fleet scheduled as Slurm does (the first free
nodes in name order, requeues onto the same nodes, pipeline roles by rank).

The judge runs as the suspects timer would, every `--every-h` hours over the trailing
[failslow] recurring_days of finished jobs. Printed per seed set, measured in the same run:
- recall: slow nodes flagged (of those that ran a judged job after their onset), and the
  hours and jobs from onset to the first flag;
- false suspects: healthy nodes ever flagged, per 1,000 node-days, and what that is a day at
  16,000 nodes;
- the same with the rule's guards changed, one at a time (what each is for): every job its
  own placement (requeues onto the same nodes counted again), every workload on the same
  nodes one placement (the rule before workloads were told apart), no place's rate (only each
  job's share of outlying nodes: the node whose name sorts last holds the last stage), and a
  fixed count (outlying in recurring_min_jobs placements, no chance test);
- the judge's time over one window of a 16,000-node fleet's week (--scale).

    benchmarks/bench_failslow_recurring.py [--seeds 0-4] [--every-h 6] [--scale]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rsc_health.config import load_config  # noqa: E402
from rsc_health.historian.failslow import recurring as rc  # noqa: E402
from rsc_health.historian.failslow.core import Rules  # noqa: E402
from rsc_health.sim.recurring import RecurringConfig, simulate_recurring  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_failslow import _seeds  # noqa: E402  (the seed lists' one reader)

METRIC_OF = {"nvlink_low": "nvlink_data_rate", "clock_low": "sm_clock_ratio",
             "throttled": "throttle_hw_frac", "steps_slow": "step_seconds"}


def evaluate(fleet, rules: Rules, cfg, every_h: float, variant: str = "rule") -> dict:
    r = fleet.rollups
    days = float(cfg.get("failslow.recurring_days"))
    alpha = float(cfg.get("failslow.recurring_alpha"))
    min_jobs = int(cfg.get("failslow.recurring_min_jobs"))
    if variant == "every job":  # each job its own placement: a requeue counted again
        r = r.assign(workload=r["job_id"].astype(str))
    elif variant == "node set":  # every workload on the same nodes one placement
        r = r.drop(columns="workload")
    place_rate = rc._place_rate
    if variant == "no place":  # each job's own rate only: a place's role not asked after
        rc._place_rate = lambda p: np.zeros(len(p))
    try:
        return _evaluate(fleet, r, rules, every_h, days, alpha, min_jobs, variant)
    finally:
        rc._place_rate = place_rate


def _evaluate(fleet, r, rules, every_h, days, alpha, min_jobs, variant) -> dict:
    ends = pd.to_datetime(r["end"])
    t, last = ends.min() + timedelta(hours=every_h), ends.max()
    first: dict[str, pd.Timestamp] = {}
    while t <= last + timedelta(hours=every_h):
        window = r[(ends <= t) & (ends > t - timedelta(days=days))]
        if variant == "fixed count":
            j = rc.judge_placements(rc.placements(window), rules)
            x = j.groupby(["node", "metric"])["outlier"].sum()
            hit = {n for (n, _m), c in x.items() if c >= min_jobs}
        else:
            hit = {e.node for e in rc.recurring_frame(window, rules, alpha=alpha,
                                                      min_jobs=min_jobs)}
        for n in hit:
            first.setdefault(n, t)
        t += timedelta(hours=every_h)
    slow = fleet.slow.set_index("node")
    found, delays, jobs_to = 0, [], []
    eligible = 0
    kinds: dict[str, list[int]] = {}  # kind: [eligible, found]
    for node, s in slow.iterrows():
        mine = fleet.rollups[(fleet.rollups["node"] == node)
                             & (fleet.rollups["metric"] == METRIC_OF[s["kind"]])]
        after = mine[pd.to_datetime(mine["start"]) >= s["since"]]
        if after.empty:
            continue
        eligible += 1
        kinds.setdefault(s["kind"], [0, 0])[0] += 1
        if node in first:
            found += 1
            kinds[s["kind"]][1] += 1
            delays.append((first[node] - s["since"]).total_seconds() / 3600)
            jobs_to.append(int((pd.to_datetime(after["end"]) <= first[node]).sum()))
    healthy = set(r["node"]) - set(slow.index)
    false = sorted(n for n in first if n in healthy)
    node_days = len(set(r["node"])) * (ends.max() - ends.min()).total_seconds() / 86400
    return {"eligible": eligible, "found": found, "delays": delays, "jobs": jobs_to,
            "false": len(false), "node_days": node_days, "kinds": kinds}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", default="0-4")
    ap.add_argument("--every-h", type=float, default=6.0)
    ap.add_argument("--days", type=int, default=14)
    ap.add_argument("--scale", action="store_true")
    ap.add_argument("--config")
    args = ap.parse_args()
    quick = os.environ.get("RSC_BENCH_QUICK") == "1"  # benchmarks/run --quick: a smoke check
    if quick:
        args.seeds, args.days, args.scale, args.every_h = "0", 7, False, 24.0
    cfg = load_config(args.config)
    rules = Rules.from_config(cfg)
    seeds = _seeds(args.seeds)
    fleets = [simulate_recurring(RecurringConfig(seed=s, days=args.days,
                                                 **({"nodes": 128, "jobs_per_day": 60}
                                                    if quick else {})))
              for s in seeds]
    print(f"seeds {args.seeds}: {len(fleets[0].rollups['node'].unique())} nodes, "
          f"{args.days} days, judged every {args.every_h:g} h over the trailing "
          f"{cfg.get('failslow.recurring_days')} days (alpha "
          f"{cfg.get('failslow.recurring_alpha')}, at least "
          f"{cfg.get('failslow.recurring_min_jobs')} placements)")
    for variant in ("rule", "every job", "node set", "no place", "fixed count"):
        tot = {"eligible": 0, "found": 0, "delays": [], "jobs": [], "false": 0,
               "node_days": 0.0}
        kinds: dict[str, list[int]] = {}
        t0 = time.perf_counter()
        for fleet in fleets:
            s = evaluate(fleet, rules, cfg, args.every_h, variant)
            for k in tot:
                tot[k] += s[k]
            for kind, (e, f) in s["kinds"].items():
                kinds.setdefault(kind, [0, 0])
                kinds[kind][0] += e
                kinds[kind][1] += f
        secs = time.perf_counter() - t0
        rate = 1000 * tot["false"] / tot["node_days"] if tot["node_days"] else float("nan")
        recall = tot["found"] / tot["eligible"] if tot["eligible"] else float("nan")
        med_h = float(np.median(tot["delays"])) if tot["delays"] else float("nan")
        med_j = float(np.median(tot["jobs"])) if tot["jobs"] else float("nan")
        print(f"  {variant:12s} slow nodes found {tot['found']} of {tot['eligible']} "
              f"({recall:.3f}); onset to flag median {med_h:.1f} h, {med_j:.0f} jobs; "
              f"healthy flagged {tot['false']} ({rate:.2f} per 1,000 node-days, "
              f"{rate * 16:.1f} a day at 16,000 nodes); {secs:.1f} s")
        if variant == "rule":
            print("               by kind: " + ", ".join(
                f"{kind} {f} of {e}" for kind, (e, f) in sorted(kinds.items())))
        tag = variant.replace(" ", "_")
        print(f"BENCH\tfailslow_recurring\t{tag}_recall\t{recall:.3f}\tratio")
        print(f"BENCH\tfailslow_recurring\t{tag}_false_per_1000_node_days\t{rate:.2f}\tnodes")
    if args.scale:
        scale(rules, cfg)
    return 0


def scale(rules: Rules, cfg) -> None:
    """One window of a 16,000-node fleet's week (the lab's rates scaled)."""
    fleet = simulate_recurring(RecurringConfig(seed=99, nodes=16000, days=7,
                                               jobs_per_day=7500))
    t0 = time.perf_counter()
    ev = rc.recurring_frame(fleet.rollups, rules,
                            alpha=float(cfg.get("failslow.recurring_alpha")),
                            min_jobs=int(cfg.get("failslow.recurring_min_jobs")))
    secs = time.perf_counter() - t0
    print(f"  scale: 16,000 nodes, 7 days, {fleet.rollups['job_id'].nunique()} jobs "
          f"({len(fleet.rollups)} rollup values): judged in {secs:.1f} s, {len(ev)} suspects")
    print(f"BENCH\tfailslow_recurring\tscale_16k_week_seconds\t{secs:.1f}\ts")
    read, due, between = read_back(fleet.rollups, cfg)
    print(f"  the same week read from a SQLite historian (load.job_rollups: jobs joined to "
          f"telemetry_job_rollups, the judged metrics' means): {read:.1f} s")
    print(f"BENCH\tfailslow_recurring\tscale_16k_week_read_sqlite_seconds\t{read:.1f}\ts")
    every = float(cfg.get("failslow.recurring_every_min"))
    print(f"  a whole detect pass on it (no samples in the window): {due:.1f} s when it judges "
          f"across jobs, {between:.2f} s in the passes between ([failslow] recurring_every_min "
          f"{every:g}); at one pass a minute, {(due + (every - 1) * between) / max(every, 1):.2f}"
          f" s a pass on average, {due / max(between, 1e-9):.0f}x less between judgements")
    print(f"BENCH\tfailslow_recurring\tscale_16k_detect_judging_seconds\t{due:.2f}\ts")
    print(f"BENCH\tfailslow_recurring\tscale_16k_detect_between_seconds\t{between:.2f}\ts")


def read_back(rollups: pd.DataFrame, cfg) -> tuple[float, float, float]:
    """Write the rollups into a fresh SQLite historian (the product's schema) and time the
    detector's read of them, then two whole `load.detect` passes a minute apart: (read, the
    pass that judges across jobs, the next one, which does not)."""
    import tempfile
    from datetime import datetime

    from sqlalchemy import insert

    from rsc_health.historian import db, schema
    from rsc_health.historian.failslow import load

    wide = rollups.pivot_table(index=["job_id", "node", "start", "end"], columns="metric",
                               values="value").reset_index()
    with tempfile.TemporaryDirectory() as tmp:
        engine = db.connect(f"sqlite:///{tmp}/h.db", create_missing=True)
        jobs = wide.drop_duplicates("job_id")
        with engine.begin() as conn:
            conn.execute(insert(schema.jobs), [
                {"id": int(j), "job_id": str(j), "job_id_display": str(j), "state": "COMPLETED",
                 "submit": s, "start": s, "end": e, "nnodes": 2,
                 "instance_key": f"{j}:{s}:{s}"}
                for j, s, e in zip(jobs["job_id"], jobs["start"], jobs["end"], strict=True)])
            metrics = [c for c in wide.columns if c not in ("job_id", "node", "start", "end")]
            rows = wide.to_dict("records")
            conn.execute(insert(schema.telemetry_job_rollups), [
                {"job_pk": int(r["job_id"]), "node": r["node"], "sweeps": 12,
                 **{f"{m}_mean": r[m] if r[m] == r[m] else None for m in metrics},
                 **{f"{m}_n": None for m in metrics}} for r in rows])
        t0 = time.perf_counter()
        got = load.job_rollups(engine, datetime(1970, 1, 1), datetime(2100, 1, 1),
                               sorted(set(rollups["metric"])))
        secs = time.perf_counter() - t0
        now = pd.Timestamp(rollups["end"].max()).to_pydatetime() + timedelta(minutes=5)
        t0 = time.perf_counter()
        load.detect(engine, now, cfg)
        due = time.perf_counter() - t0
        t0 = time.perf_counter()
        load.detect(engine, now + timedelta(minutes=1), cfg)
        between = time.perf_counter() - t0
        engine.dispose()
    assert len(got) == len(rollups), (len(got), len(rollups))
    return secs, due, between


if __name__ == "__main__":
    raise SystemExit(main())
