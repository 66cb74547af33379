"""A job `ingest sacct` has not told of yet (it runs hourly) is judged from its nodes' prologs
(job_starts, failslow/load.py untold): each node's job_start names the job's nodelist, the
flush keeps it, and once every node of the list has told, the job runs on those nodes from
their prologs to their epilogs. Once sacct tells of the job its row is the job, and nothing is
counted twice."""

from __future__ import annotations

from datetime import datetime, timedelta

import numpy as np
import pandas as pd
import pytest
from sqlalchemy import func, insert, select

from rsc_health import spool
from rsc_health.config import load_config
from rsc_health.historian import schema
from rsc_health.historian.failslow import detect
from rsc_health.historian.failslow.explain import explain_job
from rsc_health.historian.failslow.load import UNTOLD_MAX, membership
from rsc_health.historian.ingest.delivery import deliver
from tests.historian.job_rows import add_job

CFG = load_config(None)
T0 = datetime(2026, 11, 26, 10, 10, 0)  # the job starts; the hourly ingest comes at 11:07
NODES = [f"gpu{i:03d}" for i in range(1, 9)]
NODELIST = "gpu[001-008]"


def _start(node: str, when: datetime, job_id: str = "7101", nodes: str = NODELIST) -> dict:
    """The prolog's record (rsc_health/node/act.py job_records)."""
    return spool.record("job_start", node, when, job_id=job_id, excluded=[], user="alice",
                        partition="train", nodes=nodes)


def _sample(node: str, when: datetime, frac: float) -> dict:
    return spool.record("telemetry", node, when, source="sweep", job_id=None, interval_s=300.0,
                        metrics={"throttle_hw_frac": {"value": frac, "component": "gpu2"}})


def _spools(tmp_path, until: datetime, start: datetime = T0, job_id: str = "7101") -> dict:
    """Each node's spool: its prolog's job_start, then a sweep every 5 minutes to `until`;
    gpu005 is stuck in HW slowdown from the job's start, the others' healthy jitter."""
    rng = np.random.default_rng(5)
    out = {}
    for i, node in enumerate(NODES):
        records = [_start(node, start + timedelta(seconds=2 + i), job_id)]
        t = start + timedelta(seconds=40 + 20 * i)
        while t <= until:
            frac = 0.8 if node == "gpu005" else max(0.0, rng.normal(0, 0.01))
            records.append(_sample(node, t, frac))
            t += timedelta(minutes=5)
        sdir = tmp_path / node
        sdir.mkdir(exist_ok=True)
        spool.append(sdir, records)
        out[node] = sdir
    return out


def _told(engine, job_id: str = "7101", start: datetime = T0, nodes=NODES):
    """What the next `ingest sacct` leaves: the job's row (read running) and its nodes."""
    add_job(engine, job_id, start, nodes, submit=start - timedelta(minutes=3))


def _found(engine, now):
    return [(e.node, e.metric, e.job_ids) for e in detect(engine, now, CFG)]


def test_a_job_sacct_has_not_told_of_is_judged_once_its_nodes_flushed(historian, tmp_path):
    # another job, running since the day before, that sacct has told of
    _told(historian, "6900", T0 - timedelta(days=1), [f"gpu{i}" for i in range(101, 109)])
    spools = _spools(tmp_path, T0 + timedelta(minutes=35))
    # 10:35: five of the eight nodes have flushed (their prolog and their first sweeps)
    for node in NODES[:5]:
        deliver(historian, spools[node])
    m = membership(historian, T0, T0 + timedelta(minutes=26))
    assert set(m["job_id"]) == {"6900"}  # 7101 is not whole yet
    assert _found(historian, T0 + timedelta(minutes=26)) == []
    # 10:46: the other three have: the job is whole, gpu005's slow start is judged among all
    # eight, 20 minutes before the hourly ingest would have told the detector of the job
    for node in NODES[5:]:
        report = deliver(historian, spools[node])
        assert report.quarantined_count == 0
    now = T0 + timedelta(minutes=36)
    m = membership(historian, now - timedelta(hours=1), now)
    m = m[m["job_id"] == "7101"]
    assert sorted(m["node"]) == NODES and (m["end"] > now).all()
    found = _found(historian, now)
    assert found == [("gpu005", "throttle_hw_frac", ("7101",))]
    # 11:07: sacct tells of it: its row is the job, each node counted once, the same finding
    _told(historian)
    m = membership(historian, now - timedelta(hours=1), now)
    m = m[m["job_id"] == "7101"]
    assert sorted(m["node"]) == NODES and len(m) == len(NODES)
    assert (pd.to_datetime(m["start"]) == T0).all()  # sacct's start, not the prologs'
    assert _found(historian, now) == found
    # ... and when it has ended, read after the nodes' epilogs
    with historian.begin() as conn:
        conn.execute(schema.jobs.update().where(schema.jobs.c.job_id == "7101")
                     .values(end=T0 + timedelta(minutes=50), state="COMPLETED"))
    assert _found(historian, now) == found


