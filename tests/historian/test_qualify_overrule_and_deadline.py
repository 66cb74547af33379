"""HistorianSide.overrule and flow_deadline on both backends (the flow's and cleanup's SQL):
only the named job's passes since the given time become fails, their reason saying why first
and the stored reason kept; a flow's deadline is read from its newest start since its
reservation began, and one from a flow before that, or a start that said none, gives none."""
from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from sqlalchemy import delete, insert, select, update

from rsc_health.historian.schema import node_actions, qualify_runs
from rsc_health.model import ActionKind
from rsc_health.qualify.flow import Flow, HistorianSide
from rsc_health.qualify.judge import FAIL, PASS


def _run(engine, job_id, ended, verdict=PASS, node="gpu042"):
    with engine.begin() as conn:
        conn.execute(insert(qualify_runs).values(
            run_id=uuid.uuid4().hex, node=node, tier="full", started=ended - timedelta(minutes=9),
            ended=ended, verdict=verdict, reason="all tests within the peers",
            gpu_model="H100", driver="550", job_id=job_id))


def test_overrule_marks_only_the_named_jobs_passes_since_then(historian):
    now = datetime.now(UTC).replace(tzinfo=None)
    _run(historian, "7", now - timedelta(days=3))  # an earlier, real pass
    _run(historian, "9", now)                      # the run the flow judged a fail
    _run(historian, "9", now, node="gpu043")       # another node's job 9
    side = HistorianSide(historian)
    assert side.overrule("gpu042", "xid79 under the burn", since=now - timedelta(minutes=10),
                         job_id="9") == 1
    with historian.connect() as conn:
        rows = {(n, j): (v, r) for n, j, v, r in conn.execute(select(
            qualify_runs.c.node, qualify_runs.c.job_id, qualify_runs.c.verdict,
            qualify_runs.c.reason))}
    assert rows[("gpu042", "9")] == (FAIL, "overruled: xid79 under the burn; stored: "
                                           "all tests within the peers")
    assert rows[("gpu042", "7")][0] == PASS and rows[("gpu043", "9")][0] == PASS
    assert side.passed_since("gpu042", now - timedelta(days=1)) is False


def test_flow_deadline_is_the_newest_start_since_the_reservation(historian):
    side = HistorianSide(historian)
    began = datetime.now(UTC)
    assert side.flow_deadline("gpu042", began) is None
    with historian.begin() as conn:  # an older version's start: no deadline said
        conn.execute(insert(node_actions).values(
            id=uuid.uuid4().hex, time=began.replace(tzinfo=None), node="gpu042",
            action=ActionKind.QUALIFY_START.value, reason="full tier in rsc_health_qualify_gpu042"))
    assert side.flow_deadline("gpu042", began) is None
    Flow(None, side, command=["healthctl"], tier="full", timeout_s=7200)._started(
        "gpu042", "rsc_health_qualify_gpu042", began)
    until = side.flow_deadline("gpu042", began)
    assert until is not None and abs((until - began).total_seconds() - 7500) < 1
    # A reservation made a day later is not this flow's.
    assert side.flow_deadline("gpu042", began + timedelta(days=1)) is None


def test_flow_deadline_is_only_this_reservations_flows(historian):
    """helper-130: a start since 10 min before the reservation began was taken for its flow's,
    though every flow of a node makes a reservation of the same name: a start naming another
    reservation's start, or naming none and written before this one began, is not its."""
    side = HistorianSide(historian)
    began = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=1)
    earlier = began - timedelta(minutes=7)
    flow = Flow(None, side, command=["healthctl"], tier="full", timeout_s=86400)
    flow._started("gpu042", "rsc_health_qualify_gpu042", earlier, reserved=earlier)
    assert side.flow_deadline("gpu042", began) is None  # an earlier reservation's flow

    def written(at):
        with historian.begin() as conn:
            conn.execute(update(node_actions).where(
                node_actions.c.node == "gpu042").values(time=at.replace(tzinfo=None)))
    written(earlier)
    assert side.flow_deadline("gpu042", earlier) is not None  # its own
    with historian.begin() as conn:
        conn.execute(delete(node_actions))
    flow._started("gpu042", "rsc_health_qualify_gpu042", earlier)  # naming no start
    written(earlier)
    assert side.flow_deadline("gpu042", began) is None
    # This reservation's own start names it: counted on a flow host's clock 5 min behind.
    Flow(None, side, command=["healthctl"], tier="full", timeout_s=7200)._started(
        "gpu042", "rsc_health_qualify_gpu042", began, reserved=began)
    with historian.begin() as conn:
        conn.execute(update(node_actions).where(node_actions.c.reason.contains(" from ")
                                                ).values(time=(began - timedelta(minutes=5)
                                                               ).replace(tzinfo=None)))
    until = side.flow_deadline("gpu042", began)
    assert until is not None and abs((until - began).total_seconds() - 7500) < 1
