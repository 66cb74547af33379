"""What the historian benchmarks share: argument parsing, the synthetic RSC-1-shaped job
generator and its fast loaders (SQLite executemany, PostgreSQL COPY), peak RSS of a process,
timing of a child process, and the BENCH line protocol of benchmarks/run.

Rows are synthetic but shaped like the paper's RSC-1 (Fig. 3 outcome shares, Fig. 6 job sizes):
~40% 1-GPU jobs, a few thousand-GPU jobs, NODE_FAIL ~0.1% with requeues, a few percent of
FAILED jobs attributed to a health check.

`RSC_BENCH_QUICK=1` in the environment (what `benchmarks/run --quick` sets) asks every benchmark
for its small smoke-test scale instead of the paper's.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import uuid
from datetime import datetime

import numpy as np

from rsc_health.historian.ingest.sacct import JOB_COLUMNS

QUICK = os.environ.get("RSC_BENCH_QUICK", "") not in ("", "0")
PG_DEFAULT = os.environ.get(
    "RSC_HEALTH_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)


def backend_args(ap: argparse.ArgumentParser, jobs: int = 4_000_000, quick_jobs: int = 100_000):
    """--jobs, --backend, --pg: the options every historian benchmark takes."""
    ap.add_argument("--jobs", type=int, default=quick_jobs if QUICK else jobs)
    ap.add_argument("--backend", choices=["sqlite", "postgres", "both"], default="both")
    ap.add_argument("--pg", default=PG_DEFAULT, help="PostgreSQL admin URL (default: %(default)s)")
    return ap


def backends(choice: str) -> list[str]:
    return ["sqlite", "postgres"] if choice == "both" else [choice]


def pg_unavailable(admin_url: str) -> str | None:
    """Why the PostgreSQL server at admin_url cannot be used, or None when it answers."""
    from sqlalchemy import create_engine, text

    try:
        engine = create_engine(admin_url, connect_args={"connect_timeout": 5})
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        engine.dispose()
        return None
    except Exception as exc:  # noqa: BLE001 - any failure means "skip PostgreSQL"
        return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def bench(name: str, metric: str, value: float, unit: str) -> None:
    """One `BENCH<TAB>name<TAB>metric<TAB>value<TAB>unit` line for benchmarks/run's table."""
    text = str(value) if isinstance(value, int) else f"{value:.2f}"
    print(f"BENCH\t{name}\t{metric}\t{text}\t{unit}", flush=True)


def cpu_s() -> float:
    """CPU seconds (user + system) of this process so far."""
    use = resource.getrusage(resource.RUSAGE_SELF)
    return use.ru_utime + use.ru_stime


def run_child(argv: list[str]) -> dict:
    """Run a benchmark child that prints one JSON object as its last line; return it."""
    res = subprocess.run(argv, check=False, capture_output=True, text=True)
    if res.returncode != 0:
        sys.stderr.write(res.stderr)
        raise SystemExit(f"{' '.join(argv[1:3])}... exited {res.returncode}")
    return json.loads(res.stdout.strip().splitlines()[-1])


SIZES = np.array([1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096])
SIZE_P = np.array(
    [0.42, 0.05, 0.06, 0.35, 0.04, 0.03, 0.02, 0.012, 0.008, 0.005, 0.0025, 0.0015, 0.001]
)
STATES = np.array(
    [
        "COMPLETED",
        "FAILED",
        "NODE_FAIL",
        "PREEMPTED",
        "REQUEUED",
        "OUT_OF_MEMORY",
        "TIMEOUT",
        "CANCELLED",
    ]
)
STATE_P = np.array([0.60, 0.24, 0.002, 0.10, 0.02, 0.001, 0.006, 0.031])
CAUSES = np.array(["xid", "infiniband", "mount", "ecc", "pcie", "gpu", "remap", "nvlink"])
N_NODES = 2000
T0 = datetime(2023, 8, 1)
DAYS = 330


def _stamp(seconds: np.ndarray) -> np.ndarray:
    """Seconds after T0 -> 'YYYY-MM-DD HH:MM:SS', the text SQLAlchemy stores in SQLite."""
    t = np.datetime64(T0, "s") + seconds.astype("timedelta64[s]")
    return np.char.replace(np.datetime_as_string(t, unit="s"), "T", " ")


