"""Attribution's rule (issue 26): the finding that caused the action (our drain's code, else
the most severe, then the earliest; a row_number over each job, node and family) against the
rule it replaced (the alphabetically smallest code: a GROUP BY with min()), on the same
simulated historian in the same run: the time each takes and how many (job, node, family)
rows name a different code.

    python3 benchmarks/bench_attribution_rule.py [--nodes 512] [--days 60] [--backend both]

The simulator writes real sacct, sacctmgr and check formats; it records no rsc-health actions,
so this measures the severity-then-time part and the cost of the (empty) drain lookup. Prints
a table, then BENCH lines for benchmarks/run.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import _synth  # same directory: options, BENCH lines


def _old_rule(engine, window) -> None:
    """The replaced rule, kept here only to be measured against: attribute() as it was, with
    min(code) / min(state) per group."""
    from sqlalchemy import and_, delete, exists, func, literal, or_, select

    from rsc_health.historian import attribute as at
    from rsc_health.historian.db import refresh_statistics, writer

    J, JN, C, A, E = at.J, at.JN, at.C, at.A, at.E
    refresh_statistics(engine)
    targets = select(J.c.id).where(J.c.state.in_(at.FAILED_STATES), J.c.end.is_not(None))
    lo = at._shift(engine, J.c.end, -window.before_s)
    hi = at._shift(engine, J.c.end, window.after_s)
    by_check = (
        select(J.c.id, C.c.node, C.c.check, func.min(C.c.code), func.min(C.c.id),
               literal("check"))
        .select_from(J.join(JN, JN.c.job_pk == J.c.id))
        .join(C, and_(C.c.node == JN.c.node, C.c.time <= hi, C.c.last_seen >= lo))
        .where(J.c.id.in_(targets), at.failing_check())
        .group_by(J.c.id, C.c.node, C.c.check)
    )
    has_row = exists().where(A.c.job_pk == J.c.id)
    by_event = (
        select(J.c.id, E.c.node, literal("node_down"), func.min(E.c.state), func.min(E.c.id),
               literal("event"))
        .select_from(J.join(JN, JN.c.job_pk == J.c.id))
        .join(E, and_(E.c.node == JN.c.node, E.c.start <= hi,
                      or_(E.c.end.is_(None), E.c.end >= J.c.end)))
        .where(J.c.id.in_(targets), J.c.state == "NODE_FAIL", ~has_row)
        .group_by(J.c.id, E.c.node)
    )
    unattributed = select(J.c.id, literal(None), literal("unattributed"), literal(""),
                          literal(""), literal("unattributed")).where(
        J.c.id.in_(targets), J.c.state == "NODE_FAIL", ~has_row)
    cols = [A.c.job_pk, A.c.node, A.c.cause, A.c.code, A.c.evidence, A.c.kind]
    with writer(engine).begin() as conn:  # as attribute() did, counts included
        conn.execute(delete(A).where(A.c.job_pk.in_(targets)))
        for query in (by_check, by_event, unattributed):
            conn.execute(A.insert().from_select(cols, query))
        conn.execute(select(A.c.kind, func.count(func.distinct(A.c.job_pk)))
                     .where(A.c.job_pk.in_(targets)).group_by(A.c.kind)).all()
        conn.execute(select(func.count()).select_from(targets.subquery())).scalar()


def _rows(engine) -> dict:
    from sqlalchemy import select

    from rsc_health.historian.schema import attributions as A

    with engine.connect() as conn:
        return {(j, n, c): code for j, n, c, code in conn.execute(
            select(A.c.job_pk, A.c.node, A.c.cause, A.c.code))}


def _measure(backend: str, url: str, sim_dir: Path, window, args) -> None:
    from rsc_health.historian import db as hdb
    from rsc_health.historian.attribute import attribute
    from rsc_health.sim.historian import ingest_fleet

    engine = hdb.connect(url, create_missing=True)
    try:
        ingest_fleet(engine, sim_dir)
        times: dict[str, list[float]] = {"old": [], "new": []}
        runs = {"old": lambda: _old_rule(engine, window),
                "new": lambda: attribute(engine, window=window)}
        rows = {}
        for i in range(args.repeat):  # interleaved, first one then the other first
            for name in (("old", "new") if i % 2 == 0 else ("new", "old")):
                t = time.perf_counter()
                runs[name]()
                times[name].append(time.perf_counter() - t)
                rows[name] = _rows(engine)
    finally:
        engine.dispose()
    old, new = rows["old"], rows["new"]
    best = {k: min(v) for k, v in times.items()}
    differ = sum(1 for k in old if new.get(k) != old[k])
    print(f"{args.nodes} nodes x {args.days:g} days ({backend}), best of {args.repeat}:")
    print(f"  old rule (min code)         {best['old']:8.3f} s")
    print(f"  new rule (drain, sev, time) {best['new']:8.3f} s   "
          f"ratio {best['new'] / best['old']:.2f}")
    print(f"  attribution rows: {len(old)}; naming another code now: {differ}")
    _synth.bench(f"attribution_rule_{backend}", "new_over_old", best["new"] / best["old"], "x")
    _synth.bench(f"attribution_rule_{backend}", "rows_changed", differ, "rows")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=64 if _synth.QUICK else 512)
    ap.add_argument("--days", type=float, default=14 if _synth.QUICK else 60)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=4)
    ap.add_argument("--backend", choices=["sqlite", "postgres", "both"], default="both")
    ap.add_argument("--pg", default=_synth.PG_DEFAULT, help="PostgreSQL admin URL")
    args = ap.parse_args()

    from rsc_health.config import load_config
    from rsc_health.historian.attribute import Window
    from rsc_health.sim.config import SimConfig
    from rsc_health.sim.core import simulate

    cfg = load_config("/dev/null")
    window = Window.from_config(cfg)
    with tempfile.TemporaryDirectory() as tmp:
        sim_dir = Path(tmp) / "sim"
        simulate(SimConfig.from_config(cfg, nodes=args.nodes, days=args.days, seed=args.seed),
                 sim_dir)
        for backend in _synth.backends(args.backend):
            if backend == "postgres":
                why = _synth.pg_unavailable(args.pg)
                if why:
                    print(f"PostgreSQL skipped: {why}")
                    continue
                url, name = _synth.create_postgres(args.pg)
            else:
                url, name = f"sqlite:///{Path(tmp) / 'h.db'}", ""
            try:
                _measure(backend, url, sim_dir, window, args)
            finally:
                if name:
                    _synth.drop_postgres(args.pg, name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
