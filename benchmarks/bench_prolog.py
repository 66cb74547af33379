"""Prolog wall time on the healthy fixture node against a bare `python -c pass`, same run.

    python3 benchmarks/bench_prolog.py [--runs 20]

Both are timed as slurmd runs them: a fresh interpreter per job start. The prolog here is the
node-path main (`python -m rsc_health.nodepath prolog`) over a private copy of
tests/fixtures/nodes/healthy; no SLURM_JOB_ID, so no Slurm call is timed (that one
`scontrol show job` is Slurm's cost, not ours). Target: ratio <= 3x.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # tests.fixtures
from tests.fixtures.nodes.node_copy import copy_node  # noqa: E402


def timed(argv: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(argv, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{argv} failed ({proc.returncode}): {proc.stderr}")
    return elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    quick = os.environ.get("RSC_BENCH_QUICK", "") not in ("", "0")  # benchmarks/run --quick
    ap.add_argument("--runs", type=int, default=3 if quick else 20)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "node"
        copy_node(root)
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        env.update(RSC_HEALTH_ROOT=str(root), RSC_HEALTH_CONFIG=str(root / "config.toml"),
                   SLURMD_NODENAME="bench01", PYTHONPATH=str(REPO))
        prolog = [sys.executable, "-m", "rsc_health.nodepath", "prolog"]
        bare = [sys.executable, "-c", "pass"]
        timed(prolog, env)  # warm the page cache and __pycache__
        p, b = [], []
        for _ in range(args.runs):  # interleaved so load changes hit both alike
            b.append(timed(bare, env))
            p.append(timed(prolog, env))
    pm, bm = statistics.median(p), statistics.median(b)
    print(f"python -c pass : median {bm * 1000:7.1f} ms  (min {min(b) * 1000:.1f})")
    print(f"prolog         : median {pm * 1000:7.1f} ms  (min {min(p) * 1000:.1f})")
    print(f"ratio          : {pm / bm:.2f}x  (target <= 3x; {args.runs} runs each)")
    # benchmarks/run table protocol
    print(f"BENCH\tprolog\tprolog median\t{pm * 1000:.1f}\tms")
    print(f"BENCH\tprolog\tpython -c pass median\t{bm * 1000:.1f}\tms")
    print(f"BENCH\tprolog\tprolog / bare python\t{pm / bm:.2f}\tx")


if __name__ == "__main__":
    main()
