"""What a fleet-wide outage under the mass-drain guard costs slurmctld, measured on a real one.

    python3 benchmarks/bench_guard_load.py [--nodes 2000 16000] [--hours 1 6]

A shared mount gone on every node makes every sweep (and job start) find a drain verdict; past
`guard_max_share` the guard holds them back, and each try to drain reads the node's record and
the whole node table from slurmctld (`scontrol show node` asks for the whole table either way
on Slurm 22.05). This starts a real slurmctld with N nodes (DOWN, no slurmd behind them),
times its own server-side cost per node-table read (`sdiag`'s REQUEST_NODE_INFO total time),
and multiplies it by the reads a held node makes over an outage:

- before: a try on every five-minute sweep, each reading the node's record and then the whole
  table (2 reads; the prolog's tries, one per job start, not counted);
- now: a try when the jittered, doubling backoff (nodepath.guard_retry_after, the packaged
  `[actions] guard_retry_min` / `guard_retry_max_min`) runs out, reading the table once (the
  node's own record is in it).

Prints slurmctld's seconds of work per second for both, and their ratio, in the same run.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import shutil
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from rsc_health.config import load_config  # noqa: E402
from rsc_health.nodepath import guard_retry_after  # noqa: E402
from tests.slurm.cluster import SlurmCluster, slurm_available  # noqa: E402

SWEEP_MIN = 5.0
_NODE_INFO = re.compile(r"REQUEST_NODE_INFO\s+\(\s*2007\) count:(\d+)\s+ave_time:\d+\s+"
                        r"total_time:(\d+)")


def server_ms_per_read(nodes: int, reads: int) -> tuple[float, float, float]:
    """(slurmctld ms per whole-table read, per one-node `scontrol show node`, MB printed)."""
    with tempfile.TemporaryDirectory() as tmp:
        extra = (f"NodeName=gpu[00001-{nodes:05d}] NodeHostname=localhost NodeAddr=127.0.0.1 "
                 "Port=9 CPUs=2 RealMemory=1000 Feature=h100,ib400,rack17 State=DOWN "
                 "Reason=bench\n"
                 f"PartitionName=big Nodes=gpu[00001-{nodes:05d}] State=UP\n")
        c = SlurmCluster(Path(tmp), nodes=2, accounting=False, extra_conf=extra)
        c.start()
        try:
            def stats() -> tuple[int, int]:
                m = _NODE_INFO.search(c.run(["sdiag"]).stdout)
                return (int(m[1]), int(m[2])) if m else (0, 0)

            n0, t0 = stats()
            out = ""
            for _ in range(reads):
                out = c.run(["scontrol", "-o", "show", "node"]).stdout
            n1, t1 = stats()
            for _ in range(reads):
                c.run(["scontrol", "-o", "show", "node", "gpu00007"])
            n2, t2 = stats()
        finally:
            c.stop()
    whole = (t1 - t0) / max(1, n1 - n0) / 1000
    one = (t2 - t1) / max(1, n2 - n1) / 1000
    return whole, one, len(out) / 1e6


def tries_per_node(hours: float, rng: random.Random) -> float:
    """How many times one held node tries to drain over an outage of `hours`, with the
    packaged backoff; the mean of many nodes."""
    cfg = load_config(os.devnull)
    start = datetime(2026, 1, 1, tzinfo=UTC)
    end = start + timedelta(hours=hours)
    counts = []
    for _ in range(2000):
        # A node's sweeps run every SWEEP_MIN from a random phase; a try happens on the first
        # sweep at or after its retry time.
        t = start + timedelta(minutes=rng.uniform(0, SWEEP_MIN))
        retry, holds, n = t, 0, 0
        while t < end:
            if t >= retry:
                n += 1
                holds += 1
                retry = guard_retry_after(cfg, holds, t, rng.random)
            t += timedelta(minutes=SWEEP_MIN)
        counts.append(n)
    return statistics.mean(counts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    quick = os.environ.get("RSC_BENCH_QUICK", "") not in ("", "0")
    ap.add_argument("--nodes", type=int, nargs="+", default=[2000] if quick else [2000, 16000])
    ap.add_argument("--hours", type=float, nargs="+", default=[1.0, 6.0])
    ap.add_argument("--reads", type=int, default=5 if quick else 20)
    args = ap.parse_args()
    if not slurm_available() or shutil.which("munged") is None:
        print("slurmctld or munged is not installed: nothing measured")
        return
    rng = random.Random(7)
    per_hours = {h: tries_per_node(h, rng) for h in args.hours}
    for nodes in args.nodes:
        t0 = time.perf_counter()
        whole, one, mb = server_ms_per_read(nodes, args.reads)
        took = time.perf_counter() - t0
        print(f"{nodes} nodes: slurmctld {whole:.1f} ms per whole-table read ({mb:.1f} MB "
              f"printed), {one:.1f} ms for `scontrol show node ONE` ({took:.0f} s to measure)")
        before_ms = whole + one  # one try, before: the node's record, then the whole table
        now_ms = whole  # one try, now: the whole table, the node's own record taken from it
        for hours, tries in per_hours.items():
            before = nodes * (hours * 60 / SWEEP_MIN) * before_ms / 1000 / (hours * 3600)
            after = nodes * tries * now_ms / 1000 / (hours * 3600)
            print(f"  every node held for {hours:g} h: slurmctld busy {before:.2f} s/s before "
                  f"(a try every sweep), {after:.2f} s/s now ({tries:.1f} tries per node): "
                  f"{before / after:.1f}x less")
            tag = f"{nodes} nodes {hours:g} h"
            print(f"BENCH\tguard_load\t{tag} before\t{before:.4g}\ts/s")
            print(f"BENCH\tguard_load\t{tag} now\t{after:.4g}\ts/s")
            print(f"BENCH\tguard_load\t{tag} ratio\t{before / after:.1f}\tx")
        print(f"BENCH\tguard_load\t{nodes} nodes ms per table read\t{whole:.4g}\tms")


if __name__ == "__main__":
    main()
