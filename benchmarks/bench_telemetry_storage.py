"""What telemetry costs the historian's disk (issue 25: at most 25 MB/day for the rollups at
16,000 nodes), on SQLite and PostgreSQL.

    python3 benchmarks/bench_telemetry_storage.py [--nodes 200] [--backend sqlite,postgresql]

A fleet of --nodes nodes runs the simulator's job mix (`healthctl sim`, the paper's: most GPU
time in multi-node jobs) for four days; its sacct is ingested as `healthctl ingest sacct`
does. Every node sweeps every 5 minutes of the last three days (the default
[historian] telemetry_retention_days) and each sweep's sample has every metric of the
vocabulary (model.Metric) with values a loaded or idle node shows, as the delivery stores
it (one telemetry_samples row per sweep). `healthctl ingest telemetry`'s rollup then runs as
the ingest timer runs it, every hour at :07 (deploy/manager/rsc-health-ingest.timer), over the
three days and the day after: each job and day is rolled up when it has settled and again
telemetry.LATE later (the second pass, whose reads and rewrites are timed apart). `--schedule
once` runs it once, the morning after, as this bench did before the second pass (one run from
no cursor never makes a second pass).

Measured: bytes of each table with its indexes (SQLite: dbstat pages; PostgreSQL:
pg_total_relation_size after VACUUM), the rows one day adds (the jobs that ended that day and
the day's node-day rows), and from those the bytes per day at 16,000 nodes (scaled by
16,000 / nodes: rows per node-day do not depend on the fleet's size). The samples are a
standing size (three days kept), reported apart. For comparison the same samples and rollups
stored a row per metric (the first layout) in scratch tables.
"""

from __future__ import annotations

import argparse
import csv
import os
import random
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import datetime, timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from sqlalchemy import create_engine, text  # noqa: E402

from rsc_health.config import load_config  # noqa: E402
from rsc_health.historian import telemetry  # noqa: E402
from rsc_health.historian.db import connect  # noqa: E402
from rsc_health.historian.ingest import sacct  # noqa: E402
from rsc_health.historian.ingest.delivery import SAMPLE_COLUMNS  # noqa: E402
from rsc_health.historian.telemetry import load_rollups, rollup  # noqa: E402
from rsc_health.hostlist import expand  # noqa: E402
from rsc_health.model import Metric  # noqa: E402