def test_a_prolog_delivered_twice_lands_once_and_one_node_jobs_are_not_kept(historian, tmp_path):
    sdir = tmp_path / "spool"
    sdir.mkdir()
    batch = [_start("gpu001", T0), _start("gpu002", T0, "7102", nodes="gpu002"),
             _start("gpu003", T0, "7103", nodes="")]  # an older node's: no nodelist
    spool.append(sdir, batch)
    deliver(historian, sdir)
    spool.append(sdir, batch)  # a node that lost the acknowledgement sends them again
    report = deliver(historian, sdir)
    assert report.quarantined_count == 0 and report.delivered == {"job_start": 3}
    s = schema.job_starts
    with historian.connect() as conn:
        rows = conn.execute(select(s.c.node, s.c.job_id, s.c.nnodes)).all()
        assert conn.execute(select(func.count()).select_from(schema.job_exclusions)).scalar() == 0
    assert rows == [("gpu001", "7101", 8)]


@pytest.mark.parametrize("nodes, reason", [
    ("gpu[002-008]", "does not name its own node"),
    ("gpu[001-", "not a hostlist"),
    (["gpu001", "gpu002"], "not a hostlist"),
])
def test_a_garbled_nodelist_is_quarantined(historian, tmp_path, nodes, reason):
    sdir = tmp_path / "spool"
    sdir.mkdir()
    spool.append(sdir, [_start("gpu001", T0, nodes=nodes)])
    report = deliver(historian, sdir)
    assert report.quarantined_count == 1 and reason in report.quarantined[0][1].message
    with historian.connect() as conn:
        assert conn.execute(select(func.count()).select_from(schema.job_starts)).scalar() == 0


def _deliver(engine, tmp_path, records) -> None:
    sdir = tmp_path / "spool"
    sdir.mkdir(exist_ok=True)
    spool.append(sdir, records)
    report = deliver(engine, sdir)
    assert report.quarantined_count == 0


def _end(node: str, when: datetime, job_id: str = "7101") -> dict:
    return spool.record("job_end", node, when, source="epilog", job_id=job_id)


def test_a_node_claiming_a_job_it_does_not_run_is_no_member_of_it(historian, tmp_path):
    # gpu009 (root there writes its own records) claims 7101 twice: with the job's nodelist
    # (refused at the flush: the list does not name it) and with one that names it too
    now = T0 + timedelta(minutes=40)
    _deliver(historian, tmp_path, [
        *(_start(n, T0) for n in NODES),
        _start("gpu009", T0, nodes="gpu[001-009]")])
    m = membership(historian, now - timedelta(hours=1), now)
    assert sorted(m["node"]) == NODES  # its list is told by it alone: never whole
    # with seven of the eight, and gpu009 in the eighth's place, the job is not whole either
    with historian.begin() as conn:
        conn.execute(schema.job_starts.delete().where(schema.job_starts.c.node == "gpu008"))
    assert membership(historian, now - timedelta(hours=1), now).empty


