"""`qualify start` (and `qualify auto`) run their flows side by side, at most [qualify]
parallel at once, each on its own node: every node still ends released on a stored pass or
drained, no reservation is left, results come back in the order asked, and the mass-drain
guard still lets fails through one at a time (two fails at once cannot both take the last
room). On the shipped MemorySlurm, made safe for threads by a lock around each call."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta

from rsc_health.policy import parse_reason
from rsc_health.qualify.flow import Flow, mass_drain_guard, run_batches
from rsc_health.qualify.judge import FAIL, PASS
from rsc_health.slurm.memory import MemorySlurm

XID79 = "rsc_health:now:xid79:gpu3 fell off the bus"
METHODS = ("node", "nodes", "drain", "resume", "create_reservation", "delete_reservation",
           "reservations", "submit", "job", "cancel", "start_job", "end_job")


class LockedSlurm(MemorySlurm):
    """MemorySlurm with one lock around each call (slurmctld answers one RPC at a time), and
    the most reservations it ever held at once."""

    def __init__(self, latency_s: float = 0.0):
        super().__init__()
        self.lock = threading.RLock()
        self.most = 0
        self.latency_s = latency_s  # a real controller's answer takes time to come back
        for name in METHODS:
            setattr(self, name, self._locked(getattr(super(), name)))

    def _locked(self, fn):
        def call(*args, **kw):
            with self.lock:
                out = fn(*args, **kw)
                self.most = max(self.most, len(self._reservations))
            time.sleep(self.latency_s)
            return out
        return call


class History:
    """The flow's historian side: a node's job stores its verdict `after` seconds after it
    was submitted (so flows overlap), then the job ends."""

    def __init__(self, slurm, verdicts, after=0.15, at=None):
        self.slurm, self.verdicts, self.after, self.at = slurm, verdicts, after, at
        self.lock = threading.Lock()
        self.actions, self.tickets, self.first_asked = [], [], {}
        self.overruled = []

    def strikes(self, node):
        return 0

    def now(self):  # the historian's clock
        return datetime.now(UTC)

    def result(self, node, job_id, since=None):
        if self.at is not None:  # every verdict lands at the same instant
            if time.monotonic() < self.at:
                return None
        else:
            with self.lock:
                t0 = self.first_asked.setdefault(job_id, time.monotonic())
            if time.monotonic() - t0 < self.after:
                return None
        return self.verdicts[node], "" if self.verdicts[node] == PASS else \
            "gpu_burn: gflops[3] 9% under the peers' median"

    def action(self, node, kind, reason):
        with self.lock:
            self.actions.append((node, kind, reason))

    def repair_ticket(self, node, reason):
        with self.lock:
            self.tickets.append((node, reason))

    def overrule(self, node, why, *, since, job_id=None):
        """A stored pass the flow judged a fail (HistorianSide.overrule): recorded."""
        with self.lock:
            self.overruled.append((node, job_id, why))
        return 1 if self.verdicts.get(node) == PASS else 0


def flow(slurm, hist, **kw):
    return Flow(slurm, hist, command=["healthctl"], tier="full", timeout_s=20, poll_s=0.01, **kw)


def test_six_drained_nodes_three_at_a_time_each_released_on_its_pass_in_the_order_asked():
    slurm = LockedSlurm()
    names = [f"gpu{i:03d}" for i in range(6)]
    for n in names:
        slurm.add_node(n, "IDLE+DRAIN", XID79)
    hist = History(slurm, dict.fromkeys(names, PASS))
    f = flow(slurm, hist)
    seen = []
    results = run_batches([(n, lambda n=n: f.run(n)) for n in names], 3, seen.append)
    assert [r.node for r in results] == names and {r.result for r in results} == {PASS}
    assert sorted(r.node for r in seen) == names
    assert slurm.most == 3  # three reservations at once, never more
    assert not slurm.reservations()
    assert not any(slurm.node(n).drain_set for n in names)


def test_one_at_a_time_is_the_old_order_and_holds_one_reservation():
    slurm = LockedSlurm()
    names = ["a", "b", "c"]
    for n in names:
        slurm.add_node(n, "IDLE+DRAIN", XID79)
    hist = History(slurm, {"a": PASS, "b": FAIL, "c": PASS}, after=0.0)
    f = flow(slurm, hist)
    results = run_batches([(n, lambda n=n: f.run(n)) for n in names], 1)
    assert [(r.node, r.result) for r in results] == [("a", PASS), ("b", FAIL), ("c", PASS)]
    assert slurm.most == 1 and not slurm.reservations()
    assert parse_reason(slurm.node("b").reason)["code"] == "gpu_burn"


class Cfg(dict):
    def get(self, key, default=None):
        return self[key]


def test_four_fails_at_once_take_the_guards_last_room_once_and_the_rest_are_held():
    """20 nodes, the guard's limit 2 (10%); one qualification fail drained a minute ago: room
    for one more. Four nodes fail side by side, their verdicts at the same instant, each read
    of Slurm taking 20 ms: one drains for repair, three are held."""
    slurm = LockedSlurm(latency_s=0.02)
    recent = datetime.now(UTC) - timedelta(minutes=1)
    for i in range(20):
        if i == 0:
            slurm.add_node("n00", "IDLE+DRAIN", "rsc_health:qualify:gpu_burn:9% under peers",
                           when=recent)
        elif i >= 16:
            slurm.add_node(f"n{i:02d}", "IDLE+DRAIN", XID79,
                           when=datetime.now(UTC) - timedelta(days=2))
        else:
            slurm.add_node(f"n{i:02d}", "IDLE")
    failing = [f"n{i}" for i in range(16, 20)]
    hist = History(slurm, dict.fromkeys(failing, FAIL), at=time.monotonic() + 1.0)
    guard = mass_drain_guard(slurm, Cfg({"actions.guard_max_share": 0.10,
                                         "actions.guard_window_min": 15}))
    f = flow(slurm, hist, guard=guard)
    results = run_batches([(n, lambda n=n: f.run(n)) for n in failing], 4)
    codes = sorted(parse_reason(slurm.node(n).reason)["code"] for n in failing)
    assert codes == ["gpu_burn", "guard_held", "guard_held", "guard_held"], codes
    assert sorted(r.result for r in results) == [FAIL, "inconclusive", "inconclusive",
                                                 "inconclusive"]
    assert len(hist.tickets) == 1 and not slurm.reservations()


def test_a_flow_that_raises_side_by_side_lets_the_others_finish_then_raises():
    from rsc_health.qualify.flow import FlowResult
    from rsc_health.slurm.api import SlurmError

    finished = []

    def ok(node):
        def run():
            time.sleep(0.05)
            finished.append(node)
            return FlowResult(node, PASS)
        return run

    def gone():
        raise SlurmError("slurmctld went away")

    jobs = [("a", ok("a")), ("b", gone), ("c", ok("c")), ("d", ok("d"))]
    try:
        run_batches(jobs, 2)
    except SlurmError as exc:
        assert "went away" in str(exc)
    else:
        raise AssertionError("the flow's error was swallowed")
    assert sorted(finished) == ["a", "c", "d"]
    finished.clear()
    try:
        run_batches(jobs, 1)
    except SlurmError:
        pass
    assert finished == ["a"]  # one after another: the rest never started


class DrainedMidFlow(History):
    """A person drains the node while its qualification job runs (a fan they heard)."""

    def result(self, node, job_id, since=None):
        if not self.first_asked:
            self.slurm.set_state(node, "MIXED+DRAIN", "bad fan -- alice", user="alice")
        return super().result(node, job_id, since)


def test_a_persons_drain_arriving_mid_flow_is_never_rewritten_by_the_flows_drain():
    for verdict in (FAIL, "inconclusive"):
        slurm = LockedSlurm()
        slurm.add_node("gpu001", "IDLE+DRAIN", XID79)
        hist = DrainedMidFlow(slurm, {"gpu001": verdict}, after=0.02)
        r = flow(slurm, hist).run("gpu001")
        info = slurm.node("gpu001")
        assert info.drain_set and info.reason == "bad fan -- alice", (verdict, info.reason)
        assert not slurm.reservations() and r.result == verdict
        assert not [c for c in slurm.calls if c[0] == "drain"]


def test_cleanup_leaves_a_persons_drain_of_a_left_reservations_node_theirs():
    from rsc_health.qualify.flow import cleanup, reservation_name

    slurm = LockedSlurm()
    slurm.add_node("gpu002", "IDLE+DRAIN", "psu swap -- bob", user="bob")
    slurm.create_reservation(reservation_name("gpu002"), "gpu002")
    hist = History(slurm, {})
    [r] = cleanup(slurm, hist)
    assert slurm.node("gpu002").reason == "psu swap -- bob" and not slurm.reservations()
    assert not [c for c in slurm.calls if c[0] == "drain"] and "bob" in r.detail


class ManualDrainMidFlow(History):
    """A person drains the node with `healthctl drain` (our prefix, manual mode) while its
    qualification job runs."""

    REASON = "rsc_health:manual:manual:DIMM reseat by alice"

    def result(self, node, job_id, since=None):
        if not self.first_asked:
            self.slurm.set_state(node, "MIXED+DRAIN", self.REASON, user="alice")
        return super().result(node, job_id, since)


def test_a_persons_healthctl_drain_arriving_mid_flow_or_before_cleanup_stays_theirs():
    """`healthctl drain` is a person's decision under our prefix. The flow's fail or
    inconclusive drain wrote over it with rsc_health:qualify:..., which `qualify auto` then
    retries (inconclusive) or takes back once a ticket closes: the person's drain was gone and
    a pass put the node back in service. So was cleanup's `interrupted` drain."""
    from rsc_health.qualify.flow import cleanup, reservation_name

    for verdict in (FAIL, "inconclusive"):
        slurm = LockedSlurm()
        slurm.add_node("gpu001", "IDLE+DRAIN", XID79)
        hist = ManualDrainMidFlow(slurm, {"gpu001": verdict}, after=0.02)
        r = flow(slurm, hist).run("gpu001")
        info = slurm.node("gpu001")
        assert info.drain_set and info.reason == ManualDrainMidFlow.REASON, (verdict, info)
        assert not slurm.reservations() and r.result == verdict
        assert not [c for c in slurm.calls if c[0] == "drain"]
    slurm = LockedSlurm()
    slurm.add_node("gpu002", "IDLE+DRAIN", ManualDrainMidFlow.REASON, user="alice")
    slurm.create_reservation(reservation_name("gpu002"), "gpu002")
    cleanup(slurm, History(slurm, {}))
    assert slurm.node("gpu002").reason == ManualDrainMidFlow.REASON and not slurm.reservations()


