"""The historian at the volume its own sweeps produce (issue 13): node spools delivered into
PostgreSQL (or SQLite) as each node's flush timer would, measured per simulated fleet-day.

    python3 benchmarks/bench_historian_volume.py [--nodes 16000] [--hours 2] [--backend postgresql]
    python3 benchmarks/bench_historian_volume.py --nodes 2000 --hours 24

What one node sends (the node path's real records, rsc_health.spool): per five-minute sweep,
one all-clear `check` record per family (8) or one per failing component, and a `heartbeat`;
a state change on `--changes-per-node-day` (a link flap, a warning that comes and goes). Each
node's flush timer (default: the shipped deploy/node/rsc-health-flush.timer's period) delivers
its last `--flush-min` minutes as `healthctl spool flush` does, with its own engine and
connection (`--connections`: through a local PgBouncer in transaction mode, the deployment
docs/deployment.md describes; a new backend per flush; or, for comparison, one pooled
connection that never pays for connecting). Measured over `--hours` of fleet time, after one
warm-up hour that opens the all-clear intervals:

- storage: database size growth (PostgreSQL: pg_total_relation_size of every table, after
  VACUUM so dead tuples of the in-place updates are reclaimed as autovacuum would), per day;
- delivery CPU: what the database host spends (the bench database's backends, PgBouncer, and
  with a backend per flush the exited ones, from /proc), as a share of one core averaged over
  the day; and each node's own CPU per flush (in-process; starting Python adds ~0.8 s);
- flush memory: a separate `healthctl spool flush` of one big spool (--big-spool-lines),
  peak RSS of that process.

--telemetry adds each sweep's `telemetry` record (issue 25, docs/telemetry.md): one
telemetry_samples row per node and sweep. Its storage is the samples' standing size
(benchmarks/bench_telemetry_storage.py), not this benchmark's growth figure.

Figures for a whole day are extrapolated linearly from the measured hours (the load is the
same every five minutes); the BENCH lines say which figures are measured and which projected.
Targets: storage <= 50 MB/day and delivery CPU <= 5% of a core at 16,000 nodes (the database
host's: the one machine every flush lands on); flush memory < 200 MB whatever the spool size.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import resource
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from sqlalchemy import create_engine, text  # noqa: E402

from rsc_health import spool  # noqa: E402
from rsc_health.historian.db import connect  # noqa: E402
from rsc_health.historian.ingest.delivery import (  # noqa: E402
    DeliveryReport,
    _chunks,
    _Clock,
    _parse,
    _write,
    flush,
    flush_engine,
)
from tests.historian import pgbouncer  # noqa: E402

FAMILIES = ("gpu", "xid", "ecc", "remap", "nvlink", "pcie", "infiniband", "mount")
T0 = datetime(2026, 1, 1, tzinfo=UTC)
PG_ADMIN = os.environ.get("RSC_HEALTH_TEST_PG",
                          "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")


def bench(name: str, metric: str, value: float, unit: str) -> None:
    print(f"BENCH\t{name}\t{metric}\t{value:.6g}\t{unit}", flush=True)


TELEMETRY = False  # --telemetry: each sweep also spools its telemetry record
TELEMETRY_METRICS = {
    "sm_clock_ratio": (0.7, 1.0, "gpu3"), "throttle_hw_frac": (0.0, 0.0, "gpu0"),
    "throttle_power_frac": (0.0, 0.4, "gpu5"), "gpu_temp_c": (40, 78, "gpu6"),
    "power_ratio": (0.1, 1.05, "gpu2"), "pcie_link_ratio": (1.0, 1.0, "gpu0"),
    "pcie_replay_rate": (0.0, 0.0, "gpu0"), "nvlink_error_rate": (0.0, 0.0, "gpu0"),
    "ib_xmit_wait_rate": (0.0, 5e6, "mlx5_3/1"), "ib_link_ratio": (1.0, 1.0, "mlx5_0/1"),
}


def sweep_lines(node: str, when: datetime, failing: str | None) -> list[str]:
    """One sweep's spool lines, as json.dumps writes them on the node."""
    out = []
    t = when.isoformat()
    for fam in FAMILIES:
        if fam == failing:
            rec = {"kind": "check", "id": uuid.uuid4().hex, "time": t, "node": node,
                   "source": "sweep", "job_id": None, "check": fam, "component": "mlx5_0/1",
                   "status": "fail", "severity": "drain_now", "code": "ib_down",
                   "reason": "mlx5_0/1 port DOWN/Polling"}
        else:
            rec = {"kind": "check", "id": uuid.uuid4().hex, "time": t, "node": node,
                   "source": "sweep", "job_id": None, "check": fam, "component": "*",
                   "status": "ok", "severity": "none", "code": "", "reason": "all clear"}
        out.append(json.dumps(rec, separators=(",", ":"), sort_keys=True))
    if TELEMETRY:
        # The sweep's telemetry sample (checks/telemetry.py), every metric of the vocabulary.
        metrics = {name: {"value": round(random.uniform(lo, hi), 6), "component": comp}
                   for name, (lo, hi, comp) in TELEMETRY_METRICS.items()}
        out.append(json.dumps({"kind": "telemetry", "id": uuid.uuid4().hex, "time": t,
                               "node": node, "source": "sweep", "job_id": None,
                               "interval_s": 300.0, "metrics": metrics},
                              separators=(",", ":"), sort_keys=True))
    out.append(json.dumps({"kind": "heartbeat", "id": uuid.uuid4().hex, "time": t, "node": node,
                           "source": "sweep", "level": "drain_now" if failing else "ok",
                           "checker_errors": 0, "duration_s": 0.4, "families": {},
                           "version": "bench"}, separators=(",", ":"), sort_keys=True))
    return out


