"""Ingest speed: `healthctl ingest sacct` of 1,000,000 rows vs `pandas.read_csv` of the same file.

    python3 benchmarks/bench_ingest.py [--rows 1000000] [--sacct FILE] [--out bench-out]
                                       [--pg URL | --no-pg] [--repeat N]

Each phase runs in its own process so its peak RSS is its own. SQLite always; PostgreSQL
too when --pg or $RSC_HEALTH_TEST_PG names a server that answers (an admin URL: the
benchmark creates a scratch database there and drops it after), else a note says it was
skipped. The ingest's CPU is this process's; on PostgreSQL the server backend's CPU is
reported beside it when the server runs on this machine. The target (issue 4) is
ingest <= 3x read_csv (wall). The generated file is real `sacct -a -X -D --parsable2` output
in form: header, `Unknown` ends for running jobs, `CANCELLED by <uid>`, requeued instances sharing a
JobIDRaw, array tasks `1234_7`, typed and untyped GPU gres in AllocTRES. Pass --sacct to time
a file from `healthctl sim` or a real cluster instead.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np

HEADER = (
    "JobIDRaw|JobID|JobName|User|Partition|State|ExitCode|Submit|Eligible|Start|End|NNodes|"
    "NodeList|AllocTRES"
)
STATES = np.array(
    [
        "COMPLETED",
        "FAILED",
        "CANCELLED by 1000",
        "TIMEOUT",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "REQUEUED",
    ]
)
STATE_P = np.array([0.62, 0.16, 0.12, 0.04, 0.01, 0.02, 0.02, 0.01])


def _fmt(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S")


def generate(path: Path, rows: int, seed: int = 7, n_nodes: int = 2000) -> None:
    rng = np.random.default_rng(seed)
    t0 = datetime(2024, 1, 1)
    submit = np.sort(rng.integers(0, 330 * 86400, rows))
    wait = rng.exponential(600, rows).astype(int)
    runtime = rng.exponential(3 * 3600, rows).astype(int) + 30
    # The paper's Fig. 6 / Observation 7: over 90% of jobs fit in one server (1-8 GPUs); the
    # rest span 2..256 nodes with a heavy tail.
    nnodes = np.ones(rows, dtype=int)
    multi = rng.random(rows) >= 0.92
    nnodes[multi] = np.minimum(2 ** rng.geometric(0.45, multi.sum()), 256)
    gpus_one = rng.choice([1, 2, 4, 8], rows, p=[0.35, 0.15, 0.15, 0.35])
    first = rng.integers(0, n_nodes, rows)
    state = rng.choice(len(STATES), rows, p=STATE_P)
    running = np.zeros(rows, bool)
    running[-200:] = True
    typed = rng.random(rows) < 0.5
    with path.open("w") as fh:
        fh.write(HEADER + "\n")
        job_id = 100_000
        i = 0
        while i < rows:
            job_id += 1
            n = int(nnodes[i])
            lo = int(first[i]) if int(first[i]) + n <= n_nodes else n_nodes - n
            nodelist = f"gpu{lo:05d}" if n == 1 else f"gpu[{lo:05d}-{lo + n - 1:05d}]"
            gpus = 8 * n if n > 1 else int(gpus_one[i])
            gres = f"gres/gpu:h100={gpus},gres/gpu={gpus}" if typed[i] else f"gres/gpu={gpus}"
            tres = f"billing={gpus},cpu={12 * gpus},{gres},mem={125 * gpus}G,node={n}"
            sub = t0 + timedelta(seconds=int(submit[i]))
            start = sub + timedelta(seconds=int(wait[i]))
            end = start + timedelta(seconds=int(runtime[i]))
            st = STATES[state[i]]
            display = f"{job_id - 3}_{job_id % 50}" if job_id % 17 == 0 else str(job_id)
            end_text = "Unknown" if running[i] else _fmt(end)
            st = "RUNNING" if running[i] else st
            exit_code = "0:0" if st in ("COMPLETED", "RUNNING") else "1:0"
            name = f"train_{job_id % 997}"
            user = f"user{job_id % 311:03d}"
            fh.write(
                f"{job_id}|{display}|{name}|{user}|gpu|{st}|{exit_code}|{_fmt(sub)}|{_fmt(sub)}|"
                f"{_fmt(start)}|{end_text}|{n}|{nodelist}|{tres}\n"
            )
            i += 1
            if st in ("NODE_FAIL", "REQUEUED") and i < rows:
                # the requeued instance: same JobIDRaw and Submit, a later start
                start2 = end + timedelta(seconds=90)
                end2 = start2 + timedelta(seconds=int(runtime[i]))
                fh.write(
                    f"{job_id}|{display}|{name}|{user}|gpu|COMPLETED|0:0|{_fmt(sub)}|"
                    f"{_fmt(end + timedelta(seconds=10))}|{_fmt(start2)}|{_fmt(end2)}|{n}|"
                    f"{nodelist}|{tres}\n"
                )
                i += 1


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _cpu_s() -> float:
    """User + system CPU of this process: steadier than wall time on a shared machine."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def phase_read_csv(path: Path) -> dict:
    import pandas as pd

    t, c = time.perf_counter(), _cpu_s()
    df = pd.read_csv(path, sep="|", dtype=str, keep_default_na=False)
    return {
        "seconds": time.perf_counter() - t,
        "cpu_seconds": _cpu_s() - c,
        "rows": len(df),
        "peak_rss_mb": _peak_rss_mb(),
    }