FLEET = 16_000
PG_ADMIN = os.environ.get("RSC_HEALTH_TEST_PG",
                          "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
SIM_START = datetime(2024, 1, 1)
SIM_DAYS = 4
KEPT_DAYS = 3


def bench(name: str, metric: str, value: float, unit: str) -> None:
    print(f"BENCH\t{name}\t{metric}\t{value:.6g}\t{unit}", flush=True)


def busy_intervals(sacct_path: Path) -> dict[str, list[tuple[datetime, datetime]]]:
    out: dict[str, list] = {}
    with sacct_path.open() as fh:
        for row in csv.DictReader(fh, delimiter="|"):
            try:
                start = datetime.fromisoformat(row["Start"])
                end = datetime.fromisoformat(row["End"])
            except ValueError:
                continue
            for node in expand(row["NodeList"]):
                out.setdefault(node, []).append((start, end))
    return out


def sample_rows(nodes: list[str], busy, t0: datetime, days: int, seed: int = 1):
    """Every sweep's sample of every node, as the delivery stores it: one row per (time,
    node) in SAMPLE_COLUMNS order."""
    rng = random.Random(seed)
    gpus = [f"gpu{i}" for i in range(8)]
    ports = [f"mlx5_{i}/1" for i in range(8)]
    for node in nodes:
        spans = sorted(busy.get(node, []))
        for k in range(days * 288):
            t = t0 + timedelta(minutes=5 * k)
            on = any(s <= t < e for s, e in spans)
            values = {
                Metric.THROTTLE_HW_FRAC: 0.0,
                Metric.THROTTLE_POWER_FRAC: rng.uniform(0.05, 0.4) if on else 0.0,
                Metric.GPU_TEMP_C: float(rng.randint(55, 78) if on else rng.randint(30, 40)),
                Metric.POWER_RATIO: rng.uniform(0.85, 1.05) if on else rng.uniform(0.1, 0.13),
                Metric.PCIE_LINK_RATIO: 1.0,
                Metric.PCIE_REPLAY_RATE: 0.0,
                Metric.NVLINK_ERROR_RATE: 0.0,
                Metric.IB_XMIT_WAIT_RATE: rng.uniform(1e4, 5e6) if on else rng.uniform(0, 50),
                Metric.IB_LINK_RATIO: 1.0,
                # A few correctable remaps on an aged GPU; banks all at max; IB error
                # counters mostly still, a rare burst.
                Metric.REMAPPED_ROWS: float(rng.choice((0, 0, 0, 1, 2))),
                Metric.REMAP_LOW_BANKS: 0.0,
                Metric.IB_ERROR_RATE: rng.uniform(0, 0.05) if rng.random() < 0.1 else 0.0,
            }
            if on:
                values[Metric.SM_CLOCK_RATIO] = rng.uniform(0.7, 1.0)
                # Busy GPUs only, as the family samples it: tens of GB/s over NVLink.
                values[Metric.NVLINK_DATA_RATE] = rng.uniform(1e10, 6e10)
            row: list = [t.strftime("%Y-%m-%d %H:%M:%S.%f"), node]
            for metric in Metric:
                if metric in values:
                    comp = rng.choice(ports if metric.value.startswith("ib_") else gpus)
                    row += [round(values[metric], 6), comp]
                else:
                    row += [None, None]
            yield tuple(row)


def narrow_samples(engine, rows) -> int:
    """The same samples a row per metric (the layout before) in a scratch table."""
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "CREATE TABLE narrow_samples (time TIMESTAMP NOT NULL, node VARCHAR(128) NOT NULL, "
            "metric VARCHAR(32) NOT NULL, value FLOAT NOT NULL, component VARCHAR(64) NOT NULL,"
            " PRIMARY KEY (time, node, metric))"
            + (" WITHOUT ROWID" if engine.dialect.name == "sqlite" else ""))
    long = [(r[0], r[1], m.value, r[2 + 2 * i], r[3 + 2 * i])
            for r in rows for i, m in enumerate(Metric) if r[2 + 2 * i] is not None]
    _insert(engine, "narrow_samples", "(time, node, metric, value, component)", long)
    return len(long)


def _insert(engine, table: str, cols: str, rows: list[tuple]) -> None:
    mark = "?" if engine.dialect.paramstyle == "qmark" else "%s"
    marks = ", ".join([mark] * (cols.count(",") + 1))
    with engine.begin() as conn:
        for i in range(0, len(rows), 20_000):
            conn.exec_driver_sql(f"INSERT INTO {table} {cols} VALUES ({marks})",
                                 rows[i:i + 20_000])


def table_bytes(engine, tables: list[str]) -> dict[str, int]:
    with engine.connect() as conn:
        if engine.dialect.name == "postgresql":
            conn.execution_options(isolation_level="AUTOCOMMIT").exec_driver_sql("VACUUM")
            return {t: int(conn.exec_driver_sql(
                f"SELECT pg_total_relation_size('{t}')").scalar()) for t in tables}
        out = {}
        for t in tables:
            out[t] = int(conn.exec_driver_sql(
                "SELECT coalesce(sum(pgsize), 0) FROM dbstat WHERE name = ? OR name IN "
                "(SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = ?)",
                (t, t)).scalar())
        return out