def shipped_flush_min() -> int:
    """The period of deploy/node/rsc-health-flush.timer (OnCalendar=*:0/N)."""
    timer = (REPO / "deploy/node/rsc-health-flush.timer").read_text()
    return int(re.search(r"^OnCalendar=\*:0/(\d+)\s*$", timer, re.M).group(1))


class Fleet:
    """Which nodes fail which family when: a few state changes per node-day."""

    def __init__(self, nodes: int, changes_per_node_day: float, seed: int = 0):
        self.names = [f"gpu{i:05d}" for i in range(nodes)]
        self.rng = random.Random(seed)
        self.p_change = changes_per_node_day / 288
        self.failing: dict[str, str | None] = dict.fromkeys(self.names)

    def step(self) -> None:
        for n in self.names:
            if self.rng.random() < self.p_change:
                self.failing[n] = None if self.failing[n] else "infiniband"


def deliver_window(engine, tmp: Path, fleet: Fleet, start: datetime, sweeps: int,
                   flush_every: int, flush_url: str | None = None) -> tuple[int, float]:
    """Deliver `sweeps` sweeps of the whole fleet, each node flushing every `flush_every`
    sweeps (one transaction per node flush). With `flush_url` each flush is what a node's
    `healthctl spool flush` runs (delivery.flush: its own engine and connection, the schema
    version read, the batch delivered, the connection closed), less the interpreter's start;
    else every flush reuses `engine`'s pooled connection. Returns (lines, client CPU s)."""
    lines = 0
    cpu = 0.0
    buf: dict[str, list[str]] = {n: [] for n in fleet.names}
    spool_dir = tmp / "spool"
    spool_dir.mkdir(exist_ok=True)
    path = spool_dir / "batch-bench.jsonl"
    for s in range(sweeps):
        when = start + timedelta(minutes=5 * s)
        fleet.step()
        for n in fleet.names:
            buf[n].extend(sweep_lines(n, when, fleet.failing[n]))
        if (s + 1) % flush_every:
            continue
        for n in fleet.names:
            # The node's batch file, then the same code `spool flush` runs on it.
            path.write_text("\n".join(buf[n]) + "\n")
            lines += len(buf[n])
            buf[n] = []
            c0 = time.process_time()
            if flush_url is not None:
                flush(flush_url, spool_dir)
            else:
                report = DeliveryReport()
                clock = _Clock()  # the historian's clock judges each stamp, as in flush
                for chunk in _chunks(path, 5000):
                    with flush_engine(engine).begin() as conn:
                        if clock.base is None:
                            clock.read(conn, version=False)
                        _write(conn, _parse(chunk, clock.now()), report)
                path.unlink()
            cpu += time.process_time() - c0
    return lines, cpu


def database_host_cpu_s(database: str, exited: bool) -> tuple[float, float]:
    """CPU seconds the database host spends on `database`: its PostgreSQL backends (the
    process title names the database), the pgbouncer in front of them, and, for backends that
    already exited (`exited`: a connection per flush), what the postmaster collected from its
    children. Backends of other databases (tests or benchmarks running beside this one) are
    not counted, except among the exited: --connections direct wants a quiet server.
    Returns (PostgreSQL, pgbouncer)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = bouncer = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            title = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        if name.startswith("pgbouncer"):
            bouncer += int(fields[11]) + int(fields[12])  # utime stime
        elif name.startswith("postgres") and f" {database} " in f" {title} ":
            total += int(fields[11]) + int(fields[12])
        elif exited and name.startswith("postgres") and not title.startswith("postgres:"):
            total += int(fields[13]) + int(fields[14])  # a postmaster: cutime cstime
    return total / tick, bouncer / tick


def db_bytes(engine) -> int:
    with engine.connect() as conn:
        if engine.dialect.name == "postgresql":
            conn.execution_options(isolation_level="AUTOCOMMIT").exec_driver_sql("VACUUM")
            return int(conn.exec_driver_sql(
                "SELECT sum(pg_total_relation_size(c.oid)) FROM pg_class c JOIN pg_namespace n "
                "ON n.oid = c.relnamespace WHERE n.nspname = 'public' AND c.relkind = 'r'"
            ).scalar())
        page = conn.exec_driver_sql("PRAGMA page_size").scalar()
        count = conn.exec_driver_sql("PRAGMA page_count").scalar()
        free = conn.exec_driver_sql("PRAGMA freelist_count").scalar()
        return int(page * (count - free))


HWM_WRAPPER = """
import atexit, sys
def hwm():
    for line in open('/proc/self/status'):
        if line.startswith('VmHWM:'):
            print(line.strip(), file=sys.stderr)
