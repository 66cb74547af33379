"""The node path drains a node while qualification holds it (the burn raised an XID 79: a
never-resume fault, drained now). The flow's inconclusive or fail drain wrote
`rsc_health:qualify:<code>` over it (only a person's drain or a `healthctl drain` was kept),
and so did `qualify cleanup`'s `interrupted`: the XID 79 was gone, `qualify auto` retried the
node after its back-off and a flaky pass put it back in service. A pass stored meanwhile
released it with the node path's drain standing but no finding said. Now a node-path (now,
after the job) or lemon drain set since the flow lifted the node's drain is the run's finding:
kept as it is, the run a fail, a repair ticket."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from rsc_health.qualify.flow import cleanup, reservation_name
from rsc_health.qualify.judge import FAIL, INCONCLUSIVE, PASS
from rsc_health.slurm.memory import MemorySlurm
from tests.unit.test_qualify_parallel import History, flow

CAME_WITH = "rsc_health:now:xid48:gpu3 DBE"  # the repair drain it came to qualification with
MID = "rsc_health:now:xid79:gpu5 fell off the bus"  # the node path, during the burn
LEMON = "rsc_health:lemon:lemon:4 failures in 30 days"


@pytest.mark.parametrize("stored", [PASS, INCONCLUSIVE, FAIL])
@pytest.mark.parametrize("suspect", [False, True])
@pytest.mark.parametrize("mid", [MID, "rsc_health:job:xid13:gpu1 graphics engine", LEMON])
def test_a_drain_the_node_path_sets_mid_flow_stays_and_fails_the_run(stored, suspect, mid):
    slurm = MemorySlurm()
    if suspect:
        slurm.add_node("gpu042", "IDLE")
    else:
        slurm.add_node("gpu042", "IDLE+DRAIN", CAME_WITH,
                       when=datetime.now(UTC) - timedelta(days=1))

    def job_starts_then_node_path_drains():
        slurm.start_job("gpu042", max(slurm._jobs), user="root")
        slurm.drain("gpu042", mid)  # its requeue is refused: the job was --no-requeue

    slurm.after("submit", job_starts_then_node_path_drains)
    hist = History(slurm, {"gpu042": stored}, after=0.02)
    r = flow(slurm, hist).run("gpu042", suspect=suspect)
    info = slurm.info["gpu042"]
    assert info.drain_set and info.reason == mid, info
    assert r.result == FAIL and mid[:60] in r.detail, r
    assert [n for n, _why in hist.tickets] == ["gpu042"]
    assert not [c for c in slurm.calls if c[0] == "drain" and c[2] != mid]
    assert not slurm.reservations()


def test_a_drain_the_flow_itself_lifted_is_not_taken_for_a_finding():
    """The node came with the node path's drain; the flow lifted it and the run passed: a
    pass, released, no ticket (the drain it came with is not the run's finding)."""
    slurm = MemorySlurm()
    slurm.add_node("gpu042", "IDLE+DRAIN", CAME_WITH)
    hist = History(slurm, {"gpu042": PASS}, after=0.0)
    r = flow(slurm, hist).run("gpu042")
    assert r.result == PASS and not slurm.info["gpu042"].drain_set and not hist.tickets


def test_cleanup_keeps_a_node_path_drain_and_tickets_one_set_during_the_cut_short_flow():
    t0 = datetime.now(UTC)
    slurm = MemorySlurm(now=lambda: t0)
    slurm.add_node("gpu001", "IDLE")  # resumed into its reservation, then the flow was killed
    slurm.add_node("gpu002", "IDLE+DRAIN", CAME_WITH, when=t0 - timedelta(days=1))
    for n in ("gpu001", "gpu002"):
        slurm.create_reservation(reservation_name(n), n)
    slurm.drain("gpu001", MID)  # the node path, after the reservation began
    hist = History(slurm, {})
    results = {r.node: r for r in cleanup(slurm, hist)}
    assert slurm.info["gpu001"].reason == MID and slurm.info["gpu002"].reason == CAME_WITH
    assert results["gpu001"].result == FAIL and results["gpu002"].result == INCONCLUSIVE
    assert [n for n, _why in hist.tickets] == ["gpu001"]
    assert not slurm.reservations()
    assert not [c for c in slurm.calls if c[0] == "drain" and c[2] != MID]