def _backend_cpu_s(pid: int | None) -> float | None:
    """User + system CPU of a local PostgreSQL backend, from /proc; None when unreadable."""
    if pid is None:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _pg_backend_pid(engine) -> int | None:
    if engine.dialect.name != "postgresql":
        return None
    with engine.connect() as conn:
        return conn.exec_driver_sql("SELECT pg_backend_pid()").scalar()


def phase_ingest(path: Path, url: str) -> dict:
    from rsc_health.historian.db import connect, table_counts
    from rsc_health.historian.ingest import sacct

    engine = connect(url, create_missing=True)
    pid = _pg_backend_pid(engine)  # the pool's one connection: the ingest's too
    server0 = _backend_cpu_s(pid)
    t, c = time.perf_counter(), _cpu_s()
    report = sacct.ingest_text(engine, path)
    seconds, cpu = time.perf_counter() - t, _cpu_s() - c
    server1 = _backend_cpu_s(pid)
    same_backend = pid is not None and _pg_backend_pid(engine) == pid
    t = time.perf_counter()
    again = sacct.ingest_text(engine, path)
    reingest = time.perf_counter() - t
    counts = table_counts(engine)
    engine.dispose()
    return {
        "seconds": seconds,
        "cpu_seconds": cpu,
        "server_cpu_seconds": (
            server1 - server0 if same_backend and None not in (server0, server1) else None
        ),
        "reingest_seconds": reingest,
        "rows": report.read,
        "bad": len(report.bad) + len(again.bad),
        "jobs": counts["jobs"],
        "job_nodes": counts["job_nodes"],
        "peak_rss_mb": _peak_rss_mb(),
    }


