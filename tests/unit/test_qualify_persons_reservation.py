"""A person's reservation of a node (a firmware flash, a technician at the rack, a customer's
run, a debug session) keeps qualification off it. The flow never looked at reservations: Slurm
22.05 shows a reserved node IDLE, and the flow's MAINT,IGNORE_JOBS reservation is accepted over
any other, so `qualify start` resumed the node and ran its burn there, and `qualify auto` took
an idle suspect or a driver-change node someone had reserved. Now a node in a reservation not
ours (rsc_health_qualify_*) that is active or starts before the flow could end is refused in
words, before anything in Slurm is touched, and looked for again once ours is made (a race);
the candidate functions leave such a node out (tests/slurm/test_qualify_flow.py: on Slurm)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest

from rsc_health.qualify.flow import (
    auto_candidates,
    driver_candidates,
    reserved_by_others,
    suspect_candidates,
)
from rsc_health.qualify.judge import PASS
from rsc_health.slurm.api import NodeInfo
from rsc_health.slurm.memory import MemorySlurm
from tests.unit.test_qualify_parallel import XID79, History, flow

NOW = datetime.now(UTC)


@pytest.mark.parametrize("start,held", [(None, True), (NOW + timedelta(minutes=5), True),
                                        (NOW + timedelta(days=2), False)])
def test_qualify_start_refuses_a_node_in_a_persons_reservation_and_touches_nothing(start,
                                                                                    held):
    """Active, or starting within the flow's timeout (20 s here) and its finish: refused;
    one starting in two days does not stop a run of minutes."""
    slurm = MemorySlurm()
    for n in ("gpu001", "gpu002", "gpu003"):
        slurm.add_node(n, "IDLE+DRAIN", XID79)
    slurm.add_reservation("alice_fw_flash", "gpu[001-002]", start=start)
    r = flow(slurm, History(slurm, dict.fromkeys(("gpu002", "gpu003"), PASS),
                            after=0.0)).run("gpu002")
    if held:
        assert r.result == "refused" and "alice_fw_flash" in r.detail, r
        assert "a person's reservation" in r.detail
        assert slurm.calls == [], slurm.calls  # no reservation, resume, job or drain
        assert slurm.info["gpu002"].reason == XID79
    else:
        assert r.result == PASS, r
    assert set(slurm.reservations()) == {"alice_fw_flash"}


def test_a_persons_reservation_made_while_ours_is_made_backs_the_flow_out():
    slurm = MemorySlurm()
    slurm.add_node("gpu001", "IDLE+DRAIN", XID79)
    slurm.after("create_reservation",
                lambda: slurm.add_reservation("bob_debug", "gpu001", users="bob"))
    r = flow(slurm, History(slurm, {"gpu001": PASS}, after=0.0)).run("gpu001")
    assert r.result == "refused" and "bob_debug" in r.detail, r
    assert [c[0] for c in slurm.calls] == ["create_reservation", "delete_reservation"]
    assert set(slurm.reservations()) == {"bob_debug"}
    assert slurm.info["gpu001"].reason == XID79


def test_qualify_auto_leaves_out_a_suspect_a_driver_change_or_a_repaired_node_reserved():
    later = NOW + timedelta(days=2)
    reserved = reserved_by_others(
        {"bob_debug": ("gpu[001-003]", NOW - timedelta(minutes=1)),
         "carol_next_week": ("gpu004", later),
         "rsc_health_qualify_gpu005": ("gpu005", NOW)}, horizon_s=3600)
    assert set(reserved) == {"gpu001", "gpu002", "gpu003"}, reserved
    naive = NOW.replace(tzinfo=None)
    idle = [NodeInfo(n, "IDLE") for n in ("gpu001", "gpu004", "gpu005")]
    hist = SimpleNamespace(inconclusive_streak=lambda n: (0, None),
                           passed_since=lambda n, s: False,
                           ticket_closed_after=lambda n, s: naive)
    eps = [SimpleNamespace(node=n, tier="applied", source="telemetry", deviation=0.2,
                           since=naive - timedelta(hours=1), metric="gflops")
           for n in ("gpu001", "gpu004")]
    backoff = dict(retry_min=30, retry_max_min=480, limit=8, reserved=reserved)
    assert [n for n, _ in suspect_candidates(idle, eps, hist, naive, **backoff)] == ["gpu004"]
    changed = {n: (naive - timedelta(hours=1), "570", "575") for n in ("gpu001", "gpu004")}
    assert [n for n, _ in driver_candidates(idle, changed, hist, naive, **backoff)] \
        == ["gpu004"]
    drained = [NodeInfo(n, "IDLE+DRAIN", XID79, "root", NOW - timedelta(days=1))
               for n in ("gpu002", "gpu004")]
    assert [n for n, _ in auto_candidates(drained, hist, naive, **backoff)] == ["gpu004"]
