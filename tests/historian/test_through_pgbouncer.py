"""Behind PgBouncer in transaction pooling mode (docs/deployment.md: above a few thousand
nodes), every node's flush and every command works, whichever backend it lands on.

psycopg prepares a statement on the server after five runs, and executemany at once, naming
it `_pg3_0`, `_pg3_1`, ... per client connection. Behind a transaction pool the backend that
holds `_pg3_0` serves the next node too, whose own `_pg3_0` then fails ("prepared statement
already exists"), or a client's next transaction lands on a backend without it ("does not
exist"): every flush after the first failed, and the spools only grew."""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from rsc_health.historian.db import connect
from rsc_health.historian.ingest.delivery import deliver, flush
from rsc_health.historian.intervals import open_failures

from . import pgbouncer

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.skipif(not pgbouncer.available(), reason="pgbouncer (Debian package) missing"),
]


def _spool(root: Path, node: str, sweeps: int, failing_from: int | None = None) -> Path:
    sdir = root / node
    sdir.mkdir(parents=True)
    with (sdir / "batch-0001.jsonl").open("w") as fh:
        for s in range(sweeps):
            t = (datetime(2026, 1, 1) + timedelta(minutes=5 * s)).isoformat()
            for fam in ("gpu", "ecc", "infiniband"):
                bad = fam == "infiniband" and failing_from is not None and s >= failing_from
                fh.write(json.dumps({
                    "kind": "check", "id": uuid.uuid4().hex, "time": t, "node": node,
                    "source": "sweep", "check": fam, "component": "mlx5_0/1" if bad else "*",
                    "status": "fail" if bad else "ok",
                    "severity": "drain_now" if bad else "none",
                    "code": "ib_down" if bad else "", "reason": "port down" if bad else "",
                }) + "\n")
            fh.write(json.dumps({"kind": "heartbeat", "id": uuid.uuid4().hex, "time": t,
                                 "node": node, "source": "sweep", "level": "ok"}) + "\n")
    return sdir


def test_every_node_flushes_through_a_transaction_pool(pg_url, tmp_path):
    # the schema, created directly (a role the nodes do not have)
    connect(pg_url, create_missing=True).dispose()
    with pgbouncer.pgbouncer(pg_url) as pooled:
        for i in range(4):  # one process per node in production: one engine each here
            report = flush(pooled, _spool(tmp_path, f"gpu{i:03d}", 12, failing_from=6))
            assert report.delivered == {"check": 36, "heartbeat": 12}
        # one client, many transactions (a big spool in chunks), alternating backends
        engine = connect(pooled, create_missing=True)
        try:
            report = deliver(engine, _spool(tmp_path, "gpu999", 40), chunk_lines=8)
            assert report.delivered == {"check": 120, "heartbeat": 40}
            assert report.batches == 1
        finally:
            engine.dispose()
    direct = connect(pg_url, create_missing=True)
    try:
        with direct.connect() as conn:
            failing = {r["node"] for r in open_failures(conn)}
        assert failing == {f"gpu{i:03d}" for i in range(4)}
    finally:
        direct.dispose()



def test_accounting_loads_twice_through_a_transaction_pool_and_keeps_each_job_once(
        pg_url, tmp_path):
    from sqlalchemy import text

    from rsc_health.historian.ingest.sacct import ingest_text

    from .conftest import FIXTURES

    connect(pg_url, create_missing=True).dispose()
    with pgbouncer.pgbouncer(pg_url) as pooled:
        engine = connect(pooled, create_missing=True)
        try:
            first = ingest_text(engine, FIXTURES / "sacct_small.txt")
            again = ingest_text(engine, FIXTURES / "sacct_small.txt")  # the upsert's path
            with engine.connect() as conn:
                jobs = conn.execute(text("SELECT count(*) FROM jobs")).scalar()
        finally:
            engine.dispose()
    assert first.written == again.written == jobs > 0
