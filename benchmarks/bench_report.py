"""Benchmark the nightly report: wall time per phase and peak RSS.

Three ways to feed it, from cheapest to most real:

  python3 benchmarks/bench_report.py --synthetic
      ReportData built directly at the paper's scale (3,000 nodes of lemon features, 11 months
      of daily rolling rates by mode, every size bucket): measures plotting + rendering alone.
  python3 benchmarks/bench_report.py --db URL [--as-of DATE]
      gather + render against an existing historian (SQLite or PostgreSQL), e.g. one a
      historian or lemon benchmark filled at the paper's scale (3,000 nodes, 4M jobs, 11 months).
  python3 benchmarks/bench_report.py --sim-nodes 3000 --sim-days 330 [--into URL]
      simulate a fleet (rsc_health.sim), ingest and attribute it into a fresh SQLite historian
      under --work (or the empty database at URL, e.g. PostgreSQL), then gather + render as of
      the end of the simulated period.

Prints one JSON object: seconds per phase, peak RSS in MiB, the data sizes, then BENCH lines
(gather, render and report wall time, CPU time, peak RSS) for benchmarks/run, named
report_<source>_<database>. The nightly target is under 2 minutes on 2 cores (issue 5).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pandas as pd

from rsc_health.historian.lemons.features import PAPER_FEATURES
from rsc_health.report.data import ReportData
from rsc_health.report.render import write_report

MODES = ("infiniband", "mount", "gpu_memory", "pcie", "xid", "nvlink", "gpu", "node_down")
SIZES = [8, 16, 32, 64, 128, 256, 512, 1024, 2048]


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def cpu_s() -> float:
    use = resource.getrusage(resource.RUSAGE_SELF)
    return use.ru_utime + use.ru_stime


def synthetic(nodes: int, days: int, lemons: int, seed: int = 0) -> ReportData:
    """Paper-scale shapes with paper-like values; what matters here is the size of each frame."""
    rng = np.random.default_rng(seed)
    as_of = datetime(2024, 9, 1)
    dates = pd.date_range(as_of - timedelta(days=days - 1), as_of, freq="D")
    rolling = pd.DataFrame(
        {
            "time": np.repeat(dates.values, len(MODES)),
            "mode": np.tile(MODES, len(dates)),
            "rate_per_1000_node_days": rng.gamma(1.5, 0.6, len(dates) * len(MODES)),
        }
    )
    names = [f"node{i:04d}" for i in range(nodes)]
    features = pd.DataFrame({"node": names})
    for feature in PAPER_FEATURES:
        features[feature] = rng.poisson(0.3, nodes)
    features["single_node_node_failure_rate"] = rng.beta(0.3, 20, nodes)
    r_f = 6.5e-3
    mttf = pd.DataFrame({"gpus": SIZES})
    mttf["projected_hours"] = 24.0 / (mttf["gpus"] / 8 * r_f)
    mttf["mttf_hours"] = mttf["projected_hours"] * rng.uniform(0.7, 1.4, len(SIZES))
    mttf["ci_low_hours"] = mttf["mttf_hours"] * 0.75
    mttf["ci_high_hours"] = mttf["mttf_hours"] * 1.4
    ettr_gpus = rng.choice([128, 256, 512, 1024, 2048, 4096], 200)
    measured = rng.uniform(0.8, 0.95, 200)
    picked = rng.choice(nodes, lemons, replace=False)
    return ReportData(
        as_of=as_of,
        outcomes=pd.DataFrame({
            "state": ["COMPLETED", "FAILED", "FAILED (HW)", "CANCELLED", "PREEMPTED",
                      "REQUEUED", "NODE_FAIL", "TIMEOUT", "OUT_OF_MEMORY"],
            "jobs": [2.4e6, 9.6e5, 4e3, 1.4e5, 3.4e5, 8e4, 4e3, 2.4e4, 4e3],
            "gpu_hours": [3e7, 6e6, 2e6, 1e6, 4e6, 1e6, 6e6, 3e5, 1e4],
        }),
        causes=pd.DataFrame({
            "cause": list(MODES) + ["unattributed"],
            "failures": rng.integers(20, 400, len(MODES) + 1),
            "rate_per_gpu_hour": rng.uniform(1e-7, 1e-5, len(MODES) + 1),
        }),
        rolling=rolling,
        mttf=mttf,
        goodput=pd.DataFrame({
            "gpus": SIZES,
            "failure_gpu_hours": rng.uniform(1e2, 1e5, len(SIZES)),
            "preemption_gpu_hours": rng.uniform(1e2, 1e4, len(SIZES)),
        }),
        ettr=pd.DataFrame({
            "run": [f"run{i}" for i in range(200)], "gpus": ettr_gpus, "measured": measured,
            "ci_low": measured - 0.03, "ci_high": measured + 0.03,
            "expected": 1 - ettr_gpus / 8 * r_f * 0.05,
        }),
        features=features,
        lemons=pd.DataFrame({
            "node": [names[i] for i in picked],
            "rules": [["node_fails>=3"]] * lemons,
            "evidence": [["node_fails=4 >= 3", "failed jobs: 1 FAILED (xid)"]] * lemons,
        }),
        guard={"state": "not triggered", "detail": "bench"},
    )


def simulate_historian(
    nodes: int, days: float, work: Path, seed: int, into: str | None = None
) -> tuple[str, datetime]:
    from rsc_health.sim.config import SimConfig
    from rsc_health.sim.historian import simulated_historian

    fleet = simulated_historian(SimConfig(nodes=nodes, days=days, seed=seed),
                                work / f"sim-{nodes}x{days:g}-seed{seed}", url=into)
    return fleet.url, fleet.as_of


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src = p.add_mutually_exclusive_group()
    src.add_argument("--synthetic", action="store_true", help="paper-scale ReportData (default)")
    src.add_argument("--db", metavar="URL", help="gather from this historian")
    src.add_argument("--sim-nodes", type=int, metavar="N", help="simulate N nodes first")
    p.add_argument("--sim-days", type=float, default=330)
    p.add_argument("--into", metavar="URL",
                   help="with --sim-nodes: ingest into this (empty) historian, e.g. a fresh "
                        "PostgreSQL database, instead of a SQLite file under --work")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--as-of", type=datetime.fromisoformat, help="with --db (default: now)")
    quick = os.environ.get("RSC_BENCH_QUICK", "") not in ("", "0")
    p.add_argument("--nodes", type=int, default=256 if quick else 3000, help="--synthetic: nodes")
    p.add_argument("--days", type=int, default=30 if quick else 330,
                   help="--synthetic: days of rolling rates")
    p.add_argument("--lemons", type=int, default=25, help="--synthetic: lemon candidates")
    p.add_argument("--work", type=Path,
                   help="scratch directory, kept (default: a temp dir, removed at the end)")
    p.add_argument("--sweep-year", action="store_true",
                   help="with --sim-nodes or --db: add a year of five-minute sweeps of every "
                        "node (intervals, heartbeat and check rollups) before the report")
    p.add_argument("--nightly", action="store_true",
                   help="with --sim-nodes or --db: write the report as of the day before first, "
                        "then time tonight's, which reads last night's report.json")
    p.add_argument("--changes-per-node-day", type=float, default=0.5,
                   help="--sweep-year: state changes per node-day")
    p.add_argument("--skip", action="append", default=[], metavar="SECTION",
                   help="section not gathered (repeatable), as [report] skip")
    args = p.parse_args(argv)

    if args.work is None:
        with tempfile.TemporaryDirectory(prefix="bench-report-") as tmp:
            return _bench(args, Path(tmp), kept=False)
    args.work.mkdir(parents=True, exist_ok=True)
    return _bench(args, args.work, kept=True)


def _bench(args: argparse.Namespace, work: Path, *, kept: bool) -> int:
    result: dict = {"source": "synthetic"}
    t0 = time.perf_counter()
    cpu0 = cpu_s()
    if args.db or args.sim_nodes:
        from rsc_health.historian.db import connect
        from rsc_health.report.gather import GatherOptions, gather

        if args.sim_nodes:
            url, as_of = simulate_historian(args.sim_nodes, args.sim_days, work, args.seed,
                                           args.into)
            result.update(source="sim", sim_nodes=args.sim_nodes, sim_days=args.sim_days,
                          simulate_ingest_s=round(time.perf_counter() - t0, 2))
        else:
            url = args.db
            as_of = args.as_of or datetime.now(UTC).replace(tzinfo=None, microsecond=0)
            result["source"] = "db"
        engine = connect(url, create_missing=True)
        result["dialect"] = engine.dialect.name
        if args.sweep_year:
            from _sweeps import fill_sweep_year, fleet_nodes

            ts = time.perf_counter()
            nodes = fleet_nodes(engine, args.sim_nodes or args.nodes)
            result["sweep_rows"] = fill_sweep_year(
                engine, as_of, nodes, changes_per_node_day=args.changes_per_node_day,
                seed=args.seed)
            result["sweep_fill_s"] = round(time.perf_counter() - ts, 2)
            if engine.dialect.name == "postgresql":
                with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as c:
                    c.exec_driver_sql("ANALYZE")
        opts = GatherOptions.from_config({"skip": args.skip}, {})
        if args.nightly:
            # Last night's report first (its gather is the first-night cost: days listed walk
            # back a week of lemon verdicts); tonight's then carries them on from report.json.
            import dataclasses

            from rsc_health.report.render import load_previous

            tp = time.perf_counter()
            last_night = gather(engine, as_of - timedelta(days=1), opts)
            result["first_night_gather_s"] = round(time.perf_counter() - tp, 2)
            write_report(last_night, work / "report")
            opts = dataclasses.replace(opts,
                                       previous=load_previous(work / "report" / "report.json"))
        t1 = time.perf_counter()
        c1 = cpu_s()
        marks: list[tuple[str, float]] = []
        data = gather(engine, as_of, opts,
                      progress=lambda s: marks.append((s, time.perf_counter())))
        engine.dispose()
        done = time.perf_counter()
        result["gather_s"] = round(done - t1, 2)
        result["gather_cpu_s"] = round(cpu_s() - c1, 2)
        # Each progress mark starts a step; it ends where the next one starts.
        ends = [t for _, t in marks[1:]] + [done]
        result["gather_steps_s"] = {
            label: round(end - start, 2) for (label, start), end in zip(marks, ends, strict=True)
        }
        with connect(url, create_missing=True).connect() as conn:
            from sqlalchemy import func, select

            from rsc_health.historian.schema import jobs

            result["jobs"] = conn.execute(select(func.count()).select_from(jobs)).scalar_one()
        result["notes"] = data.notes
    else:
        data = synthetic(args.nodes, args.days, args.lemons, args.seed)
    result["rss_before_render_mib"] = round(peak_rss_mib(), 1)
    t2 = time.perf_counter()
    c2 = cpu_s()
    written = write_report(data, work / "report")
    result["render_s"] = round(time.perf_counter() - t2, 2)
    result["render_cpu_s"] = round(cpu_s() - c2, 2)
    result["total_cpu_s"] = round(cpu_s() - cpu0, 2)
    result.update(
        report_s=round(result.get("gather_s", 0) + result["render_s"], 2),
        peak_rss_mib=round(peak_rss_mib(), 1),
        nodes=len(data.features),
        lemons=len(data.lemons),
        rolling_rows=len(data.rolling),
        out=str(written.html) if kept else "(removed with its temp dir; --work DIR keeps it)",
    )
    print(json.dumps(result, indent=2, default=str))
    name = f"report_{result['source']}" + (f"_{result['dialect']}" if "dialect" in result else "")
    for metric, key, unit in (
        ("gather_wall", "gather_s", "s"),
        ("gather_cpu", "gather_cpu_s", "s"),
        ("render_wall", "render_s", "s"),
        ("render_cpu", "render_cpu_s", "s"),
        ("report_wall", "report_s", "s"),
        ("peak_rss", "peak_rss_mib", "MiB"),
    ):
        if key in result:
            print(f"BENCH\t{name}\t{metric}\t{result[key]:.2f}\t{unit}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
