"""Lemon features + verdicts at the paper's scale (~3,000 nodes, ~4,000,000 job instances over
11 months), on SQLite and PostgreSQL: wall time of the nightly lemon pass and its peak RSS.

    python3 benchmarks/bench_lemons.py --jobs 4000000 --backend both

Jobs, job_nodes and attributions come from the shared generator (_synth.py) (RSC-1-shaped sizes and
outcomes) on a 3,000-node fleet; on top, the lemon inputs: XID check results, out-of-service
events, repair tickets and job exclusions at the simulator's rates, with 1.5% lemon nodes that
carry ten times the XID, outage and ticket rates. The pass (features over the 28 days ending
at the last job, then verdicts with evidence) runs in a fresh subprocess, so the peak RSS is the
pass's own, not the generator's.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from datetime import datetime, timedelta

import _synth as bm  # same directory: the shared job generator and loaders
import numpy as np

N_NODES = 3000
LEMON_SHARE = 0.015


def lemon_inputs(seed: int = 1) -> dict[str, list[dict]]:
    """check_results (xid), node_events, tickets, job_exclusions rows for the whole period."""
    rng = np.random.default_rng(seed)
    days = bm.DAYS
    lemons = set(rng.choice(N_NODES, int(N_NODES * LEMON_SHARE), replace=False).tolist())
    rate = np.where(np.isin(np.arange(N_NODES), list(lemons)), 10.0, 1.0)

    def times(per_node_day: float) -> list[tuple[int, datetime]]:
        counts = rng.poisson(per_node_day * days * rate)
        out = []
        for node, c in enumerate(counts.tolist()):
            for s in rng.uniform(0, days * 86400, c).tolist():
                out.append((node, bm.T0 + timedelta(seconds=int(s))))
        return out

    name = "node{:04d}".format
    checks = [
        dict(
            id=f"x{i}",
            time=t,
            node=name(n),
            source="sweep",
            job_id=None,
            check="xid",
            component=f"gpu{i % 8}",
            status="fail",
            severity="drain_now",
            code=str(rng.choice(["xid79", "xid48", "xid63", "xid94"])),
            reason="",
        )
        for i, (n, t) in enumerate(times(0.03))
    ]
    events = [
        dict(
            node=name(n),
            start=t,
            end=t + timedelta(hours=18),
            state="DRAIN",
            reason="rsc_health:now:xid79:gpu fell off the bus",
            source="sacctmgr",
        )
        for n, t in times(0.0065)
    ]
    tickets = [
        dict(node=name(n), opened=t, closed=t + timedelta(days=1), reason="repair", source="csv")
        for n, t in times(0.002)
    ]
    n_excl = int(4_000_000 * 0.01)
    excl = {}
    for k in range(n_excl):
        node = name(int(rng.integers(0, N_NODES)))
        excl[(str(k + 1), node)] = bm.T0 + timedelta(seconds=int(rng.uniform(0, days * 86400)))
    exclusions = [dict(job_id=j, node=n, time=t) for (j, n), t in excl.items()]
    return {
        "check_results": checks,
        "node_events": _dedupe(events, ("node", "start", "state")),
        "tickets": _dedupe(tickets, ("node", "opened")),
        "job_exclusions": exclusions,
    }


def _dedupe(rows: list[dict], key: tuple[str, ...]) -> list[dict]:
    return list({tuple(r[k] for k in key): r for r in rows}.values())


def load_lemon_inputs(url: str, data: dict[str, list[dict]]) -> None:
    from sqlalchemy import create_engine, insert

    from rsc_health.historian import schema

    engine = create_engine(url)
    with engine.begin() as conn:
        for table, rows in data.items():
            for i in range(0, len(rows), 20000):
                conn.execute(insert(schema.metadata.tables[table]), rows[i : i + 20000])
    engine.dispose()


def run_pass(url: str) -> dict:
    from sqlalchemy import create_engine, func, select

    from rsc_health.historian.lemons.features import lemon_features
    from rsc_health.historian.lemons.verdicts import LemonRules, lemon_verdicts
    from rsc_health.historian.schema import jobs

    engine = create_engine(url)
    with engine.connect() as conn:
        as_of = conn.execute(select(func.max(jobs.c.end))).scalar()
    as_of = as_of if isinstance(as_of, datetime) else datetime.fromisoformat(str(as_of))
    out: dict = {}
    t = time.perf_counter()
    features = lemon_features(engine, as_of, 28)
    out["features_s"] = round(time.perf_counter() - t, 2)
    t = time.perf_counter()
    verdicts = lemon_verdicts(engine, features, as_of, LemonRules.from_config())
    out["verdicts_s"] = round(time.perf_counter() - t, 2)
    out["total_s"] = round(out["features_s"] + out["verdicts_s"], 2)
    out["nodes"] = len(features)
    out["candidates"] = len(verdicts)
    out["peak_rss_mib"] = bm.peak_rss_mib()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    bm.backend_args(ap)
    ap.add_argument("--pass-only", metavar="URL", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.pass_only:
        print(json.dumps(run_pass(args.pass_only)))
        return

    bm.N_NODES = N_NODES
    t = time.perf_counter()
    data = bm.generate(args.jobs)
    extra = lemon_inputs()
    print(
        f"generated {len(data['jobs']['id']):,} job instances, "
        f"{len(data['job_nodes']['job_pk']):,} job_nodes, "
        + ", ".join(f"{len(v):,} {k}" for k, v in extra.items())
        + f" in {time.perf_counter() - t:.1f} s",
        flush=True,
    )
    with tempfile.TemporaryDirectory() as tmp:
        for backend in bm.backends(args.backend):
            if backend == "postgres" and (why := bm.pg_unavailable(args.pg)):
                print(f"postgres: skipped, no server answers at {args.pg}: {why}", flush=True)
                continue
            t = time.perf_counter()
            if backend == "sqlite":
                path = os.path.join(tmp, "bench.db")
                url, pg_name = bm.load_sqlite(path, data), None
            else:
                url, pg_name = bm.load_postgres(args.pg, data)
            load_lemon_inputs(url, extra)
            load_s = time.perf_counter() - t
            try:
                figures = bm.run_child([sys.executable, __file__, "--pass-only", url])
            finally:
                if pg_name:
                    bm.drop_postgres(args.pg, pg_name)
            print(f"{backend}: load {load_s:.1f} s; lemon pass {json.dumps(figures)}", flush=True)
            for metric, unit in (
                ("features_s", "s"),
                ("verdicts_s", "s"),
                ("total_s", "s"),
                ("peak_rss_mib", "MiB"),
            ):
                bm.bench(f"lemons_{backend}", metric, figures[metric], unit)


if __name__ == "__main__":
    main()
