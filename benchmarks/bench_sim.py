"""Fleet simulator at the paper's scale: 3,000 nodes x 330 days (~11 months, ~3.5M jobs).

    python3 benchmarks/bench_sim.py [--nodes 3000] [--days 330] [--seed 1] [--out DIR]

The simulation runs in its own process so the peak RSS is the simulator's alone. Prints wall
time, peak RSS, job and sacct-row counts, per-phase timings, and the job-mix shares the paper
reports (Fig. 3, Fig. 6, Obs. 7) measured from the written sacct.txt, as BENCH lines for
benchmarks/run.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r"""
import json, resource, sys, time
from rsc_health.sim import SimConfig, simulate
nodes, days, seed, out = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
t0 = time.perf_counter()
r = simulate(SimConfig(nodes=nodes, days=days, seed=seed), out)
wall = time.perf_counter() - t0
use = resource.getrusage(resource.RUSAGE_SELF)
rss = use.ru_maxrss / 1024
print(json.dumps({"wall_s": wall, "cpu_s": use.ru_utime + use.ru_stime, "rss_mb": rss,
                  "jobs": r.jobs, "rows": r.instances,
                  "failures": r.failures, "lemons": len(r.lemons), "rf_true": r.rf_true,
                  "timings": r.timings}))
"""


def job_mix(sacct: Path) -> dict[str, float]:
    """Shares from the sacct text with pandas, as an analyst would compute them."""
    import pandas as pd

    df = pd.read_csv(sacct, sep="|", usecols=["JobIDRaw", "State", "Start", "End", "AllocTRES"],
                     dtype=str)
    gpus = df["AllocTRES"].str.extract(r"gres/gpu=(\d+)")[0].astype(int)
    first = ~df["JobIDRaw"].duplicated()
    done = df["End"] != "Unknown"
    hours = (pd.to_datetime(df.loc[done, "End"]) - pd.to_datetime(df.loc[done, "Start"])
             ).dt.total_seconds() / 3600
    gpu_h = gpus[done] * hours
    states = df["State"].str.split(" ").str[0].value_counts(normalize=True)
    return {
        "single_gpu_jobs": float((gpus[first] == 1).mean()),
        "sub_node_jobs": float((gpus[first] < 8).mean()),
        "gpu_time_256plus": float(gpu_h[gpus[done] >= 256].sum() / gpu_h.sum()),
        **{f"state_{k}": float(v) for k, v in states.items()},
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=3000)
    ap.add_argument("--days", type=float, default=330)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench_sim_") as tmp:
        out = args.out or Path(tmp)
        proc = subprocess.run(
            [sys.executable, "-c", CHILD, str(args.nodes), str(args.days), str(args.seed),
             str(out)], capture_output=True, text=True, check=True,
        )
        res = json.loads(proc.stdout.strip().splitlines()[-1])
        mix = job_mix(out / "sacct.txt")
        size_mb = (out / "sacct.txt").stat().st_size / 2**20
    scale = f"{args.nodes}x{args.days:g}d"
    print(json.dumps({**res, "sacct_mb": round(size_mb, 1), "mix": mix}, indent=1))
    for metric, value, unit in (
        (f"simulate {scale} wall", f"{res['wall_s']:.1f}", "s"),
        (f"simulate {scale} CPU (user+sys)", f"{res['cpu_s']:.1f}", "s"),
        (f"simulate {scale} peak RSS", f"{res['rss_mb']:.0f}", "MiB"),
        ("jobs (JobIDs)", f"{res['jobs']}", "jobs"),
        ("sacct rows (instances)", f"{res['rows']}", "rows"),
        ("node failures injected", f"{res['failures']}", "failures"),
        ("single-GPU jobs", f"{mix['single_gpu_jobs'] * 100:.1f}", "%"),
        ("jobs under one node", f"{mix['sub_node_jobs'] * 100:.1f}", "%"),
        ("GPU time in 256+ GPU jobs", f"{mix['gpu_time_256plus'] * 100:.1f}", "%"),
    ):
        print(f"BENCH\tsim\t{metric}\t{value}\t{unit}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