def _child(*args: str) -> dict:
    out = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(out.stderr)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _pg_scratch(admin_url: str):
    """(url of a new scratch database, drop function), or None when no server answers."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.exc import SQLAlchemyError

    try:
        admin = create_engine(
            admin_url, isolation_level="AUTOCOMMIT", connect_args={"connect_timeout": 3}
        )
        name = f"bench_ingest_{os.getpid()}"
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}"'))
            conn.execute(text(f'CREATE DATABASE "{name}"'))
    except (SQLAlchemyError, ImportError) as exc:
        print(f"PostgreSQL skipped: {admin_url.split('@')[-1]} did not answer "
              f"({str(exc).strip().splitlines()[0][:120]})")
        return None

    def drop() -> None:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()

    return admin.url.set(database=name).render_as_string(hide_password=False), drop


def _median_run(runs: list[dict]) -> dict:
    """Per-figure medians of repeated ingest runs (peak RSS: the largest)."""
    out = dict(runs[-1])
    for key in ("seconds", "cpu_seconds", "reingest_seconds", "server_cpu_seconds"):
        values = [r[key] for r in runs if r.get(key) is not None]
        out[key] = statistics.median(values) if values else None
    out["peak_rss_mb"] = max(r["peak_rss_mb"] for r in runs)
    out["runs"] = len(runs)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--sacct", type=Path, help="Time this sacct file instead of generating.")
    ap.add_argument("--out", type=Path, default=Path("bench-out"))
    ap.add_argument("--pg", default=os.environ.get("RSC_HEALTH_TEST_PG"),
                    help="PostgreSQL admin URL (default: $RSC_HEALTH_TEST_PG)")
    ap.add_argument("--no-pg", action="store_true", help="SQLite only.")
    ap.add_argument("--repeat", type=int, default=1, help="Rounds of every ingest (medians).")
    ap.add_argument("--phase", choices=["read_csv", "ingest"], help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.sacct or args.out / f"sacct-{args.rows}.txt"
    if args.phase == "read_csv":
        print(json.dumps(phase_read_csv(path)))
        return
    if args.phase == "ingest":
        print(json.dumps(phase_ingest(path, args.url)))
        return
    if args.sacct is None and not path.exists():
        t = time.perf_counter()
        generate(path, args.rows)
        print(f"generated {path} ({args.rows:,} rows) in {time.perf_counter() - t:.1f} s")
    common = ["--out", str(args.out)] + (["--sacct", str(path)] if args.sacct else [])
    common += ["--rows", str(args.rows)]
    load = os.getloadavg()[0]
    sqlite_db = args.out / "bench-ingest.db"
    backends = ["sqlite"]
    if args.pg and not args.no_pg:
        probe = _pg_scratch(args.pg)
        if probe:
            probe[1]()
            backends.append("postgresql")
    elif not args.no_pg:
        print("PostgreSQL skipped: no --pg URL and no $RSC_HEALTH_TEST_PG")
    # read_csv before and after every ingest, and --repeat rounds of all of it: the baseline
    # and each backend's figures are medians, so a neighbour's load spike on a shared machine
    # moves the ratios less
    reads = [_child("--phase", "read_csv", *common)]
    runs: dict[str, list[dict]] = {name: [] for name in backends}
    for _ in range(args.repeat):
        for name in backends:
            drop = None
            if name == "sqlite":
                for suffix in ("", "-wal", "-shm", "-journal"):
                    Path(f"{sqlite_db}{suffix}").unlink(missing_ok=True)
                url = f"sqlite:///{sqlite_db}"
            else:
                url, drop = _pg_scratch(args.pg) or (None, None)
                if url is None:
                    continue
            try:
                runs[name].append(_child("--phase", "ingest", "--url", url, *common))
            finally:
                if drop:
                    drop()
            reads.append(_child("--phase", "read_csv", *common))
    results = [(name, _median_run(r)) for name, r in runs.items() if r]
    read = {
        "seconds": statistics.median(r["seconds"] for r in reads),
        "cpu_seconds": statistics.median(r["cpu_seconds"] for r in reads),
        "peak_rss_mb": max(r["peak_rss_mb"] for r in reads),
        "rows": reads[0]["rows"],
    }
    print(f"file: {path} ({path.stat().st_size / 1e6:.0f} MB, {read['rows']:,} rows)")
    print(f"load average before: {load:.2f} on {os.cpu_count()} CPUs")
    print(
        f"pandas.read_csv:           {read['seconds']:6.2f} s (CPU {read['cpu_seconds']:6.2f} s)"
        f"   peak RSS {read['peak_rss_mb']:7.0f} MB   (median of {len(reads)}: "
        + ", ".join(f"{r['seconds']:.2f}" for r in reads)
        + " s)"
    )
    bench = [
        ("read_csv_wall", read["seconds"], "s"),
        ("read_csv_cpu", read["cpu_seconds"], "s"),
        ("read_csv_peak_rss", read["peak_rss_mb"], "MiB"),
    ]
    for name, ing in results:
        ratio = ing["seconds"] / read["seconds"]
        cpu_ratio = ing["cpu_seconds"] / read["cpu_seconds"]
        label = {"sqlite": "SQLite", "postgresql": "PostgreSQL"}[name]
        server = ing.get("server_cpu_seconds")
        print(
            f"ingest sacct ({label + '):':11s} {ing['seconds']:6.2f} s "
            f"(CPU {ing['cpu_seconds']:6.2f} s)"
            f"   peak RSS {ing['peak_rss_mb']:7.0f} MB"
            f"   ({ing['jobs']:,} jobs, {ing['job_nodes']:,} job_nodes, {ing['bad']} bad)"
            + (f"   server backend CPU {server:.2f} s" if server is not None else "")
        )
        print(f"  re-ingest (no change):   {ing['reingest_seconds']:6.2f} s"
              + (f"   (medians of {ing['runs']} runs)" if ing["runs"] > 1 else ""))
        print(f"  ratio ingest / read_csv = {ratio:.2f}x wall, {cpu_ratio:.2f}x CPU "
              "(target <= 3x wall)")
        bench += [
            (f"{name}_wall", ing["seconds"], "s"),
            (f"{name}_cpu", ing["cpu_seconds"], "s"),
            (f"{name}_ratio_wall", ratio, "x"),
            (f"{name}_ratio_cpu", cpu_ratio, "x"),
            (f"{name}_peak_rss", ing["peak_rss_mb"], "MiB"),
            (f"{name}_reingest_wall", ing["reingest_seconds"], "s"),
        ]
        if server is not None:
            bench.append((f"{name}_server_cpu", server, "s"))
    bench.append(("load_avg_1min", load, ""))
    for metric, value, unit in bench:
        print(f"BENCH\tingest\t{metric}\t{value:.2f}\t{unit}")


if __name__ == "__main__":
    main()