def narrow_copy(engine, day0, day1) -> int:
    """The same rollups a row per metric (the layout before): rows written."""
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "CREATE TABLE narrow_rollups (key VARCHAR(16) NOT NULL, node VARCHAR(128) NOT NULL, "
            "metric VARCHAR(32) NOT NULL, n INTEGER NOT NULL, mean FLOAT NOT NULL, "
            "min FLOAT NOT NULL, max FLOAT NOT NULL, past INTEGER, "
            "worst_component VARCHAR(64) NOT NULL, PRIMARY KEY (key, node, metric))"
            + (" WITHOUT ROWID" if engine.dialect.name == "sqlite" else ""))
    rows = []
    for kind, lo, hi in (("job", datetime(1970, 1, 1), datetime(2100, 1, 1)),
                         ("day", day0, day1)):
        frame = load_rollups(engine, kind, lo.date() if kind == "day" else lo,
                             hi.date() if kind == "day" else hi)
        first = "job_pk" if kind == "job" else "day"
        rows += [{"key": f"{kind}{r[first]}", "node": r["node"], "metric": r["metric"],
                  "n": int(r["n"]), "mean": float(r["mean"]), "min": float(r["min"]),
                  "max": float(r["max"]),
                  # NULL for a metric with no warn line (nothing counted)
                  "past": None if r["past"] is None or r["past"] != r["past"]
                  else int(r["past"]),
                  "worst_component": r["worst"]} for r in frame.to_dict("records")]
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO narrow_rollups VALUES (:key, :node, :metric, :n, :mean, "
                          ":min, :max, :past, :worst_component)"), rows)
    return len(rows)


def timer_runs(t0: datetime, morning: datetime, schedule: str) -> list[datetime]:
    """When the ingest timer rolls up: hourly at :07 from the first sample's hour until a
    day after the morning after (the last day's second pass), or once, the morning after."""
    if schedule == "once":
        return [morning]
    late = getattr(telemetry, "LATE", timedelta(0))
    runs, t = [], t0 + timedelta(hours=1, minutes=7)
    while t <= morning + late:
        runs.append(t)
        t += timedelta(hours=1)
    return runs


def timed_late_pass() -> list[float]:
    """Seconds spent in the rollup's second pass (telemetry._late_pass), summed per run."""
    spent: list[float] = []
    inner = getattr(telemetry, "_late_pass", None)
    if inner is None:  # a tree from before the second pass
        return spent

    def late_pass(*args, **kwargs):
        t = time.monotonic()
        try:
            return inner(*args, **kwargs)
        finally:
            spent.append(time.monotonic() - t)

    telemetry._late_pass = late_pass
    return spent


