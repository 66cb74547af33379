"""The whole historian pipeline at the paper's scale (issue 6): simulate a fleet, ingest it,
attribute, compute every metric, the lemon pass and the nightly report, on SQLite and on
PostgreSQL, each phase timed (wall, CPU) with its peak RSS.

    python3 benchmarks/bench_pipeline.py [--nodes 3000] [--days 330] [--backend both]
    python3 benchmarks/bench_pipeline.py --nodes 256 --days 90      # demo scale, < 1 minute

The default is the paper's RSC-1: about 3,000 nodes for 11 months (~4,000,000 sacct rows); that
took 6 minutes on 2 cores for both databases on 2026-11-22 (the README's "Performance"
section has the table). RSC_BENCH_QUICK=1
(`benchmarks/run --quick`) makes the default 64 nodes x 14 days.

Every phase runs in a fresh child process (`--phase`), so its peak RSS (VmHWM, which starts
afresh at exec) is that phase's own. The phases call the same functions as `healthctl sim`,
`healthctl ingest ...`, `healthctl attribute`, `healthctl metrics`, `healthctl lemons` and
`healthctl report` (rsc_health/sim/demo.py chains them the same way):

  simulate   rsc_health.sim.simulate -> sacct.txt, events.txt, checks.jsonl, ... (once)
  read_csv   pandas.read_csv of the same sacct.txt (all columns as text): the ingest yardstick
  ingest     sacct (timed on its own: ingest_sacct, and its ratio to read_csv), node events,
             health checks, exclusions, tickets into a fresh historian
  attribute  job failures -> health checks and node events
  analyze    planner statistics once more (PostgreSQL ANALYZE, SQLite's sampled ANALYZE). The
             product does it itself since 2026-11-22: a sacct load of 50k+ rows and every
             `attribute` run refresh them (historian.db.refresh_statistics), because without
             them a freshly loaded PostgreSQL historian planned goodput_lost quadratically
             (140-186 s at 146,000 sacct rows) and attribution for empty tables (183 s at the
             paper's scale); this phase now costs under a second
  metrics    r_f, outcomes, causes, rolling rates, MTTF, goodput, ETTR runs
  lemons     lemon features and verdicts over the lemon window ending at the simulation's end
  report     gather + render the nightly report as of the simulation's end

PostgreSQL gets a fresh database (dropped afterwards) on the server at --pg; it is skipped with
a message when no server answers. Prints a table, then BENCH lines for benchmarks/run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path

import _synth  # same directory: options, peak RSS, child runs, BENCH lines

BACKEND_PHASES = ("ingest", "attribute", "analyze", "metrics", "lemons", "report")


# -- the phases, each in its own process ----------------------------------------------------


def _config():
    from rsc_health.config import load_config

    return load_config(os.devnull)  # the packaged defaults, as on a fresh install


def phase(name: str, sim_dir: Path, url: str | None, nodes: int, days: float, seed: int) -> dict:
    """Run one phase; return its figures (wall, CPU, peak RSS and what it produced). The
    libraries every phase uses are imported before the clocks start; the phase's own modules
    (the report's plotting, say) count towards it."""
    import pandas  # noqa: F401
    import sqlalchemy  # noqa: F401

    cfg = _config()
    wall0, cpu0 = time.perf_counter(), _synth.cpu_s()
    out: dict = {}
    if name == "simulate":
        from rsc_health.sim.config import SimConfig
        from rsc_health.sim.core import simulate

        sim = simulate(SimConfig.from_config(cfg, nodes=nodes, days=days, seed=seed), sim_dir)
        out.update(jobs=sim.jobs, sacct_rows=sim.instances, failures=sim.failures)
    elif name == "read_csv":
        import pandas as pd

        t = time.perf_counter()
        df = pd.read_csv(sim_dir / "sacct.txt", sep="|", dtype=str, keep_default_na=False)
        out.update(rows=len(df), read_csv_s=round(time.perf_counter() - t, 3))
    else:
        from rsc_health.historian import db as hdb

        engine = hdb.connect(url, create_missing=True)
        try:
            out.update(_backend_phase(name, engine, cfg, sim_dir))
        finally:
            engine.dispose()
    out["wall_s"] = round(time.perf_counter() - wall0, 3)
    out["cpu_s"] = round(_synth.cpu_s() - cpu0, 3)
    out["peak_rss_mib"] = _synth.peak_rss_mib()
    return out


def _backend_phase(name: str, engine, cfg, sim_dir: Path) -> dict:
    from rsc_health.sim.historian import truth_of

    _truth, as_of = truth_of(sim_dir)
    if name == "ingest":
        from rsc_health.sim.historian import ingest_fleet

        seconds = ingest_fleet(engine, sim_dir,
                               gpus_per_node=int(cfg.get("historian.gpus_per_node")))
        return {"ingest_sacct_s": round(seconds["sacct.txt"], 3)}
    if name == "attribute":
        from rsc_health.historian.attribute import Window as AttributionWindow
        from rsc_health.historian.attribute import attribute

        attribute(engine, window=AttributionWindow.from_config(cfg))
        return {}
    if name == "analyze":
        from rsc_health.historian.db import refresh_statistics

        refresh_statistics(engine)
        return {}
    if name == "metrics":
        from rsc_health.historian.metrics._sql import Window
        from rsc_health.historian.metrics.goodput import goodput_lost
        from rsc_health.historian.metrics.mttf import mttf_by_size
        from rsc_health.historian.metrics.rates import causes, failure_rate, outcomes, rolling
        from rsc_health.historian.metrics.runs import job_runs

        window = Window(until=as_of)
        steps: dict[str, float] = {}

        def timed(label, fn):
            t = time.perf_counter()
            value = fn()
            steps[label] = round(time.perf_counter() - t, 3)
            return value

        large = int(cfg.get("metrics.large_job_gpus", 128))
        fr = timed("failure_rate", lambda: failure_rate(engine, window, large))
        timed("outcomes", lambda: outcomes(engine, window))
        timed("causes", lambda: causes(engine, window))
        timed("rolling", lambda: rolling(engine, window))
        timed("mttf", lambda: mttf_by_size(engine, window, r_f=fr.r_f))
        timed("goodput", lambda: goodput_lost(engine, window))
        runs = timed("ettr_runs", lambda: job_runs(engine, fr.r_f, window) if fr.r_f > 0 else [])
        return {"ettr_runs_s": steps["ettr_runs"], "steps_s": steps, "runs_48h": len(runs),
                "r_f_per_1000": round(fr.r_f * 1000, 3)}
    if name == "lemons":
        from rsc_health.historian.lemons.features import lemon_features
        from rsc_health.historian.lemons.verdicts import DEFAULTS, LemonRules, lemon_verdicts

        section = {**DEFAULTS, **cfg.section("lemon")}
        window_days = float(section["window_days"])
        features = lemon_features(engine, as_of, window_days,
                                  early_fail_minutes=float(section["early_fail_minutes"]),
                                  history_days=float(section["history_days"]))
        verdicts = lemon_verdicts(engine, features, as_of, LemonRules.from_config(section),
                                  window_days=window_days,
                                  max_evidence=int(section["max_evidence"]),
                                  history_days=float(section["history_days"]))
        return {"nodes": len(features), "lemons": len(verdicts)}
    if name == "report":
        from rsc_health.report.gather import GatherOptions, gather
        from rsc_health.report.render import write_report

        options = GatherOptions.from_config(cfg.section("report"), cfg.section("lemon"),
                                            cfg.section("ettr"), cfg.section("metrics"))
        data = gather(engine, as_of, options)
        written = write_report(data, sim_dir / f"report-{engine.dialect.name}")
        return {"notes": len(data.notes), "html_kib": round(written.html.stat().st_size / 1024)}
    raise ValueError(f"unknown phase {name!r}")


# -- the driver ----------------------------------------------------------------------------


def _run_phase(name: str, args, sim_dir: Path, url: str | None = None) -> dict:
    argv = [sys.executable, os.path.abspath(__file__), "--phase", name, "--sim-dir", str(sim_dir),
            "--nodes", str(args.nodes), "--days", str(args.days), "--seed", str(args.seed)]
    if url:
        argv += ["--url", url]
    print(f"  {name} ...", end="", flush=True)
    figures = _synth.run_child(argv)
    print(f" {figures['wall_s']:.1f} s", flush=True)
    return figures


def _fresh_pg(admin_url: str) -> tuple[str, str]:
    from sqlalchemy import create_engine, text

    name = f"rsc_bench_pipeline_{uuid.uuid4().hex[:10]}"
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = admin.url.set(database=name).render_as_string(hide_password=False)
    admin.dispose()
    return url, name


def pipeline(args) -> dict[str, dict[str, dict]]:
    """{backend: {phase: figures}}; the shared phases (simulate, read_csv) under "files"."""
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="bench-pipeline-"))
    sim_dir = work / "sim"
    results: dict[str, dict[str, dict]] = {"files": {}}
    try:
        print(f"simulating {args.nodes} nodes x {args.days:g} days into {sim_dir}", flush=True)
        results["files"]["simulate"] = _run_phase("simulate", args, sim_dir)
        results["files"]["read_csv"] = _run_phase("read_csv", args, sim_dir)
        for backend in _synth.backends(args.backend):
            pg_name = None
            if backend == "postgres":
                why = _synth.pg_unavailable(args.pg)
                if why:
                    print(f"postgres: skipped, no server answers at {args.pg}: {why}", flush=True)
                    continue
                url, pg_name = _fresh_pg(args.pg)
            else:
                db = work / "historian.db"
                url = f"sqlite:///{db}"
            print(f"{backend}:", flush=True)
            try:
                phases = [p for p in BACKEND_PHASES if p != "analyze" or args.analyze]
                results[backend] = {p: _run_phase(p, args, sim_dir, url) for p in phases}
            finally:
                if pg_name:
                    _synth.drop_postgres(args.pg, pg_name)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return results


