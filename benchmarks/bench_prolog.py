"""Prolog wall time on the healthy fixture node against a bare `python -c pass`, same run;
and the worst case: a mount whose statfs blocks (a real FUSE mount), an NVML that never
answers and a FIFO kernel-log source, all at once, against the prolog's budget.

    python3 benchmarks/bench_prolog.py [--runs 20]

Both are timed as slurmd runs them: a fresh interpreter per job start, with SLURM_JOB_ID set
(a healthy prolog makes no Slurm call, so none is timed). Targets: healthy <= 2.5x a bare
interpreter; worst case within [slurm] prolog_budget_s.
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
                   SLURMD_NODENAME="bench01", PYTHONPATH=str(REPO), SLURM_JOB_ID="4242",
                   SLURM_JOB_NODELIST="bench[01-04]")
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
    print(f"ratio          : {pm / bm:.2f}x  (target <= 2.5x; {args.runs} runs each)")
    # benchmarks/run table protocol
    print(f"BENCH\tprolog\tprolog median\t{pm * 1000:.1f}\tms")
    print(f"BENCH\tprolog\tpython -c pass median\t{bm * 1000:.1f}\tms")
    print(f"BENCH\tprolog\tprolog / bare python\t{pm / bm:.2f}\tx")
    worst = worst_case()
    if worst is not None:
        took, budget = worst
        print(f"worst case     : {took:.1f} s with a hung FUSE mount, a wedged NVML and a FIFO "
              f"source (budget {budget:g} s: {took / budget:.0%} of it)")
        print(f"BENCH\tprolog\tworst case wall\t{took:.2f}\ts")
        print(f"BENCH\tprolog\tworst case / budget\t{took / budget:.2f}\tx")


def worst_case() -> tuple[float, float] | None:
    """(wall seconds, budget) of one prolog with every source stuck; None without FUSE."""
    import shutil

    fault = REPO / "tests" / "fixtures" / "fault"
    if not (os.path.exists("/dev/fuse") and shutil.which("fusermount")):
        print("worst case     : skipped (no FUSE here)")
        return None
    budget = 12.0
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "node"
        copy_node(root)
        fifo = root / "var/log/kern.fifo"
        fifo.parent.mkdir(parents=True, exist_ok=True)
        os.mkfifo(fifo)
        site = root / "site.toml"
        site.write_text((root / "config.toml").read_text().replace(
            "[gpu]\n", '[gpu]\nbackend = "nvml"\nnvml_timeout_s = 2.0\n')
            + '\n[xid]\nsources = ["/dev/kmsg", "/var/log/kern.fifo"]\n[slurm]\n'
            f'bin_dir = "/nonexistent"\nprolog_budget_s = {budget}\n')
        fuse = subprocess.Popen([sys.executable, str(fault / "hung_fuse.py"),
                                 str(root / "checkpoint")], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        try:
            for _ in range(100):
                if f" {root / 'checkpoint'} " in Path("/proc/mounts").read_text():
                    break
                time.sleep(0.05)
            else:
                print("worst case     : skipped (FUSE would not mount)")
                return None
            env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
            env.update(RSC_HEALTH_ROOT=str(root), RSC_HEALTH_CONFIG=str(site),
                       SLURMD_NODENAME="bench01", SLURM_JOB_ID="4243",
                       PYTHONPATH=f"{fault / 'wedged_nvml'}:{REPO}")
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-m", "rsc_health.nodepath", "prolog"], env=env,
                           capture_output=True, timeout=120)
            return time.perf_counter() - t0, budget
        finally:
            fuse.kill()
            fuse.wait(10)
            subprocess.run(["fusermount", "-u", "-z", str(root / "checkpoint")],
                           capture_output=True)


if __name__ == "__main__":
    main()
