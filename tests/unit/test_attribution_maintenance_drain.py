"""Attribution rule 2 (a NODE_FAIL with no failing check) blames every
node of the job whose node_events row was open at the job's end, whatever that row is. A
node a person drained for planned maintenance while the job kept running on it (Slurm lets
running jobs finish on a DRAIN node) is blamed `node_down` for a NODE_FAIL that another node
of the job caused -- and a node back from a lemon repair becomes a repeat offender on it."""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import create_engine, insert, select

from rsc_health.historian import db, schema
from rsc_health.historian.attribute import attribute
from rsc_health.historian.lemons.features import lemon_features
from rsc_health.historian.lemons.verdicts import LemonRules, lemon_verdicts

AS_OF = datetime(2026, 3, 1)
END = AS_OF - timedelta(days=2)


def _historian(tmp_path):
    engine = create_engine(f"sqlite:///{tmp_path / 'h.db'}")
    db.create(engine)
    with engine.begin() as conn:
        # a 2-node job that died because n2 stopped answering
        conn.execute(insert(schema.jobs).values(
            id=1, job_id="1001", job_id_display="1001", state="NODE_FAIL",
            submit=END - timedelta(hours=5), start=END - timedelta(hours=4), end=END,
            nnodes=2, gpus=16, nodelist="n[1-2]", instance_key="1001:x:1"))
        conn.execute(insert(schema.job_nodes), [{"job_pk": 1, "node": "n1"},
                                                {"job_pk": 1, "node": "n2"}])
        conn.execute(insert(schema.node_events).values(
            node="n2", start=END - timedelta(seconds=20), end=END + timedelta(hours=3),
            state="DOWN", reason="Not responding"))
        # n1: drained by a person for planned maintenance two hours earlier; the job ran on
        conn.execute(insert(schema.node_events).values(
            node="n1", start=END - timedelta(hours=2), end=END + timedelta(hours=6),
            state="DRAIN", reason="maint: firmware upgrade after jobs"))
    return engine


def test_a_node_drained_for_maintenance_is_not_blamed_for_anothers_node_fail(tmp_path):
    engine = _historian(tmp_path)
    attribute(engine)
    a = schema.attributions
    with engine.connect() as conn:
        blamed = sorted(conn.execute(select(a.c.node).where(a.c.job_pk == 1)).scalars())
    engine.dispose()
    assert blamed == ["n2"]


def test_maintenance_drain_does_not_make_a_repaired_node_a_repeat_offender(tmp_path):
    engine = _historian(tmp_path)
    with engine.begin() as conn:  # n1 came back from a lemon repair ten days ago
        conn.execute(insert(schema.tickets).values(
            node="n1", opened=AS_OF - timedelta(days=20), closed=AS_OF - timedelta(days=10),
            source="lemon", reason="lemon"))
    attribute(engine)
    rules = LemonRules.from_config()
    verdicts = lemon_verdicts(engine, lemon_features(engine, AS_OF), AS_OF, rules)
    engine.dispose()
    assert "n1" not in [v.node for v in verdicts], [(v.node, v.top_feature) for v in verdicts]


# helper-213: MAINT reservations and rule 2. rsc-health's own qualification holds the node in
# a MAINT,IGNORE_JOBS reservation (rsc_health_qualify_<node>) while its burn-in job runs: a
# crash under that load is the node's own failure. And a person's MAINT window opening half an
# hour after a node crashed did not plan that crash (MAINT_LEAD is the lemon counts' alone).
def _crashed_under_reservation(tmp_path, resv_name, resv_start, resv_end):
    engine = create_engine(f"sqlite:///{tmp_path / 'r.db'}")
    db.create(engine)
    with engine.begin() as conn:
        conn.execute(insert(schema.reservations).values(
            cluster="", name=resv_name, start=resv_start, end=resv_end,
            flags="MAINT,IGNORE_JOBS,SPEC_NODES", nodelist="n1"))
        conn.execute(insert(schema.jobs).values(
            id=1, job_id="1001", job_id_display="1001", state="NODE_FAIL",
            submit=END - timedelta(hours=1), start=END - timedelta(minutes=40), end=END,
            nnodes=1, gpus=8, nodelist="n1", instance_key="1001:x:1"))
        conn.execute(insert(schema.job_nodes), [{"job_pk": 1, "node": "n1"}])
        # n1 stopped answering under load; the job died NODE_FAIL 20 s later
        conn.execute(insert(schema.node_events).values(
            node="n1", start=END - timedelta(seconds=20), end=END + timedelta(hours=5),
            state="DOWN", reason="Not responding"))
    attribute(engine)
    a = schema.attributions
    with engine.connect() as conn:
        rows = conn.execute(select(a.c.node, a.c.cause).where(a.c.job_pk == 1)).all()
    engine.dispose()
    return [tuple(r) for r in rows]


def test_a_node_crashing_during_its_own_qualification_is_blamed_for_the_node_fail(tmp_path):
    assert _crashed_under_reservation(
        tmp_path, "rsc_health_qualify_n1", END - timedelta(hours=1), END + timedelta(hours=1),
    ) == [("n1", "node_down")]


def test_a_node_crashing_half_an_hour_before_a_maint_window_is_blamed(tmp_path):
    assert _crashed_under_reservation(
        tmp_path, "rack7_fw", END + timedelta(minutes=30), END + timedelta(hours=6),
    ) == [("n1", "node_down")]


def test_a_node_crashing_inside_a_persons_maint_window_is_still_maintenance(tmp_path):
    # the rule 45ec0a3 added stands for a person's window that was open when the node went
    assert _crashed_under_reservation(
        tmp_path, "rack7_fw", END - timedelta(hours=1), END + timedelta(hours=6),
    ) == [(None, "unattributed")]
