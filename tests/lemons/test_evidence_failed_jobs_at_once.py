"""The failed jobs in a lemon verdict's evidence are read for every candidate in one query
(failed_jobs_evidence), not one query a node that read the window's jobs again each time.
Pinned against the definition worked out in pandas from the tables: per node its own failures
in the window (attributed to it, or single-node NODE_FAIL), a row per attributed cause, newest
first (one end time: the newer job first, then attribution order), at most `limit`."""

from __future__ import annotations

import random
from datetime import timedelta

import pandas as pd
from lemon_fleet import AS_OF
from sqlalchemy import select

from rsc_health.historian import schema
from rsc_health.historian.lemons.verdicts import evidence, failed_jobs_evidence

NODES = ["n1", "n2", "n3", "n4"]
LIMIT = 4


def _history(fleet) -> None:
    rng = random.Random(3)
    for _ in range(40):
        nodes = rng.sample(NODES, rng.choice([1, 1, 2]))
        # whole hours: several jobs end in the same second
        end = AS_OF - timedelta(hours=rng.randrange(0, 35 * 24, 6))
        state = rng.choice(["FAILED", "NODE_FAIL", "COMPLETED"])
        pk = fleet.job(nodes, state=state, end=end)
        if state != "COMPLETED" and rng.random() < 0.7:
            culprit = rng.choice(nodes)
            fleet.attribute(pk, culprit, cause="xid")
            if rng.random() < 0.4:
                fleet.attribute(pk, culprit, cause="pcie", kind="event")


def _expected(engine) -> dict[str, list[tuple]]:
    with engine.connect() as conn:
        jobs = pd.DataFrame(conn.execute(select(schema.jobs)).mappings().all())
        on = pd.DataFrame(conn.execute(select(schema.job_nodes)).mappings().all())
        att = pd.DataFrame(conn.execute(select(schema.attributions)).mappings().all())
    rows = on.merge(jobs, left_on="job_pk", right_on="id")
    rows = rows.merge(att.rename(columns={"id": "att_id"}), how="left",
                      on=["job_pk", "node"])
    own = rows["kind"].isin(["check", "event"]) | ((rows["nnodes"] == 1)
                                                   & (rows["state"] == "NODE_FAIL"))
    rows = rows[own & rows["state"].isin(["FAILED", "NODE_FAIL"])
                & (rows["end"] >= AS_OF - timedelta(days=28)) & (rows["end"] < AS_OF)]
    rows = rows.sort_values(["end", "job_pk", "att_id"], ascending=[False, False, True])
    return {node: [(r.job_id, str(r.end), r.cause if isinstance(r.cause, str) else None)
                   for r in group.head(LIMIT).itertuples()]
            for node, group in rows.groupby("node")}


def test_every_candidates_failed_jobs_at_once_match_their_definition(fleet_any):
    _history(fleet_any)
    engine = fleet_any.engine
    want = _expected(engine)
    got = failed_jobs_evidence(engine, NODES, AS_OF, limit=LIMIT)
    assert set(got) == set(want) and len(want) >= 3
    assert any(len(rows) == LIMIT for rows in want.values())  # the limit is reached
    for node, rows in got.items():
        assert [(r["job_id"], r["end"], r["cause"]) for r in rows] == want[node], node
        assert set(rows[0]) == {"job_id", "state", "start", "end", "nnodes", "cause", "code"}
    # One node's evidence on its own reads the same rows.
    assert evidence(engine, "n1", AS_OF, limit=LIMIT)["failed_jobs"] == got["n1"]
