"""The features read from job_nodes (jobs, single_node_jobs, single_node_node_fails,
single_node_failed_jobs, early_fails) come from one grouped pass over the window's jobs and
their job_nodes key range, not a query each. Pinned against the definitions worked out row by
row in pandas from the tables themselves, on a seeded mixed history: multi-node jobs,
two causes of one failure, an unattributed NODE_FAIL, quick failures, jobs on the window's
edges, a job that never started, and a node back from a lemon repair inside the window
(counted from its repair)."""

from __future__ import annotations

import random
from datetime import timedelta

import pandas as pd
from lemon_fleet import AS_OF
from sqlalchemy import insert, select

from rsc_health.historian import schema
from rsc_health.historian.lemons.features import lemon_features

WINDOW = timedelta(days=28)
NODES = [f"n{i:02d}" for i in range(12)]
REPAIRED = ("n03", AS_OF - timedelta(days=9))  # lemon ticket closed inside the window
COUNTED = ("jobs", "single_node_jobs", "single_node_node_fails", "single_node_failed_jobs",
           "early_fails")


def _history(fleet) -> None:
    """One transaction (a job per transaction costs seconds on PostgreSQL)."""
    rng = random.Random(7)
    states = ["COMPLETED"] * 5 + ["FAILED"] * 3 + ["NODE_FAIL", "CANCELLED"]
    jobs, on, att = [], [], []

    def job(nodes, *, state="COMPLETED", end, minutes=60, started=True) -> int:
        pk = len(jobs) + 1
        start = end - timedelta(minutes=minutes)
        jobs.append(dict(id=pk, job_id=str(1000 + pk), job_id_display=str(1000 + pk),
                         state=state, submit=start, start=start if started else None, end=end,
                         nnodes=len(nodes), gpus=8 * len(nodes), nodelist=",".join(nodes),
                         instance_key=f"{pk}:{start}:{start}"))
        on.extend({"job_pk": pk, "node": n} for n in nodes)
        return pk

    def blame(pk, node, cause="xid", kind="check"):
        att.append(dict(job_pk=pk, node=node, cause=cause, kind=kind, code="", evidence=""))

    for _ in range(160):
        nodes = rng.sample(NODES, rng.choice([1, 1, 1, 2, 3, 4]))
        end = AS_OF - timedelta(seconds=rng.randrange(0, 40 * 86400))
        state = rng.choice(states)
        pk = job(nodes, state=state, end=end, minutes=rng.choice([2, 9, 10, 11, 60, 600]))
        if state in ("FAILED", "NODE_FAIL") and rng.random() < 0.6:
            culprit = rng.choice(nodes)
            blame(pk, culprit)
            if rng.random() < 0.3:  # a second cause of the same failure on the same node
                blame(pk, culprit, cause="pcie", kind="event")
        elif state == "NODE_FAIL":
            blame(pk, None, cause="unattributed", kind="unattributed")
    # On the edges: ends exactly at the window's start (in) and at as_of (out).
    blame(job(["n01"], state="FAILED", end=AS_OF - WINDOW, minutes=5), "n01")
    blame(job(["n01"], state="FAILED", end=AS_OF, minutes=5), "n01")
    # Never started: no early failure, still a job.
    job(["n02"], state="NODE_FAIL", end=AS_OF - timedelta(days=1), started=False)
    # Seen only before the window: in no window count.
    job(["n99"], end=AS_OF - WINDOW - timedelta(days=3))
    with fleet.engine.begin() as conn:
        conn.execute(insert(schema.jobs), jobs)
        conn.execute(insert(schema.job_nodes), on)
        conn.execute(insert(schema.attributions), att)
    node, closed = REPAIRED
    fleet.ticket(node, closed - timedelta(days=2), closed, source="lemon", reason="lemon")


def _expected(engine) -> pd.DataFrame:
    """Each count, worked out row by row from jobs, job_nodes and attributions."""
    with engine.connect() as conn:
        jobs = pd.DataFrame(conn.execute(select(schema.jobs)).mappings().all())
        on = pd.DataFrame(conn.execute(select(schema.job_nodes)).mappings().all())
        att = pd.DataFrame(conn.execute(select(schema.attributions)).mappings().all())
    blamed = {(r.job_pk, r.node) for r in att.itertuples() if r.kind in ("check", "event")}
    rows = on.merge(jobs, left_on="job_pk", right_on="id")
    since = rows["node"].map({REPAIRED[0]: REPAIRED[1]}).fillna(AS_OF - WINDOW)
    rows = rows[(rows["end"] >= since) & (rows["end"] < AS_OF)]
    by_node = [(pk, n) in blamed for pk, n in zip(rows["job_pk"], rows["node"], strict=True)]
    rows = rows.assign(
        blamed=by_node,
        single=rows["nnodes"] == 1,
        failed=rows["state"].isin(["FAILED", "NODE_FAIL"]),
        quick=(rows["end"] - rows["start"]).dt.total_seconds() <= 600.5,
    )
    rows["single_node_node_fails"] = rows["single"] & (rows["blamed"]
                                                       | (rows["state"] == "NODE_FAIL"))
    rows["single_node_failed_jobs"] = rows["single"] & rows["failed"]
    rows["early_fails"] = (rows["start"].notna() & rows["failed"] & rows["quick"]
                           & (rows["single"] | rows["blamed"]))
    rows["jobs"] = True
    rows["single_node_jobs"] = rows["single"]
    return rows.groupby("node")[list(COUNTED)].sum().astype("int64")


def test_job_node_counts_match_their_definitions_row_by_row(fleet_any):
    _history(fleet_any)
    got = lemon_features(fleet_any.engine, AS_OF, 28, host_jobs=False)
    want = _expected(fleet_any.engine)
    assert want["single_node_node_fails"].sum() > 0 and want["early_fails"].sum() > 0
    assert REPAIRED[0] in want.index
    # Every node a job ended on in the window is in the frame; n99 (jobs before it only) not.
    assert set(want.index) <= set(got.index)
    assert "n99" not in got.index
    pd.testing.assert_frame_equal(
        got.loc[want.index, list(COUNTED)], want, check_names=False)
    # Nodes the frame holds for other reasons count no jobs.
    others = got.drop(index=want.index)
    assert (others[list(COUNTED)] == 0).all().all()