def test_each_run_ends_at_its_epilog_a_requeue_is_a_new_run_and_a_lost_epilog_is_bounded(
        historian, tmp_path):
    requeued = T0 + timedelta(minutes=30)
    _deliver(historian, tmp_path, [
        *(_start(n, T0) for n in NODES),
        *(_end(n, T0 + timedelta(minutes=20)) for n in NODES[:7]),  # gpu008's epilog lost
        *(_start(n, requeued) for n in NODES[:4])])  # half the requeue's prologs flushed
    now = T0 + timedelta(minutes=40)
    m = membership(historian, now - timedelta(hours=1), now)
    runs = {(r.node, r.start): r.end for r in m.itertuples()}
    # the first run, whole: each node to its epilog, gpu008 to its next prolog of the job...
    assert len(runs) == 8 and runs[("gpu001", T0)] == T0 + timedelta(minutes=20)
    assert runs[("gpu008", T0)] == T0 + UNTOLD_MAX
    # ... and the requeue's run waits for its other four nodes
    _deliver(historian, tmp_path, [_start(n, requeued) for n in NODES[4:]])
    m = membership(historian, now - timedelta(hours=1), now)
    runs = {(r.node, r.start): r.end for r in m.itertuples()}
    assert len(runs) == 16
    assert runs[("gpu008", T0)] == requeued  # the lost epilog: bounded by the requeue
    assert runs[("gpu001", requeued)] == requeued + UNTOLD_MAX  # running on, up to the bound
    # past the bound and no sacct row: the job is read no longer
    late = requeued + UNTOLD_MAX + timedelta(minutes=5)
    assert membership(historian, late, late + timedelta(hours=1)).empty


def test_a_job_id_two_clusters_may_hold_is_read_only_when_its_prologs_agree(historian,
                                                                            tmp_path):
    """Prologs name no cluster: when the window's jobs are two clusters', a job id told by two
    nodelists may be each cluster's job, and is not read until sacct tells of each."""
    now = T0 + timedelta(minutes=40)
    for cluster, job_id, nodes in (("alpha", "500", ["gpu101", "gpu102"]),
                                   ("beta", "600", ["gpu201", "gpu202"])):
        with historian.begin() as conn:
            pk = conn.execute(insert(schema.jobs).values(
                job_id=job_id, job_id_display=job_id, state="RUNNING", submit=T0, start=T0,
                nnodes=2, instance_key=f"{job_id}:{T0}:{T0}", cluster=cluster)
                .returning(schema.jobs.c.id)).scalar_one()
            conn.execute(insert(schema.job_nodes), [{"job_pk": pk, "node": n} for n in nodes])
    _deliver(historian, tmp_path, [
        *(_start(n, T0) for n in NODES),  # 7101: one list
        _start("gpu301", T0, "7200", "gpu[301-302]"), _start("gpu302", T0, "7200", "gpu[301-302]"),
        _start("gpu401", T0, "7200", "gpu[401-402]"), _start("gpu402", T0, "7200", "gpu[401-402]"),
        # 500 is alpha's, running since before these prologs: sacct's row is the job
        _start("gpu501", T0, "500", "gpu[501-502]"), _start("gpu502", T0, "500", "gpu[501-502]")])
    m = membership(historian, now - timedelta(hours=1), now)
    assert set(m.loc[m["node"].isin(NODES), "cluster"]) == {""}
    assert sorted(set(m["job_id"])) == ["500", "600", "7101"]
    assert sorted(m.loc[m["job_id"] == "500", "node"]) == ["gpu101", "gpu102"]


def test_an_untold_job_is_explained_from_its_prologs(historian, tmp_path):
    spools = _spools(tmp_path, T0 + timedelta(minutes=35))
    for node in NODES:
        deliver(historian, spools[node])
    out = explain_job(historian, "7101", T0 + timedelta(minutes=36), CFG)
    assert out.nodes == NODES and "not yet told by `ingest sacct`" in out.notes[0]
    assert [r.node for r in out.rows if r.suspect] == ["gpu005"]