def run(backend: str, url: str, sim: Path, nodes: list[str], busy, schedule: str) -> None:
    engine = connect(url, create_missing=True)
    try:
        t = time.monotonic()
        sacct.ingest_text(engine, sim / "sacct.txt", gpus_per_node=8)
        t0 = SIM_START + timedelta(days=SIM_DAYS - KEPT_DAYS)
        rows = list(sample_rows(nodes, busy, t0, KEPT_DAYS))
        _insert(engine, "telemetry_samples", f"({', '.join(SAMPLE_COLUMNS)})", rows)
        load_s = time.monotonic() - t
        narrow_sample_rows = narrow_samples(engine, rows)
        morning = SIM_START + timedelta(days=SIM_DAYS, hours=2)
        cfg = load_config(None)
        late_spent = timed_late_pass()
        runs = timer_runs(t0, morning, schedule)
        t = time.monotonic()
        totals: dict[str, int] = {}
        for now in runs:
            report = rollup(engine, now, cfg)
            for k, v in vars(report).items():
                totals[k] = totals.get(k, 0) + v
        rollup_s = time.monotonic() - t
        late_s = sum(late_spent)
        print(f"   {backend}: {len(rows):,} sweeps ({narrow_sample_rows:,} metric samples) in "
              f"{load_s:.1f}s; {len(runs)} rollup run(s) in {rollup_s:.1f}s (second pass "
              f"{late_s:.1f}s): {totals}", flush=True)
        day0 = SIM_START + timedelta(days=SIM_DAYS - 1)
        day1 = day0 + timedelta(days=1)
        with engine.connect() as conn:
            job_rows_day = conn.execute(text(
                "SELECT count(*) FROM telemetry_job_rollups r JOIN jobs j ON j.id = r.job_pk "
                "WHERE j.\"end\" >= :a AND j.\"end\" < :b"), {"a": day0, "b": day1}).scalar()
            job_rows = conn.execute(text("SELECT count(*) FROM telemetry_job_rollups")).scalar()
            day_rows_day = conn.execute(text(
                "SELECT count(*) FROM telemetry_day_rollups WHERE day = :d"),
                {"d": day0.date()}).scalar()
            day_rows = conn.execute(text("SELECT count(*) FROM telemetry_day_rollups")).scalar()
        narrow_rows = narrow_copy(engine, day0, day1)
        sizes = table_bytes(engine, ["telemetry_samples", "telemetry_job_rollups",
                                     "telemetry_day_rollups", "narrow_rollups",
                                     "narrow_samples"])
        scale = FLEET / len(nodes)
        per_job_row = sizes["telemetry_job_rollups"] / max(1, job_rows)
        per_day_row = sizes["telemetry_day_rollups"] / max(1, day_rows)
        rollup_day = (job_rows_day * per_job_row + day_rows_day * per_day_row) * scale
        narrow_per_row = sizes["narrow_rollups"] / max(1, narrow_rows)
        metrics_per_row = narrow_rows / max(1, job_rows + day_rows)
        narrow_day = (job_rows_day + day_rows_day) * metrics_per_row * narrow_per_row * scale
        samples_standing = sizes["telemetry_samples"] * scale
        name = f"telemetry_storage_{backend}"
        bench(name, "rollup_rows_per_node_day", (job_rows_day + day_rows_day) / len(nodes),
              "rows")
        bench(name, "rollup_bytes_per_row", (per_job_row * job_rows + per_day_row * day_rows)
              / max(1, job_rows + day_rows), "B")
        bench(name, "rollups_per_day_16k_nodes", rollup_day / 1e6, "MB")
        bench(name, "rollups_row_per_metric_per_day_16k_nodes", narrow_day / 1e6, "MB")
        bench(name, "wide_vs_row_per_metric", rollup_day / narrow_day, "x")
        bench(name, "samples_bytes_per_sweep", sizes["telemetry_samples"] / len(rows), "B")
        bench(name, "samples_row_per_metric_bytes_per_sweep",
              sizes["narrow_samples"] / len(rows), "B")
        bench(name, "samples_row_per_metric_standing_16k_nodes",
              sizes["narrow_samples"] * scale / 1e9, "GB")
        bench(name, f"samples_standing_{KEPT_DAYS}d_16k_nodes", samples_standing / 1e9, "GB")
        bench(name, "samples_per_day_16k_nodes", samples_standing / KEPT_DAYS / 1e9, "GB")
        bench(name, "rollup_run_s_per_day", rollup_s / KEPT_DAYS, "s")
        bench(name, "rollup_second_pass_s_per_day", late_s / KEPT_DAYS, "s")
    finally:
        engine.dispose()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    quick = os.environ.get("RSC_BENCH_QUICK", "") not in ("", "0")
    ap.add_argument("--nodes", type=int, default=48 if quick else 200)
    ap.add_argument("--backend", default="sqlite,postgresql")
    ap.add_argument("--schedule", choices=("hourly", "once"), default="hourly",
                    help="the rollup as the ingest timer runs it, or once the morning after")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        sim = Path(tmp) / "sim"
        subprocess.run([sys.executable, "-m", "rsc_health.cli", "sim", "--nodes",
                        str(args.nodes), "--days", str(SIM_DAYS), "--seed", "1", "--out",
                        str(sim)], check=True, capture_output=True, cwd=REPO)
        busy = busy_intervals(sim / "sacct.txt")
        nodes = sorted({n for n in busy} | {f"node{i:04d}" for i in range(args.nodes)})
        nodes = nodes[: args.nodes]
        for backend in args.backend.split(","):
            if backend == "sqlite":
                run(backend, f"sqlite:///{Path(tmp) / 'history.db'}", sim, nodes, busy,
                    args.schedule)
                continue
            admin = create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
            name = f"rsc_bench_{uuid.uuid4().hex[:10]}"
            with admin.connect() as conn:
                conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
            try:
                url = admin.url.set(database=name).render_as_string(hide_password=False)
                run(backend, url, sim, nodes, busy, args.schedule)
            finally:
                with admin.connect() as conn:
                    conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
                admin.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main())