def test_two_flows_of_one_node_at_once_one_runs_the_other_touches_nothing():
    """Two `healthctl qualify start` of one node: the reservation's name is the lock; the
    second is refused by Slurm before it resumes, submits or drains anything."""
    from rsc_health.slurm.api import SlurmError

    slurm = LockedSlurm(latency_s=0.01)
    slurm.add_node("gpu001", "IDLE+DRAIN", XID79)
    f = flow(slurm, History(slurm, {"gpu001": FAIL}, after=0.1))
    out: dict = {}

    def go(i):
        try:
            out[i] = f.run("gpu001")
        except SlurmError as exc:
            out[i] = exc

    threads = [threading.Thread(target=go, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    errors = [r for r in out.values() if isinstance(r, SlurmError)]
    [ran] = [r for r in out.values() if not isinstance(r, SlurmError)]
    assert len(errors) == 1 and "Duplicate reservation" in str(errors[0])
    assert ran.result == FAIL and not slurm.reservations()
    assert [c[0] for c in slurm.calls if c[0] in ("undrain", "submit", "drain")] == [
        "undrain", "submit", "drain"]
    assert slurm.node("gpu001").reason.startswith("rsc_health:qualify:")


class BusyReservation(MemorySlurm):
    """slurmctld refuses to delete a reservation a job still pends or runs in (reservation.c
    _is_resv_used: ESLURM_RESERVATION_BUSY, "Requested reservation is in use")."""

    def __init__(self, busy):
        super().__init__()
        self.busy = busy

    def delete_reservation(self, name):
        from rsc_health.slurm.api import SlurmCommandError

        if name in self.busy:
            raise SlurmCommandError(["scontrol", "delete", f"ReservationName={name}"], 1,
                                    "Error deleting the reservation: Requested reservation "
                                    "is in use")
        return super().delete_reservation(name)


def test_cleanup_of_a_reservation_slurm_will_not_delete_still_cleans_the_others():
    """A flow killed with its job pending in the reservation of a node that then went DOWN:
    slurmctld will not delete a reservation a job pends in. cleanup raised at the first such
    reservation, so every reservation after it stayed (their nodes undrained in them), and
    `qualify cleanup` is the timer's ExecStartPre: it failing stopped every `qualify auto`
    run of the fleet. Now that node is drained, its reservation kept and said, the others
    cleaned, and the command ends normally."""
    from rsc_health.qualify.flow import cleanup, reservation_name

    stuck, left = reservation_name("gpu001"), reservation_name("gpu002")
    slurm = BusyReservation({stuck})
    slurm.add_node("gpu001", "DOWN", "Not responding")
    slurm.add_node("gpu002", "IDLE")  # resumed into its reservation by the killed flow
    slurm.create_reservation(stuck, "gpu001")
    slurm.create_reservation(left, "gpu002")
    hist = History(slurm, {})
    results = {r.node: r for r in cleanup(slurm, hist)}
    assert set(slurm.reservations()) == {stuck}
    assert slurm.node("gpu002").drain_set and slurm.node("gpu001").drain_set
    assert results["gpu002"].result == "inconclusive"
    assert results["gpu001"].result == "refused" and "in use" in results["gpu001"].detail


def test_a_reservation_slurm_keeps_refusing_is_not_drained_again_at_every_cleanup():
    """cleanup runs before every `qualify auto` (every 10 minutes): a node whose reservation
    Slurm keeps refusing to delete was drained again each time, a QUALIFY_DRAIN row each time
    and its reason time renewed, so the mass-drain guard counted it as a fresh rsc-health drain
    of its partition for as long as the reservation stayed. Drained once, said each time."""
    from rsc_health.qualify.flow import cleanup, reservation_name

    stuck = reservation_name("gpu001")
    slurm = BusyReservation({stuck})
    slurm.add_node("gpu001", "IDLE")
    slurm.create_reservation(stuck, "gpu001")
    hist = History(slurm, {})
    for _ in range(3):
        [r] = cleanup(slurm, hist)
        assert r.result == "refused" and "in use" in r.detail
    assert len([c for c in slurm.calls if c[0] == "drain"]) == 1
    assert len(hist.actions) == 1


def test_qualification_redrains_in_the_window_leave_room_for_a_fail():
    """20 nodes, limit 2: two drained nodes qualified a minute ago proved nothing and were
    drained again (inconclusive, guard_held). They were out of service already: a real fail
    next still drains for repair, not held."""
    slurm = LockedSlurm()
    recent = datetime.now(UTC) - timedelta(minutes=1)
    slurm.add_node("n00", "IDLE+DRAIN", "rsc_health:qualify:inconclusive:no result", when=recent)
    slurm.add_node("n01", "IDLE+DRAIN", "rsc_health:qualify:guard_held:held", when=recent)
    slurm.add_node("n02", "IDLE+DRAIN", XID79, when=datetime.now(UTC) - timedelta(days=2))
    for i in range(3, 20):
        slurm.add_node(f"n{i:02d}", "IDLE")
    hist = History(slurm, {"n02": FAIL}, after=0.0)
    guard = mass_drain_guard(slurm, Cfg({"actions.guard_max_share": 0.10,
                                         "actions.guard_window_min": 15}))
    r = flow(slurm, hist, guard=guard).run("n02")
    assert r.result == FAIL, r
    assert parse_reason(slurm.node("n02").reason)["code"] == "gpu_burn"


def test_every_code_the_flow_redrains_an_out_of_service_node_with_is_one_the_guard_skips():
    from rsc_health.policy import QUALIFY_REDRAIN_CODES
    from rsc_health.qualify.flow import RETRY_CODES, STRIKES_CODE

    assert set(QUALIFY_REDRAIN_CODES) == {*RETRY_CODES, STRIKES_CODE}


def test_qualification_fails_of_drained_nodes_leave_room_for_a_fresh_dead_gpu(tmp_path):
    """A fabric event fails the IB tests of every drained node under qualification: each fail
    drains a node that was out of service for days, and Slurm stamps the drain afresh. The
    qualification guard still counts them (a broken tool must not send a fleet to repair),
    but the node path's does not: a fresh node's fallen GPU drains."""
    from rsc_health.actions import Actor
    from rsc_health.config import load_config
    from rsc_health.model import Finding, Severity, Status
    from rsc_health.policy import decide

    slurm = LockedSlurm()
    old = datetime.now(UTC) - timedelta(days=2)
    for i in range(20):
        if i < 3:
            slurm.add_node(f"n{i:02d}", "IDLE+DRAIN", XID79, when=old)
        else:
            slurm.add_node(f"n{i:02d}", "IDLE")
    hist = History(slurm, dict.fromkeys(["n00", "n01", "n02"], FAIL), after=0.0)
    guard = mass_drain_guard(slurm, Cfg({"actions.guard_max_share": 0.10,
                                         "actions.guard_window_min": 15}))
    f = flow(slurm, hist, guard=guard)
    results = [f.run(n).result for n in ("n00", "n01", "n02")]
    assert results == [FAIL, FAIL, "inconclusive"]  # the qualification guard: 2 of 20
    assert parse_reason(slurm.node("n00").reason)["text"].startswith(
        f"out since {old:%Y-%m-%dT%H:%M}Z ")
    cfg = load_config("/dev/null")
    verdict = decide([Finding("gpu", "gpu3", Status.FAIL, Severity.DRAIN_NOW,
                              "fell off the bus", "xid79", True)])
    actor = Actor(slurm, cfg, "n05", tmp_path, log=lambda m: None)
    actor.sleep = lambda s: None
    assert [a.action for a in actor.apply(verdict)] == ["drain_now"]


def test_a_suspects_qualification_fail_takes_it_out_of_service_and_counts():
    """A suspect qualified undrained was in service: its fail is a new drain, no 'out since'."""
    slurm = LockedSlurm()
    for i in range(20):
        slurm.add_node(f"n{i:02d}", "IDLE")
    hist = History(slurm, {"n00": FAIL}, after=0.0)
    assert flow(slurm, hist).run("n00", suspect=True).result == FAIL
    assert not parse_reason(slurm.node("n00").reason)["text"].startswith("out since")


def test_out_of_service_since_carries_through_redrains_and_never_moves_later():
    """A node re-drained inconclusive keeps the time it first left service, so its later fail
    is counted from then; an 'out since' later than Slurm's reason time is not believed."""
    from rsc_health.qualify.flow import out_of_service_since, qualify_reason

    slurm = LockedSlurm()
    first = datetime(2026, 11, 20, 8, 0, 0, tzinfo=UTC)  # to the minute, as the text says
    slurm.add_node("a", "IDLE+DRAIN", qualify_reason("inconclusive", "no result", first),
                   when=datetime.now(UTC))
    assert out_of_service_since(slurm.node("a")) == first
    future = datetime.now(UTC) + timedelta(days=3)
    slurm.add_node("b", "IDLE+DRAIN", qualify_reason("gpu_burn", "9% under", future),
                   when=first)
    assert out_of_service_since(slurm.node("b")) == first
    slurm.add_node("c", "IDLE")
    assert out_of_service_since(slurm.node("c")) is None
