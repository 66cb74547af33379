#!/usr/bin/env python3
"""Qualification's peer judgement on real spreads: how often a healthy node fails, and how often
a node degraded by 3%, 5% or 10% in one metric is caught (issue 24's targets: recall >= 0.99 at
5% and healthy fails <= 0.1%). The healthy spread of each metric comes from real outputs
(tests/fixtures/qualify: SuperBench's 8x A100 gpu-burn and the NDv4 fleet's per-HCA means;
tests/fixtures/real: one H200's repeated runs), read through the product's parsers.

    python3 benchmarks/bench_qualify.py [--nodes 20000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from rsc_health.qualify.judge import Rules  # noqa: E402
from rsc_health.sim.qualify_tools import real_spreads, simulate  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    quick = os.environ.get("RSC_BENCH_QUICK") == "1"
    ap.add_argument("--nodes", type=int, default=2000 if quick else 20000)
    args = ap.parse_args()
    rules = Rules()
    spreads = real_spreads(HERE.parent / "tests" / "fixtures")
    print(f"{'source':38s} {'n':>3s} {'sigma':>7s} {'healthy fail':>12s} {'3%':>6s} "
          f"{'5%':>6s} {'10%':>6s}")
    for name, dev in spreads.items():
        sigma = statistics.pstdev(dev)
        row = []
        for degrade in (0.03, 0.05, 0.10):
            ff, recall = simulate(dev, nodes=args.nodes, degrade=degrade, seed=7, rules=rules)
            row.append((ff, recall))
        ff = max(r[0] for r in row)
        print(f"{name:38s} {len(dev):3d} {sigma * 100:6.2f}% {ff * 100:11.3f}% "
              + " ".join(f"{r[1]:6.3f}" for r in row))
        slug = name.split(" (")[0].replace(" ", "_")
        print(f"BENCH\tqualify\t{slug}_healthy_fail\t{ff * 100:.3f}\t%")
        print(f"BENCH\tqualify\t{slug}_recall_at_5pct\t{row[1][1]:.3f}\tratio")
    return 0


if __name__ == "__main__":
    sys.exit(main())
