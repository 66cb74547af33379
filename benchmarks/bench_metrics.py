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
import resource
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import datetime

import numpy as np

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


def generate(n: int, seed: int = 0):
    """Columns of the jobs, job_nodes and attributions tables as numpy arrays / lists."""
    rng = np.random.default_rng(seed)
    gpus = rng.choice(SIZES, n, p=SIZE_P / SIZE_P.sum())
    nnodes = np.maximum(1, gpus // 8)
    state = rng.choice(STATES, n, p=STATE_P / STATE_P.sum())
    submit_s = np.sort(rng.uniform(0, DAYS * 86400, n))
    wait_s = rng.exponential(1800, n)
    run_s = np.minimum(rng.lognormal(8.0, 1.6, n), 72 * 3600) + 60
    never = (state == "CANCELLED") & (rng.random(n) < 0.5)
    # Requeues: 30% of NODE_FAIL instances come back as a second instance of the same Job ID.
    job_id = np.arange(1, n + 1)
    rq = np.flatnonzero((state == "NODE_FAIL") & (rng.random(n) < 0.3))
    first_node = rng.integers(0, N_NODES, n)
    return dict(
        gpus=gpus,
        nnodes=nnodes,
        state=state,
        submit_s=submit_s,
        wait_s=wait_s,
        run_s=run_s,
        never=never,
        job_id=job_id,
        requeue_of=rq,
        first_node=first_node,
        rng=rng,
    )


def rows(data):
    """Yield (jobs rows, job_nodes rows, attribution rows) as tuples, requeues appended."""
    g, nn, st = data["gpus"], data["nnodes"], data["state"]
    sub, wait, run, never = data["submit_s"], data["wait_s"], data["run_s"], data["never"]
    first, jid, rng = data["first_node"], data["job_id"], data["rng"]
    n = len(g)
    rq = data["requeue_of"]
    # Requeue instance k of NODE_FAIL job i: eligible at its end, same size and job id.
    pk = np.concatenate([np.arange(1, n + 1), np.arange(n + 1, n + 1 + len(rq))])
    src = np.concatenate([np.arange(n), rq])
    is_rq = np.concatenate([np.zeros(n, bool), np.ones(len(rq), bool)])
    start = np.where(is_rq, sub[src] + wait[src] + run[src] + 120, sub[src] + wait[src])
    end = start + run[src]
    elig = np.where(is_rq, start - 120, sub[src])
    states = np.where(is_rq, "COMPLETED", st[src])
    nev = never[src] & ~is_rq
    jobs_rows = []
    fmt = "%Y-%m-%d %H:%M:%S"
    base = T0.timestamp()
    for i in range(len(pk)):
        s = src[i]
        job_id = str(jid[s])
        submit = datetime.fromtimestamp(base + sub[s]).strftime(fmt)
        eligible = datetime.fromtimestamp(base + elig[i]).strftime(fmt)
        stt = None if nev[i] else datetime.fromtimestamp(base + start[i]).strftime(fmt)
        en = datetime.fromtimestamp(base + (start[i] if nev[i] else end[i])).strftime(fmt)
        jobs_rows.append(
            (
                int(pk[i]),
                job_id,
                job_id,
                f"train{s % 50000}",
                f"user{s % 300}",
                "learn",
                str(states[i]),
                "0:0",
                submit,
                eligible,
                stt,
                en,
                int(nn[s]),
                int(g[s]),
                "",
                f"{job_id}:{pk[i]}",
            )
        )
    node_rows = []
    for i in range(len(pk)):
        s = src[i]
        f0 = int(first[s])
        for k in range(int(nn[s])):
            node_rows.append((int(pk[i]), f"node{(f0 + k) % N_NODES:04d}"))
    fail_idx = np.flatnonzero(np.isin(states, ["FAILED", "NODE_FAIL"]))
    picked = fail_idx[(states[fail_idx] == "NODE_FAIL") | (rng.random(len(fail_idx)) < 0.02)]
    att_rows = []
    for i in picked:
        s = src[i]
        node = f"node{int(first[s]) % N_NODES:04d}"
        if states[i] == "NODE_FAIL" and rng.random() < 0.4:
            att_rows.append((int(pk[i]), None, "unattributed", "", "", "unattributed"))
            continue
        for c in rng.choice(CAUSES, 1 + int(rng.random() < 0.05), replace=False):
            att_rows.append((int(pk[i]), node, str(c), "", "", "check"))
    return jobs_rows, node_rows, att_rows


JOB_COLS = (
    "id",
    "job_id",
    "job_id_display",
    "name",
    "user",
    "partition",
    "state",
    "exit_code",
    "submit",
    "eligible",
    "start",
    "end",
    "nnodes",
    "gpus",
    "nodelist",
    "instance_key",
)
ATT_COLS = ("job_pk", "node", "cause", "code", "evidence", "kind")


def load_sqlite(path: str, jobs_rows, node_rows, att_rows) -> str:
    import sqlite3

    from rsc_health.historian.db import connect

    url = f"sqlite:///{path}"
    connect(url).dispose()
    con = sqlite3.connect(path)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("PRAGMA synchronous=OFF")
    q = ", ".join(f'"{c}"' for c in JOB_COLS)
    con.executemany(f"INSERT INTO jobs ({q}) VALUES ({', '.join('?' * len(JOB_COLS))})", jobs_rows)
    con.executemany("INSERT INTO job_nodes (job_pk, node) VALUES (?, ?)", node_rows)
    con.executemany(
        f"INSERT INTO attributions ({', '.join(ATT_COLS)}) VALUES (?, ?, ?, ?, ?, ?)", att_rows
    )
    con.commit()
    con.execute("ANALYZE")
    con.close()
    return url


def load_postgres(admin_url: str, jobs_rows, node_rows, att_rows) -> tuple[str, str]:
    import psycopg
    from sqlalchemy import create_engine, text

    from rsc_health.historian.db import connect

    name = f"rsc_bench_{uuid.uuid4().hex[:10]}"
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    url = admin_url.rsplit("/", 1)[0] + f"/{name}"
    connect(url).dispose()
    dsn = url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(dsn) as con, con.cursor() as cur:
        for table, cols, data in (
            ("jobs", JOB_COLS, jobs_rows),
            ("job_nodes", ("job_pk", "node"), node_rows),
            ("attributions", ATT_COLS, att_rows),
        ):
            quoted = ", ".join(f'"{c}"' for c in cols)
            with cur.copy(f"COPY {table} ({quoted}) FROM STDIN") as copy:
                for row in data:
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


def run_metrics(url: str) -> dict:
    """The whole metric set, timed one by one; peak RSS of this process at the end."""
    from sqlalchemy import create_engine

    from rsc_health.historian.metrics.goodput import goodput_lost
    from rsc_health.historian.metrics.mttf import mttf_by_size
    from rsc_health.historian.metrics.rates import causes, failure_rate, outcomes, rolling
    from rsc_health.historian.metrics.runs import job_runs

    engine = create_engine(url)
    out: dict = {}

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
    out["peak_rss_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    out["r_f_per_1000"] = round(fr.r_f * 1000, 3)
    out["runs_48h"] = len(runs)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=4_000_000)
    ap.add_argument("--backend", choices=["sqlite", "postgres", "both"], default="both")
    ap.add_argument(
        "--pg",
        default=os.environ.get(
            "RSC_HEALTH_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
        ),
    )
    ap.add_argument("--metrics-only", metavar="URL", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.metrics_only:
        print(json.dumps(run_metrics(args.metrics_only)))
        return

    t = time.perf_counter()
    jobs_rows, node_rows, att_rows = rows(generate(args.jobs))
    print(
        f"generated {len(jobs_rows):,} job instances, {len(node_rows):,} job_nodes, "
        f"{len(att_rows):,} attributions in {time.perf_counter() - t:.1f} s",
        flush=True,
    )
    backends = ["sqlite", "postgres"] if args.backend == "both" else [args.backend]
    with tempfile.TemporaryDirectory() as tmp:
        for backend in backends:
            t = time.perf_counter()
            if backend == "sqlite":
                url, pg_name = (
                    load_sqlite(os.path.join(tmp, "bench.db"), jobs_rows, node_rows, att_rows),
                    None,
                )
            else:
                url, pg_name = load_postgres(args.pg, jobs_rows, node_rows, att_rows)
            load_s = time.perf_counter() - t
            try:
                res = subprocess.run(
                    [sys.executable, __file__, "--metrics-only", url],
                    check=True,
                    capture_output=True,
                    text=True,
                )
                figures = json.loads(res.stdout.strip().splitlines()[-1])
            finally:
                if pg_name:
                    drop_postgres(args.pg, pg_name)
            print(f"{backend}: load {load_s:.1f} s; metrics {json.dumps(figures)}", flush=True)


if __name__ == "__main__":
    main()