atexit.register(hwm)
from rsc_health.cli import main
sys.argv = ['healthctl'] + sys.argv[1:]
main()
"""
ROW_TABLES = ("check_results", "node_runs", "heartbeat_days", "check_days", "node_actions")


def row_counts(engine) -> dict[str, int]:
    with engine.connect() as conn:
        return {t: int(conn.exec_driver_sql(f"SELECT count(*) FROM {t}").scalar())
                for t in ROW_TABLES}


def flush_memory(url: str, lines: int, tmp: Path) -> float:
    """Peak RSS (MiB) of `healthctl spool flush` delivering one spool of `lines` lines."""
    sdir = tmp / "bigspool"
    sdir.mkdir()
    nodes = max(1, lines // (288 * 9))
    with (sdir / spool.PENDING).open("w") as fh:
        written = 0
        s = 0
        while written < lines:
            when = T0 + timedelta(days=30, minutes=5 * s)
            for i in range(nodes):
                for line in sweep_lines(f"big{i:04d}", when, None):
                    fh.write(line + "\n")
                    written += 1
            s += 1
    env = dict(os.environ, PYTHONPATH=str(REPO))
    t0 = time.perf_counter()
    # VmHWM from the flush itself: a child's ru_maxrss keeps the RSS of the forked parent
    # copy across exec, which is this benchmark's, not the flush's.
    proc = subprocess.run([sys.executable, "-c", HWM_WRAPPER, "--db", url, "spool", "flush",
                           "--dir", str(sdir)], env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"spool flush failed: {proc.stdout}{proc.stderr}")
    print(f"  big spool: {written:,} lines in {time.perf_counter() - t0:.1f} s: "
          f"{proc.stdout.strip()}")
    return int(proc.stderr.strip().splitlines()[-1].split()[1]) / 1024


def main() -> None:
    quick = os.environ.get("RSC_BENCH_QUICK", "") not in ("", "0")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=200 if quick else 16000)
    ap.add_argument("--hours", type=float, default=0.5 if quick else 2.0)
    ap.add_argument("--flush-min", type=int, default=shipped_flush_min(),
                    help="minutes between a node's flushes (default: the shipped timer's)")
    ap.add_argument("--changes-per-node-day", type=float, default=0.5)
    ap.add_argument("--backend", choices=("postgresql", "sqlite"), default="postgresql")
    ap.add_argument("--big-spool-lines", type=int, default=50_000 if quick else 2_000_000)
    ap.add_argument("--connections", choices=("pgbouncer", "direct", "pooled"),
                    default="pgbouncer" if pgbouncer.available() else "direct",
                    help="how each node's flush reaches PostgreSQL: through a local PgBouncer "
                    "in transaction mode (docs/deployment.md), a new backend per flush, or "
                    "one pooled connection for every flush (no connection cost at all)")
    ap.add_argument("--telemetry", action="store_true",
                    help="each sweep also spools its telemetry record (issue 25)")
    args = ap.parse_args()
    global TELEMETRY
    TELEMETRY = args.telemetry
    if args.backend == "sqlite":
        args.connections = "pooled"
    flush_every = max(1, args.flush_min // 5)
    sweeps = max(flush_every, int(args.hours * 12) // flush_every * flush_every)

    with tempfile.TemporaryDirectory(prefix="bench-volume-") as tmp_s:
        tmp = Path(tmp_s)
        admin = None
        if args.backend == "postgresql":
            admin = create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
            name = f"rsc_bench_{uuid.uuid4().hex[:8]}"
            with admin.connect() as c:
                c.execute(text(f'CREATE DATABASE "{name}"'))
            url = admin.url.set(database=name).render_as_string(hide_password=False)
        else:
            url = f"sqlite:///{tmp / 'history.db'}"
            name = "history.db"
        try:
            engine = connect(url, upgrade=True, create_missing=True)
            fleet = Fleet(args.nodes, args.changes_per_node_day)
            # Warm-up hour: every node's all-clear intervals open (a day's first sweeps).
            deliver_window(engine, tmp, fleet, T0, 12, flush_every)
            size0 = db_bytes(engine)
            rows0 = row_counts(engine)
            with contextlib.ExitStack() as stack:
                flush_url = {"pooled": None, "direct": url}.get(args.connections)
                if args.connections == "pgbouncer":
                    flush_url = stack.enter_context(pgbouncer.pgbouncer(url))
                exited = args.connections == "direct"
                pg0, bouncer0 = database_host_cpu_s(name, exited)
                w0 = time.perf_counter()
                lines, cpu = deliver_window(engine, tmp, fleet, T0 + timedelta(hours=1),
                                            sweeps, flush_every, flush_url)
                wall = time.perf_counter() - w0
                pg1, bouncer1 = database_host_cpu_s(name, exited)
                srv, bouncer = pg1 - pg0 + bouncer1 - bouncer0, bouncer1 - bouncer0
            size1 = db_bytes(engine)
            rows1 = row_counts(engine)
            rows = rows1["check_results"]
            engine.dispose()
            hours = sweeps / 12
            per_day = 24 / hours
            # Allocated pages barely move within hours (freed space is reused), so the daily
            # growth is projected from rows: new rows per day x the tables' bytes per row, plus
            # one heartbeat_days row per node-day (the measured window may not cross midnight).
            bytes_per_row = size1 / max(1, sum(rows1.values()))
            new_rows_day = sum(rows1[t] - rows0[t] for t in ROW_TABLES if t != "heartbeat_days")
            new_rows_day = new_rows_day * per_day + args.nodes
            growth_mb_day = max((size1 - size0) / 2**20 * per_day,
                                new_rows_day * bytes_per_row / 2**20)
            cpu_share = (cpu + srv) * per_day / 86400
            print(f"{args.nodes:,} nodes, {hours:g} h measured ({sweeps} sweeps, flush every "
                  f"{args.flush_min} min, {args.changes_per_node_day} state changes per "
                  f"node-day) on {args.backend}, connections {args.connections}:")
            flushes = args.nodes * (sweeps // flush_every)
            print(f"  delivered {lines:,} spool lines in {flushes:,} flushes, {wall:.1f} s wall; "
                  f"client CPU {cpu:.1f} s ({cpu / flushes * 1000:.2f} ms a flush), database "
                  f"host CPU {srv:.1f} s ({srv / flushes * 1000:.2f} ms a flush, of which "
                  f"pgbouncer {bouncer / flushes * 1000:.2f} ms); check_results rows {rows:,}")
            print(f"  storage: {(size1 - size0) / 2**20:.2f} MB allocated in the window, "
                  f"{new_rows_day:,.0f} new rows/day at {bytes_per_row:.0f} B/row -> "
                  f"{growth_mb_day:.1f} MB/day projected (target <= 50)")
            # The shared cost is the database host's: every node's flush lands there. The
            # nodes' own share is spread over as many machines as there are nodes, so it is
            # stated per node (and summed, for the record), never as "one core".
            host_share = srv * per_day / 864
            node_share = cpu / args.nodes * per_day / 864
            print(f"  database host (PostgreSQL{' + PgBouncer' if bouncer else ''}, the "
                  f"fleet's shared cost): {host_share:.2f}% of one core averaged over a day "
                  f"projected (target <= 5%)")
            print(f"  each node: {cpu / flushes * 1000:.1f} ms of CPU per flush in-process "
                  f"({node_share:.4f}% of one of its cores; starting Python for `healthctl "
                  f"spool flush` adds about 0.8 s per flush); summed over the fleet "
                  f"{cpu_share * 100 - host_share:.1f}% of one core")
            bench("historian_volume", f"{args.nodes}n_lines_measured", lines, "lines")
            bench("historian_volume", f"{args.nodes}n_storage_projected", growth_mb_day,
                  "MB/day")
            bench("historian_volume", f"{args.nodes}n_database_host_cpu_projected",
                  host_share, "% of a core")
            bench("historian_volume", f"{args.nodes}n_node_cpu_per_flush_measured",
                  cpu / flushes * 1000, "ms")
            bench("historian_volume", f"{args.nodes}n_client_cpu_measured", cpu, "s")
            bench("historian_volume", f"{args.nodes}n_server_cpu_measured", srv, "s")
            rss = flush_memory(url, args.big_spool_lines, tmp)
            print(f"  flush of one {args.big_spool_lines:,}-line spool: peak RSS {rss:.0f} MiB "
                  f"(target < 200); this benchmark process: "
                  f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")
            bench("historian_volume", "flush_peak_rss_measured", rss, "MiB")
        finally:
            if admin is not None:
                with admin.connect() as c:
                    c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
                admin.dispose()


if __name__ == "__main__":
    main()
