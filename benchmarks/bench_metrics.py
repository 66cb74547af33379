"""The whole metric set over ~4,000,000 synthetic jobs (the paper's 11 months, two clusters),
on SQLite and PostgreSQL: load time, wall time per metric, and the metric process' peak RSS.

    python3 benchmarks/bench_metrics.py --jobs 4000000 --backend both

Rows are synthetic but shaped like the paper's RSC-1 (Fig. 3 outcome shares, Fig. 6 job sizes):
~40% 1-GPU jobs, a few thousand-GPU jobs, NODE_FAIL ~0.1% with requeues, a few percent of
FAILED jobs attributed to a health check. The metrics run in a fresh subprocess so its peak RSS
is the metrics' own, not the generator's.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import _synth  # same directory: the shared generator, loaders and BENCH lines
from _synth import drop_postgres, generate, load_postgres, load_sqlite, peak_rss_mib

__all__ = ["drop_postgres", "generate", "load_postgres", "load_sqlite", "run_metrics"]


def run_metrics(url: str) -> dict:
    """The whole metric set, timed one by one; peak RSS of this process at the end."""
    from sqlalchemy import create_engine

    from rsc_health.historian.metrics.goodput import goodput_lost
    from rsc_health.historian.metrics.mttf import mttf_by_size
    from rsc_health.historian.metrics.rates import causes, failure_rate, outcomes, rolling
    from rsc_health.historian.metrics.runs import job_runs

    engine = create_engine(url)
    out: dict = {}
    cpu0 = time.process_time()

    def timed(name, fn):
        t = time.perf_counter()
        value = fn()
        out[name] = round(time.perf_counter() - t, 2)
        return value

    fr = timed("failure_rate", lambda: failure_rate(engine))
    timed("outcomes", lambda: outcomes(engine))
    timed("causes", lambda: causes(engine))
    timed("rolling", lambda: rolling(engine))
    timed("mttf", lambda: mttf_by_size(engine, r_f=fr.r_f))
    timed("goodput", lambda: goodput_lost(engine))
    runs = timed("ettr_runs", lambda: job_runs(engine, fr.r_f))
    out["total_s"] = round(sum(v for v in out.values()), 2)
    out["cpu_s"] = round(time.process_time() - cpu0, 2)
    out["peak_rss_mib"] = peak_rss_mib()
    out["r_f_per_1000"] = round(fr.r_f * 1000, 3)
    out["runs_48h"] = len(runs)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    _synth.backend_args(ap)
    ap.add_argument("--metrics-only", metavar="URL", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.metrics_only:
        print(json.dumps(run_metrics(args.metrics_only)))
        return

    t = time.perf_counter()
    data = generate(args.jobs)
    sizes = {k: len(next(iter(v.values()))) for k, v in data.items()}
    print(f"generated {sizes} rows in {time.perf_counter() - t:.1f} s", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for backend in _synth.backends(args.backend):
            if backend == "postgres" and (why := _synth.pg_unavailable(args.pg)):
                print(f"postgres: skipped, no server answers at {args.pg}: {why}", flush=True)
                continue
            t = time.perf_counter()
            if backend == "sqlite":
                url, pg_name = load_sqlite(os.path.join(tmp, "bench.db"), data), None
            else:
                url, pg_name = load_postgres(args.pg, data)
            load_s = time.perf_counter() - t
            try:
                figures = _synth.run_child([sys.executable, __file__, "--metrics-only", url])
            finally:
                if pg_name:
                    drop_postgres(args.pg, pg_name)
            print(f"{backend}: load {load_s:.1f} s; metrics {json.dumps(figures)}", flush=True)
            name = f"metrics_{backend}"
            _synth.bench(name, "jobs", args.jobs, "jobs")
            _synth.bench(name, "load_wall", load_s, "s")
            _synth.bench(name, "metrics_wall", figures["total_s"], "s")
            _synth.bench(name, "metrics_cpu", figures["cpu_s"], "s")
            _synth.bench(name, "ettr_runs_wall", figures["ettr_runs"], "s")
            _synth.bench(name, "peak_rss", figures["peak_rss_mib"], "MiB")


if __name__ == "__main__":
    main()
