"""Which nodes `healthctl qualify auto` takes without a person asking: repaired (a ticket
closed after rsc-health drained it) and runs that proved nothing (after a doubling back-off);
never a person's drain, a DOWN node, a reboot Slurm holds or a `healthctl drain`."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from rsc_health.qualify.flow import auto_candidates
from rsc_health.slurm.api import NodeInfo

NOW = datetime(2026, 11, 26, 12, 0)
DRAINED = datetime(2026, 11, 25, 8, 0, tzinfo=UTC)


class History:
    def __init__(self, closed=None, streaks=None):
        self.closed, self.streaks = closed or {}, streaks or {}

    def ticket_closed_after(self, node, since):
        t = self.closed.get(node)
        return t if t is not None and since is not None and t > since else None

    def inconclusive_streak(self, node):
        return self.streaks.get(node, (0, None))


def node(name, state="IDLE+DRAIN", reason="rsc_health:now:xid79:gpu3 fell off the bus"):
    return NodeInfo(name, state, reason, "root", DRAINED)


def test_a_closed_repair_ticket_makes_a_node_due_and_an_open_or_older_one_does_not():
    nodes = [node("a"), node("b"), node("c")]
    hist = History(closed={"a": datetime(2026, 11, 26, 9, 0), "b": datetime(2026, 11, 24, 9)})
    assert auto_candidates(nodes, hist, NOW, retry_min=30, retry_max_min=720, limit=10) == [
        ("a", "repair ticket closed 2026-11-26 09:00")]


def test_an_inconclusive_run_is_retried_after_a_doubling_back_off():
    inc = "rsc_health:qualify:inconclusive:dcgm_r1: tool not found"
    nodes = [node("x", reason=inc), node("y", reason=inc), node("z", reason=inc)]
    hist = History(streaks={"x": (1, NOW - timedelta(minutes=31)),   # 30 min: due
                            "y": (3, NOW - timedelta(minutes=100)),  # 120 min: not yet
                            "z": (9, NOW - timedelta(hours=13))})    # capped at 720 min: due
    due = [n for n, _ in auto_candidates(nodes, hist, NOW, retry_min=30, retry_max_min=720,
                                         limit=10)]
    assert due == ["x", "z"]


def test_a_persons_drain_down_reboot_or_operator_drain_is_never_due():
    closed = datetime(2026, 11, 26, 9, 0)
    nodes = [node("p", reason="alice: BIOS update"), node("d", state="DOWN+DRAIN"),
             node("r", state="IDLE+DRAIN+REBOOT_REQUESTED"),
             node("m", reason="rsc_health:manual:manual:PSU swap by bob"),
             node("u", state="IDLE")]
    hist = History(closed={n.name: closed for n in nodes})
    assert auto_candidates(nodes, hist, NOW, retry_min=30, retry_max_min=720, limit=10) == []


def test_at_most_the_limit_a_run():
    nodes = [node(f"n{i}") for i in range(10)]
    hist = History(closed={n.name: datetime(2026, 11, 26, 9) for n in nodes})
    assert len(auto_candidates(nodes, hist, NOW, retry_min=30, retry_max_min=720,
                               limit=4)) == 4