def generate(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Column arrays of jobs, job_nodes and attributions, all vectorised (numpy)."""
    rng = np.random.default_rng(seed)
    gpus = rng.choice(SIZES, n, p=SIZE_P / SIZE_P.sum())
    nnodes = np.maximum(1, gpus // 8)
    state = rng.choice(STATES, n, p=STATE_P / STATE_P.sum())
    submit = np.sort(rng.uniform(0, DAYS * 86400, n))
    wait = rng.exponential(1800, n)
    run = np.minimum(rng.lognormal(8.0, 1.6, n), 72 * 3600) + 60
    never = (state == "CANCELLED") & (rng.random(n) < 0.5)
    first_node = rng.integers(0, N_NODES, n)
    # 30% of NODE_FAIL instances come back as a requeue: same Job ID, eligible 2 min later.
    rq = np.flatnonzero((state == "NODE_FAIL") & (rng.random(n) < 0.3))
    src = np.concatenate([np.arange(n), rq])
    is_rq = np.concatenate([np.zeros(n, bool), np.ones(len(rq), bool)])
    start = np.where(is_rq, submit[src] + wait[src] + run[src] + 120, submit[src] + wait[src])
    end = np.where(never[src] & ~is_rq, start, start + run[src])
    eligible = np.where(is_rq, start - 120, submit[src])
    states = np.where(is_rq, "COMPLETED", state[src])
    pk = np.arange(1, len(src) + 1)
    start_s = _stamp(start).astype(object)
    start_s[never[src] & ~is_rq] = None
    job_id = (src + 1).astype(str)
    cols = {
        "id": pk,
        "job_id": job_id,
        "job_id_display": job_id,
        "name": np.char.add("train", (src % 50000).astype(str)),
        "user": np.char.add("user", (src % 300).astype(str)),
        "partition": np.full(len(src), "learn"),
        "state": states,
        "exit_code": np.full(len(src), "0:0"),
        "submit": _stamp(submit[src]),
        "eligible": _stamp(eligible),
        "start": start_s,
        "end": _stamp(end),
        "nnodes": nnodes[src],
        "gpus": gpus[src],
        "nodelist": np.full(len(src), ""),
        "instance_key": np.char.add(np.char.add(job_id, ":"), pk.astype(str)),
        "cluster": np.full(len(src), ""),  # one unnamed cluster (schema version 4)
    }
    # job_nodes: each instance on nnodes consecutive nodes from its first node.
    counts = nnodes[src]
    offsets = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
    names = np.array([f"node{i:04d}" for i in range(N_NODES)], dtype=object)
    nodes = {
        "job_pk": np.repeat(pk, counts),
        "node": names[(np.repeat(first_node[src], counts) + offsets) % N_NODES],
    }
    # Attributions: every NODE_FAIL (40% of them unattributed), 2% of FAILED to a check,
    # 5% of those with a second, co-occurring cause.
    failed = np.flatnonzero(
        (states == "NODE_FAIL") | ((states == "FAILED") & (rng.random(len(src)) < 0.02))
    )
    unatt = (states[failed] == "NODE_FAIL") & (rng.random(len(failed)) < 0.4)
    second = failed[~unatt & (rng.random(len(failed)) < 0.05)]
    att_pk = np.concatenate([failed, second])
    kind = np.concatenate([np.where(unatt, "unattributed", "check"), np.full(len(second), "check")])
    cause = np.concatenate(
        [
            np.where(unatt, "unattributed", rng.choice(CAUSES, len(failed))),
            np.full(len(second), "pcie"),
        ]
    )
    node = names[first_node[src[att_pk]]].copy()
    node[kind == "unattributed"] = None
    atts = {
        "job_pk": pk[att_pk],
        "node": node,
        "cause": cause,
        "code": np.full(len(att_pk), ""),
        "evidence": np.full(len(att_pk), ""),
        "kind": kind,
    }
    return {"jobs": cols, "job_nodes": nodes, "attributions": atts}


def _tuples(columns: dict[str, np.ndarray], chunk: int = 250_000):
    """Row tuples of plain Python values, a chunk at a time (bounded memory)."""
    names = list(columns)
    n = len(columns[names[0]])
    for lo in range(0, n, chunk):
        yield from zip(*(columns[c][lo : lo + chunk].tolist() for c in names), strict=True)


# The historian's jobs columns as the ingest writes them, with the primary key first.
JOB_COLS = ("id", *JOB_COLUMNS)
ATT_COLS = ("job_pk", "node", "cause", "code", "evidence", "kind")


def load_sqlite(path: str, data) -> str:
    import sqlite3

    from rsc_health.historian.db import connect

    url = f"sqlite:///{path}"
    connect(url, create_missing=True).dispose()
    con = sqlite3.connect(path)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("PRAGMA synchronous=OFF")
    q = ", ".join(f'"{c}"' for c in JOB_COLS)
    marks = ", ".join("?" * len(JOB_COLS))
    con.executemany(f"INSERT INTO jobs ({q}) VALUES ({marks})", _tuples(data["jobs"]))
    con.executemany(
        "INSERT INTO job_nodes (job_pk, node) VALUES (?, ?)", _tuples(data["job_nodes"])
    )
    con.executemany(
        f"INSERT INTO attributions ({', '.join(ATT_COLS)}) VALUES (?, ?, ?, ?, ?, ?)",
        _tuples(data["attributions"]),
    )
    con.commit()
    con.execute("ANALYZE")
    con.close()
    return url


def create_postgres(admin_url: str) -> tuple[str, str]:
    """A new scratch database with the historian's schema: (its URL, its name for
    drop_postgres)."""
    from sqlalchemy import create_engine, text

    from rsc_health.historian.db import connect

    name = f"rsc_bench_{uuid.uuid4().hex[:10]}"
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    url = admin_url.rsplit("/", 1)[0] + f"/{name}"
    connect(url, create_missing=True).dispose()
    return url, name


def load_postgres(admin_url: str, data) -> tuple[str, str]:
    import psycopg

    url, name = create_postgres(admin_url)
    dsn = url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(dsn) as con, con.cursor() as cur:
        for table, cols in data.items():
            quoted = ", ".join(f'"{c}"' for c in cols)
            with cur.copy(f"COPY {table} ({quoted}) FROM STDIN") as copy:
                for row in _tuples(cols):
                    copy.write_row(row)
        cur.execute("SELECT setval('attributions_id_seq', (SELECT max(id) FROM attributions))")
        con.commit()
        con.autocommit = True
        cur.execute("ANALYZE")
    return url, name


def drop_postgres(admin_url: str, name: str) -> None:
    from sqlalchemy import create_engine, text

    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


def peak_rss_mib() -> float:
    """VmHWM of this process. ru_maxrss survives execve, so a child forked from the 4 GB
    generator would report the generator's peak; VmHWM starts afresh with the new image."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


