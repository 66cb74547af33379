#!/usr/bin/env python3
"""Issue 24's fleet target: the failure rate of jobs of 512+ GPUs with nothing, with lemon
drains, and with qualification + lemon drains, and the share of node-time schedulable, all in
one run of rsc_health/sim/qualify_fleet (its docstring states the model and its sources).

Per bad-repair share (the one assumption with no published figure), the model is calibrated to
the RSC paper's two measured points (14% before lemon detection, 4% after: "none" and "lemon"),
then "qualify" is run on the same draws: its figure is the model's prediction, not a fit. The
floor is what healthy nodes' own visible failures give alone.

    python3 benchmarks/bench_fleet_qualify.py [--shares 0.05,0.1,0.2,0.3] [--seed 0]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rsc_health.sim.qualify_fleet import (  # noqa: E402
    FleetModel,
    calibrate,
    catch_table,
    compare,
    limits,
)


def main() -> int:
    quick = os.environ.get("RSC_BENCH_QUICK") == "1"
    ap = argparse.ArgumentParser()
    ap.add_argument("--shares", default="0.1" if quick else "0.05,0.1,0.2,0.3")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--nodes", type=int, default=512 if quick else 1024)
    ap.add_argument("--jobs", type=int, default=3000 if quick else 12000)
    args = ap.parse_args()
    t0 = time.perf_counter()
    base = FleetModel(nodes=args.nodes, jobs=args.jobs, seed=args.seed)
    catch = catch_table(base)
    print(f"judge on real spreads: a testable defect of {base.degradation[0]:.0%}-"
          f"{base.degradation[1]:.0%} caught {catch.defective / base.testable_share:.3f}, "
          f"x testable {base.testable_share} = {catch.defective:.3f}; healthy false-fail "
          f"{catch.healthy:.4f}")
    print(f"{'bad repairs':>11s} {'bg r_f':>6s} {'silent/d':>8s} {'exposure':>8s} "
          f"{'none':>6s} {'lemon':>6s} {'qualify':>7s} {'floor':>6s} {'sched none/lemon/qual':>22s}"
          f" {'prevented':>9s}")
    for share in (float(x) for x in args.shares.split(",")):
        cal = calibrate(replace(base, bad_repair_share=share), catch)
        m = cal.model
        res = compare(m, catch)
        lim = limits(m, catch)
        fl = lim["floor"]
        none, lemon, qual = (res[p] for p in ("none", "lemon", "qualify"))
        prevented = none.big_jobs_failed - qual.big_jobs_failed
        print(f"{share:11.2f} {m.background_per_1000:6.2f} {m.silent_per_day:8.3f} "
              f"{m.exposure:8.4f} {none.big_job_failure:6.1%} {lemon.big_job_failure:6.1%} "
              f"{qual.big_job_failure:7.1%} {fl:6.1%} "
              f"{none.schedulable:7.2%}/{lemon.schedulable:.2%}/{qual.schedulable:.2%} "
              f"{prevented:5d}/{none.big_jobs}")
        print(f"   qualify: {qual.qualify_fails} fails of defective nodes, "
              f"{qual.qualify_false_fails} of healthy ones, {qual.strikes} three-strike repairs, "
              f"{qual.lemon_drains} lemon drains (lemon only: {lemon.lemon_drains}); "
              f"silent kills {none.silent_kills} -> {lemon.silent_kills} -> {qual.silent_kills}")
        print(f"   limits: a perfect test (every defect that reaches qualification caught) "
              f"{lim['perfect_test']:.1%}, floor {fl:.1%}: perfect test - floor is what "
              "qualification never tests (separate runs: 0.2-0.3 points of noise)")
        tag = f"bad{int(round(share * 100))}"
        print(f"BENCH\tfleet_qualify\t{tag}_big_job_fail_none\t{none.big_job_failure * 100:.2f}\t%")
        print(f"BENCH\tfleet_qualify\t{tag}_big_job_fail_lemon\t{lemon.big_job_failure * 100:.2f}"
              "\t%")
        print(f"BENCH\tfleet_qualify\t{tag}_big_job_fail_qualify\t{qual.big_job_failure * 100:.2f}"
              "\t%")
        print(f"BENCH\tfleet_qualify\t{tag}_floor\t{fl * 100:.2f}\t%")
        print(f"BENCH\tfleet_qualify\t{tag}_perfect_test\t{lim['perfect_test'] * 100:.2f}\t%")
        print(f"BENCH\tfleet_qualify\t{tag}_schedulable_qualify\t{qual.schedulable * 100:.2f}\t%")
    print(f"wall {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