def report(results: dict[str, dict[str, dict]], args) -> None:
    files = results["files"]
    read_csv_s = files["read_csv"]["read_csv_s"]
    rows = [("files", p, f) for p, f in files.items()]
    rows += [(b, p, f) for b, phases in results.items() if b != "files" for p, f in phases.items()]
    sim = files["simulate"]
    print()
    print(f"pipeline: {args.nodes} nodes x {args.days:g} days, {sim['jobs']:,} jobs, "
          f"{sim['sacct_rows']:,} sacct rows")
    print(f"{'backend':9} {'phase':10} {'wall s':>9} {'cpu s':>9} {'peak RSS MiB':>13}  notes")
    for backend, name, f in rows:
        notes = ""
        if name == "ingest":
            ratio = f["ingest_sacct_s"] / read_csv_s if read_csv_s > 0 else float("nan")
            notes = f"sacct {f['ingest_sacct_s']:.1f} s = {ratio:.1f}x read_csv"
        elif name == "metrics":
            slow = max(f["steps_s"], key=f["steps_s"].get)
            notes = (f"ETTR runs {f['ettr_runs_s']:.1f} s, slowest {slow} "
                     f"{f['steps_s'][slow]:.1f} s, r_f {f['r_f_per_1000']}/1000 node-days")
        elif name == "lemons":
            notes = f"{f['lemons']} candidates of {f['nodes']} nodes"
        elif name == "read_csv":
            notes = f"{f['rows']:,} rows"
        print(f"{backend:9} {name:10} {f['wall_s']:9.1f} {f['cpu_s']:9.1f} "
              f"{f['peak_rss_mib']:13.1f}  {notes}")
    for backend, phases in results.items():
        if backend == "files":
            continue
        total_wall = sum(f["wall_s"] for f in phases.values())
        total_cpu = sum(f["cpu_s"] for f in phases.values())
        print(f"{backend:9} {'total':10} {total_wall:9.1f} {total_cpu:9.1f} "
              f"{max(f['peak_rss_mib'] for f in phases.values()):13.1f}  "
              "ingest .. report, simulate and read_csv not included")
    print()
    _synth.bench("pipeline", "nodes", args.nodes, "nodes")
    _synth.bench("pipeline", "days", float(args.days), "days")
    _synth.bench("pipeline", "sacct_rows", sim["sacct_rows"], "rows")
    for backend, name, f in rows:
        tag = f"pipeline_{backend}"
        _synth.bench(tag, f"{name}_wall", f["wall_s"], "s")
        _synth.bench(tag, f"{name}_cpu", f["cpu_s"], "s")
        _synth.bench(tag, f"{name}_peak_rss", f["peak_rss_mib"], "MiB")
        if name == "ingest" and read_csv_s > 0:
            _synth.bench(tag, "ingest_sacct_wall", f["ingest_sacct_s"], "s")
            _synth.bench(tag, "ingest_vs_read_csv", f["ingest_sacct_s"] / read_csv_s, "x")
        if name == "metrics":
            _synth.bench(tag, "ettr_runs_wall", f["ettr_runs_s"], "s")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    quick = _synth.QUICK
    ap.add_argument("--nodes", type=int, default=64 if quick else 3000)
    ap.add_argument("--days", type=float, default=14 if quick else 330)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--backend", choices=["sqlite", "postgres", "both"], default="both")
    ap.add_argument("--pg", default=_synth.PG_DEFAULT, help="PostgreSQL admin URL")
    ap.add_argument("--work", help="scratch directory (default: a temporary one, removed)")
    ap.add_argument("--keep", action="store_true", help="keep the scratch directory")
    ap.add_argument("--no-analyze", dest="analyze", action="store_false",
                    help="skip the analyze phase (metrics then run on the planner's defaults)")
    ap.add_argument("--phase", choices=("simulate", "read_csv", *BACKEND_PHASES),
                    help=argparse.SUPPRESS)
    ap.add_argument("--sim-dir", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.phase:
        figures = phase(args.phase, args.sim_dir, args.url, args.nodes, args.days, args.seed)
        print(json.dumps(figures))
        return 0
    report(pipeline(args), args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
