"""The action layer against an in-memory Slurm: drain, requeue, resume, the guard."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from rsc_health.actions import Actor, guard_limit
from rsc_health.config import load_config
from rsc_health.model import Finding, Severity, Status
from rsc_health.policy import decide
from rsc_health.slurm.api import NodeInfo, RequeueRefused
from rsc_health.slurm.memory import MemorySlurm

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


def memory_slurm(n: int = 10) -> MemorySlurm:
    """n00..n(n-1) idle in partition gpu; a drain is stamped NOW."""
    return MemorySlurm([f"n{i:02d}" for i in range(n)], now=lambda: NOW)


class Refusing(MemorySlurm):
    """slurmctld refuses the requeue of job "refuses" though squeue listed it requeueable."""

    def requeue(self, job_id):
        if job_id != "refuses":
            return super().requeue(job_id)
        self.calls.append(("requeue", job_id))
        raise RequeueRefused(["scontrol", "requeue", job_id], 1,
                             "Requested operation is presently disabled for job")


def finding(code: str, sev=Severity.DRAIN_NOW, repair=False, family="gpu") -> Finding:
    return Finding(family, "gpu3", Status.FAIL, sev, "fell off the bus", code, repair)


@pytest.fixture
def cfg():
    return load_config("/dev/null")


def actor(slurm, cfg, tmp_path, node="n01"):
    a = Actor(slurm, cfg, node, tmp_path / node, now=lambda: NOW, log=lambda m: None)
    a.sleep = lambda seconds: None  # the guard's settle wait
    return a


def spooled(tmp_path, node="n01"):
    path = tmp_path / node / "spool" / "pending.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_xid79_drains_now_requeues_jobs_and_reports_refusals(cfg, tmp_path):
    slurm = Refusing([f"n{i:02d}" for i in range(10)], now=lambda: NOW)
    slurm.start_job("n01", "7")
    slurm.start_job("n01", "8", requeue=False)
    slurm.start_job("n01", "refuses")
    verdict = decide([finding("xid79", repair=True, family="xid")])
    actions = actor(slurm, cfg, tmp_path).apply(verdict)
    assert slurm.info["n01"].reason.startswith("rsc_health:now:xid79:")
    assert [(a.action, a.job_id) for a in actions] == [
        ("drain_now", None), ("requeue", "7"), ("requeue_refused", "8"),
        ("requeue_refused", "refuses")]
    assert [r["action"] for r in spooled(tmp_path)] == [a.action for a in actions]


def test_drain_after_job_only_drains(cfg, tmp_path):
    slurm = memory_slurm()
    slurm.start_job("n01", "7")
    actions = actor(slurm, cfg, tmp_path).apply(
        decide([finding("remap_pending", Severity.DRAIN_AFTER_JOB, True, "remap")]))
    assert [a.action for a in actions] == ["drain_after_job"]
    assert ("requeue", "7") not in slurm.calls
    assert slurm.info["n01"].reason.startswith("rsc_health:job:remap_pending:")


def test_a_persons_drain_is_never_touched(cfg, tmp_path):
    slurm = memory_slurm()
    slurm.drain("n01", "bad fan, ticket 42")
    slurm.calls.clear()
    a = actor(slurm, cfg, tmp_path)
    # The verdict is not dropped: the caller hears it is held, and keeps it pending.
    held = a.apply(decide([finding("xid79", repair=True)]))
    assert [x.action for x in held] == ["held_under_drain"]
    assert "bad fan, ticket 42" in held[0].reason and "xid79" in held[0].reason
    assert [r["action"] for r in spooled(tmp_path)] == ["held_under_drain"]
    for _ in range(5):
        assert a.apply(decide([]), clean_sweep=True) == []
    assert slurm.calls == [] and slurm.info["n01"].reason == "bad fan, ticket 42"


def test_transient_drain_is_resumed_after_n_clean_sweeps(cfg, tmp_path):
    slurm = memory_slurm()
    a = actor(slurm, cfg, tmp_path)
    a.apply(decide([finding("mount_missing", family="mount")]))
    assert slurm.info["n01"].drain_set
    assert a.apply(decide([]), clean_sweep=True) == []
    assert a.apply(decide([]), clean_sweep=True) == []
    assert [x.action for x in a.apply(decide([]), clean_sweep=True)] == ["resume"]
    assert not slurm.info["n01"].drain_set and a.load_state() is None


def test_a_fault_seen_again_restarts_the_clean_count(cfg, tmp_path):
    slurm = memory_slurm()
    a = actor(slurm, cfg, tmp_path)
    bad = decide([finding("mount_missing", family="mount")])
    a.apply(bad)
    a.apply(decide([]), clean_sweep=True)
    a.apply(decide([]), clean_sweep=True)
    a.apply(bad)
    assert a.load_state().clean_sweeps == 0
    a.apply(decide([]), clean_sweep=True)
    assert slurm.info["n01"].drain_set


@pytest.mark.parametrize("code", ["xid79", "ecc_dbe", "remap_failed"])
def test_repair_codes_are_never_auto_resumed(cfg, tmp_path, code):
    slurm = memory_slurm()
    a = actor(slurm, cfg, tmp_path)
    # Even when a finding forgot to say repair=True, the config's list holds.
    a.apply(decide([finding(code, repair=False)]))
    for _ in range(6):
        assert a.apply(decide([]), clean_sweep=True) == []
    assert slurm.info["n01"].drain_set


def test_guard_refuses_drains_past_the_share_and_spools_it(cfg, tmp_path):
    slurm = memory_slurm(20)  # 10% of 20 = 2 drains per window
    verdict = decide([finding("xid79", repair=True)])
    results = [actor(slurm, cfg, tmp_path, f"n{i:02d}").apply(verdict) for i in range(5)]
    drained = [n for n, v in slurm.info.items() if v.drain_set]
    assert drained == ["n00", "n01"]
    assert [r[0].action for r in results[2:]] == ["guard_tripped"] * 3
    assert spooled(tmp_path, "n04")[0]["action"] == "guard_tripped"


def test_guard_forgets_drains_older_than_the_window(cfg, tmp_path):
    slurm = memory_slurm(20)
    old = NOW - timedelta(minutes=16)
    slurm.set_state("n10", "IDLE+DRAIN", "rsc_health:now:xid79:gpu0 old", user="root", when=old)
    slurm.set_state("n11", "IDLE+DRAIN", "rsc_health:now:xid79:gpu0 old", user="root", when=old)
    slurm.drain("n12", "a person's drain")
    actions = actor(slurm, cfg, tmp_path, "n01").apply(decide([finding("xid79", repair=True)]))
    assert actions[0].action == "drain_now"


def test_an_operators_drain_does_not_use_up_the_guards_budget(cfg, tmp_path):
    """A DIMM reseat (`healthctl drain`) is a person's decision under our prefix: it must not
    refuse a broken node's automatic drain. Automatic drains still count."""
    slurm = memory_slurm(10)  # 10% of 10: one automatic drain per window
    slurm.drain("n05", "rsc_health:manual:manual:DIMM reseat by bob")
    slurm.drain("n06", "rsc_health:manual:ib:cable swap by bob")
    verdict = decide([finding("xid79", repair=True)])
    assert [x.action for x in actor(slurm, cfg, tmp_path, "n01").apply(verdict)] == [
        "drain_now"]
    assert [x.action for x in actor(slurm, cfg, tmp_path, "n02").apply(verdict)] == [
        "guard_tripped"]


def test_guard_limit_is_at_least_one():
    assert guard_limit(6, 0.10) == 1
    assert guard_limit(100, 0.10) == 10
    assert guard_limit(6, 0.34) == 2


def test_disabled_actions_touch_nothing_and_record_what_would_have_drained(cfg, tmp_path):
    cfg.data["actions"]["enabled"] = False
    slurm = memory_slurm()
    done = actor(slurm, cfg, tmp_path).apply(decide([finding("xid79")]))
    assert [a.action for a in done] == ["would_drain"]
    assert slurm.calls == []


def test_epilog_never_requeues_its_own_ending_job(cfg, tmp_path):
    slurm = memory_slurm()
    slurm.start_job("n01", "7", state="COMPLETING")
    slurm.start_job("n01", "9")
    actions = actor(slurm, cfg, tmp_path).apply(decide([finding("xid79", repair=True)]),
                                                skip_jobs={"7"})
    assert [(a.action, a.job_id) for a in actions] == [("drain_now", None), ("requeue", "9")]


def test_drain_after_job_escalates_to_drain_now_when_worse_appears(cfg, tmp_path):
    slurm = memory_slurm()
    slurm.start_job("n01", "7")
    a = actor(slurm, cfg, tmp_path)
    a.apply(decide([finding("remap_pending", Severity.DRAIN_AFTER_JOB, True, "remap")]))
    actions = a.apply(decide([finding("xid79", repair=True, family="xid")]))
    assert [x.action for x in actions] == ["drain_now", "requeue"]
    assert slurm.info["n01"].reason.startswith("rsc_health:now:xid79:")
    # Already drained now by us: a repeat verdict does not drain or requeue twice.
    assert slurm.jobs_on_node("n01") == []  # requeued
    assert a.apply(decide([finding("xid79", repair=True, family="xid")])) == []


def test_a_refused_requeue_is_reported_once_while_the_node_stays_drained(cfg, tmp_path):
    slurm = Refusing([f"n{i:02d}" for i in range(10)], now=lambda: NOW)
    slurm.start_job("n01", "8", requeue=False)
    slurm.start_job("n01", "refuses")
    verdict = decide([finding("xid79", repair=True, family="xid")])
    first = actor(slurm, cfg, tmp_path).apply(verdict)
    assert [(a.action, a.job_id) for a in first] == [
        ("drain_now", None), ("requeue_refused", "8"), ("requeue_refused", "refuses")]

    # The next sweeps see the same fault on the drained node: nothing new to say ...
    for _ in range(3):
        assert actor(slurm, cfg, tmp_path).apply(verdict) == []
    # ... though the requeue is still tried (it may be allowed later), and a new job on the
    # node is still requeued or reported.
    assert slurm.calls.count(("requeue", "refuses")) == 4
    slurm.start_job("n01", "9", requeue=False)
    again = actor(slurm, cfg, tmp_path).apply(verdict)
    assert [(a.action, a.job_id) for a in again] == [("requeue_refused", "9")]
    assert [r["job_id"] for r in spooled(tmp_path) if r["action"] == "requeue_refused"] == [
        "8", "refuses", "9"]


def test_jobs_already_leaving_the_node_are_not_requeued_and_do_not_stop_the_sweep(cfg, tmp_path):
    # What the sweep after a requeue sees on a real cluster: the requeued job COMPLETING on the
    # drained node, or ended (and purged) by the time scontrol requeue reaches it.
    slurm = memory_slurm()
    slurm.start_job("n01", "5", state="COMPLETING")
    slurm.start_job("n01", "ended")
    slurm.start_job("n01", "7")
    # Ended right after squeue listed it.
    slurm.after("jobs_on_node", lambda: slurm.end_job("ended"))
    verdict = decide([finding("xid79", repair=True, family="xid")])
    actions = actor(slurm, cfg, tmp_path).apply(verdict)
    assert [(a.action, a.job_id) for a in actions] == [("drain_now", None), ("requeue", "7")]
    assert ("requeue", "5") not in slurm.calls


def test_a_node_that_drained_first_steps_back_when_later_racers_push_it_past_the_limit(
        cfg, tmp_path):
    """Slurm's reason times have one-second resolution: three nodes drain in the same second,
    ranked by name. The one that drained first saw only two at its first check; at its second
    check (after guard_settle_s) it is ranked past the limit and undoes its own drain."""
    from datetime import timedelta

    cfg.data["actions"]["guard_max_share"] = 0.34  # 6 nodes: limit 2
    slurm = MemorySlurm(["n01", "n02", "n03", "n04", "n05", "n06"], now=lambda: NOW)
    a = actor(slurm, cfg, tmp_path, node="n06")
    same_second = NOW - timedelta(seconds=1)

    def racers_land(seconds):  # while n06 waits, n01 and n02 drain in the same second
        for name in ("n01", "n02"):
            slurm.set_state(name, "IDLE+DRAIN", "rsc_health:now:xid79:gpu0 x", user="root",
                            when=same_second)

    a.sleep = racers_land
    slurm.now = lambda: same_second
    done = a.apply(decide([finding("xid79")]))
    assert [x.action for x in done] == ["guard_tripped"]
    assert "DRAIN" not in slurm.info["n06"].state


class SaysSomethingElse(MemorySlurm):
    """slurmctld answers the requeue of job "het" with a refusal of its own words (a het job's
    component: "Job not heterogeneous job leader for job het")."""

    def requeue(self, job_id):
        if job_id != "het":
            return super().requeue(job_id)
        self.calls.append(("requeue", job_id))
        from rsc_health.slurm.api import SlurmCommandError

        raise SlurmCommandError(["scontrol", "requeue", job_id], 1,
                                f"Job not heterogeneous job leader for job {job_id}")


def test_a_job_slurm_refuses_in_other_words_neither_stops_the_requeues_nor_loses_the_drain(
        cfg, tmp_path):
    """The Actor raised on a refusal worded as neither RequeueRefused nor JobGone: the drain
    was never spooled and the jobs listed after that one were never requeued, on every
    sweep. It is that job's refusal, reported once."""
    slurm = SaysSomethingElse([f"n{i:02d}" for i in range(10)], now=lambda: NOW)
    slurm.start_job("n01", "het")
    slurm.start_job("n01", "8")
    a = actor(slurm, cfg, tmp_path)
    done = a.apply(decide([finding("xid79", repair=True)]))
    assert [(x.action, x.job_id) for x in done] == [
        ("drain_now", None), ("requeue_refused", "het"), ("requeue", "8")]
    assert "heterogeneous" in done[1].detail
    assert [r["action"] for r in spooled(tmp_path)] == ["drain_now", "requeue_refused", "requeue"]
    again = a.apply(decide([finding("xid79", repair=True)]))
    assert [x.action for x in again] == []  # reported once per drain


def test_slurm_vanishing_mid_requeue_keeps_the_drain_and_the_requeues_done_on_record(
        cfg, tmp_path):
    """The drain landed, one job was requeued, then slurmctld stopped answering: the caller
    hears Slurm is away (the verdict stays pending), and what was done is spooled, once."""
    from rsc_health.slurm.api import SlurmUnavailable

    slurm = memory_slurm()
    slurm.start_job("n01", "7")
    slurm.start_job("n01", "8")
    slurm.stop_after("requeue")  # job 7's requeue lands, then nothing answers
    a = actor(slurm, cfg, tmp_path)
    with pytest.raises(SlurmUnavailable):
        a.apply(decide([finding("xid79", repair=True)]))
    assert [(r["action"], r["job_id"]) for r in spooled(tmp_path)] == [
        ("drain_now", None), ("requeue", "7")]
    slurm.start()
    done = a.apply(decide([finding("xid79", repair=True)]))
    assert [(x.action, x.job_id) for x in done] == [("requeue", "8")]
    assert [(r["action"], r["job_id"]) for r in spooled(tmp_path)] == [
        ("drain_now", None), ("requeue", "7"), ("requeue", "8")]


@pytest.mark.parametrize("lemon_at", [-2, 0], ids=["lemon_before", "lemon_same_second"])
def test_a_lemon_drain_racing_node_drains_keeps_the_guard_at_its_limit(cfg, tmp_path, lemon_at):
    """The first look counts every automatic drain (node path, lemons, qualification); the
    second look, after guard_settle_s, counted only node-path ones. A lemon drain in the
    window and two node drains racing past the first look: three automatic drains where the
    limit is two. A lemon drain never steps back, so the node-path drains rank after it."""
    cfg.data["actions"]["guard_max_share"] = 0.34  # 6 nodes: limit 2
    slurm = MemorySlurm(["n01", "n02", "n03", "n04", "n05", "n06"], now=lambda: NOW)
    same_second = NOW - timedelta(seconds=1)
    slurm.set_state("n05", "IDLE+DRAIN", "rsc_health:lemon:lemon:lemon candidate",
                    user="root", when=same_second + timedelta(seconds=lemon_at))
    a = actor(slurm, cfg, tmp_path, node="n06")

    def racer_lands(seconds):  # while n06 waits, n01 drains in the same second
        slurm.set_state("n01", "IDLE+DRAIN", "rsc_health:now:xid79:gpu0 x", user="root",
                        when=same_second)

    a.sleep = racer_lands
    slurm.now = lambda: same_second
    done = a.apply(decide([finding("xid79")]))
    assert [x.action for x in done] == ["guard_tripped"]
    assert "DRAIN" not in slurm.info["n06"].state
    b = actor(slurm, cfg, tmp_path, node="n01")  # the racer's own second look
    assert b._over_the_limit() is None  # ranked first of the node-path drains: it stays


@pytest.mark.parametrize("field", [{"refused_jobs": 7}, {"codes": 5}, {"clean_sweeps": "x"},
                                   {"reason": None}, {"auto_resumable": "no"}])
def test_a_wrongly_typed_drain_record_neither_stops_requeues_nor_resumes_the_node(
        cfg, tmp_path, field):
    """slurm_drain.json of the right keys and wrong types (JSON written by hand, another
    version): read as no record. It raised TypeError inside the Actor on every sweep, before
    the jobs on a DRAIN_NOW node were requeued."""
    slurm = memory_slurm()
    a = actor(slurm, cfg, tmp_path)
    bad = decide([finding("mount_missing", family="mount")])
    a.apply(bad)
    path = tmp_path / "n01" / "slurm_drain.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **field}))
    slurm.start_job("n01", "7")
    assert ("requeue", "7") in [(x.action, x.job_id) for x in a.apply(bad)]
    path.write_text(json.dumps({**json.loads(path.read_text()), **field})
                    if path.exists() else json.dumps(field))
    for _ in range(4):  # never resumed on a record it cannot read
        assert a.apply(decide([]), clean_sweep=True) == []
    assert slurm.info["n01"].drain_set


def test_a_drain_that_landed_before_slurm_froze_is_recorded_and_resumable(cfg, tmp_path):
    """The drain happened; Slurm froze before the guard's second look. What is true (our
    drain, its record for auto-resume, its action) is kept; the caller still hears Slurm
    is away, so the verdict stays pending and the requeue follows next run."""
    from rsc_health.slurm.api import SlurmError

    slurm = memory_slurm()
    slurm.stop_after("drain")  # slurmctld stops answering right after it took the drain
    slurm.start_job("n01", "7")
    a = actor(slurm, cfg, tmp_path)
    verdict = decide([finding("mount_missing", family="mount")])
    with pytest.raises(SlurmError):
        a.apply(verdict)
    assert slurm.info["n01"].drain_set
    assert a.load_state() is not None and a.load_state().reason == slurm.info["n01"].reason
    assert [r["action"] for r in spooled(tmp_path)] == ["drain_now"]
    slurm.start()  # the next run: Slurm back, the verdict retried
    assert [x.action for x in a.apply(verdict)] == ["requeue"]
    assert [r["action"] for r in spooled(tmp_path)] == ["drain_now", "requeue"]
    for _ in range(3):
        last = a.apply(decide([]), clean_sweep=True)
    assert [x.action for x in last] == ["resume"]


def test_our_drain_that_landed_after_the_call_timed_out_is_adopted_once(cfg, tmp_path):
    """scontrol timed out, slurmctld applied the drain later: the next run finds our drain
    with no record of it. It is recorded once (not on every run), with what Slurm holds."""
    slurm = memory_slurm()
    verdict = decide([finding("mount_missing", family="mount")])
    slurm.drain("n01", verdict.reason)  # landed late: this Actor never saw it succeed
    a = actor(slurm, cfg, tmp_path)
    assert [x.action for x in a.apply(verdict)] == ["drain_now"]
    assert [x.action for x in a.apply(verdict)] == []
    assert [(r["action"], r["detail"]) for r in spooled(tmp_path)] == [
        ("drain_now", "our drain found in place with no record of it (Slurm answered late)")]
    assert a.load_state().reason == slurm.info["n01"].reason
    for _ in range(3):
        last = a.apply(decide([]), clean_sweep=True)
    assert [x.action for x in last] == ["resume"]


@pytest.mark.parametrize("held", ["rsc_health:manual:rma:RMA 42 by bob",
                                  "rsc_health:lemon:node_fails:node_fails 4 (min 3)"])
def test_an_operators_or_lemon_drain_is_never_taken_over_by_a_node_verdict(cfg, tmp_path, held):
    """healthctl drain and lemons --apply drain with our prefix but are never auto-resumed.
    A DRAIN_NOW fault on such a node requeues its jobs but must not replace the reason (it
    did: 'escalated' to the node path's own drain, which clean sweeps then resumed)."""
    slurm = memory_slurm()
    slurm.drain("n01", held)
    slurm.start_job("n01", "7")
    slurm.calls.clear()
    a = actor(slurm, cfg, tmp_path)
    actions = a.apply(decide([finding("mount_missing", family="mount")]))
    # The verdict is held (kept pending by the node path) until a person lifts that drain.
    assert [(x.action, x.job_id) for x in actions] == [("held_under_drain", None),
                                                       ("requeue", "7")]
    assert slurm.info["n01"].reason == held and a.load_state() is None
    for _ in range(4):
        assert a.apply(decide([]), clean_sweep=True) == []
    assert slurm.info["n01"].reason == held
    assert [c[0] for c in slurm.calls] == ["requeue"]


class ListsOthersOnly(MemorySlurm):
    """`scontrol show node n01` answers, but the fleet listing lacks n01 (a record the
    parser refused as ambiguous, a listing cut short)."""

    def nodes(self, names=None):
        return [n for n in super().nodes(names) if n.name != "n01"]


def lists_others_only() -> ListsOthersOnly:
    return ListsOthersOnly([f"n{i:02d}" for i in range(10)], now=lambda: NOW)


def test_the_guard_counts_the_partition_even_when_the_listing_lacks_this_node(cfg, tmp_path):
    slurm = lists_others_only()
    for name in ("n02", "n03"):  # the limit of 10 nodes at 10% is 1: already past it
        slurm.drain(name, f"rsc_health:now:xid79:{name} gpu0 fell off the bus")
    slurm.calls.clear()
    actions = actor(slurm, cfg, tmp_path).apply(decide([finding("xid79", repair=True)]))
    assert [a.action for a in actions] == ["guard_tripped"]
    assert not slurm.info["n01"].drain_set and slurm.calls == []


@pytest.mark.parametrize("state", [
    "MIXED+DRAIN+REBOOT_REQUESTED",  # `scontrol reboot ASAP n01`: our reason kept, a job left
    "IDLE+DRAIN+REBOOT_ISSUED",
    "IDLE+DRAIN+POWERING_DOWN",
    "IDLE+DRAIN+POWER_DOWN",
    "IDLE@+DRAIN",  # sinfo's suffix for a pending reboot
    "DOWN*+DRAIN",  # slurmd stopped answering after our drain; Slurm kept our reason
    "DOWN+DRAIN+NOT_RESPONDING",
])
def test_a_pending_reboot_or_slurms_own_down_is_never_resumed_over(cfg, tmp_path, state):
    """Our drain, then a person asks Slurm to reboot the node when its job ends (given no
    reason, Slurm keeps ours), or Slurm marks it DOWN when slurmd stops answering (keeping
    ours too). The sweeps (from the systemd timer, slurmd or not) run clean, and the third
    used to resume the node on top of the pending reboot or Slurm's DOWN. Now the clean count
    waits for Slurm to finish; a node that comes back still drained by us is resumed after
    its clean sweeps as ever."""
    slurm = memory_slurm()
    a = actor(slurm, cfg, tmp_path)
    a.apply(decide([finding("mount_missing", family="mount")]))
    ours = slurm.info["n01"]
    slurm.set_state("n01", state)  # Slurm keeps our reason, user and time
    for _ in range(5):
        assert a.apply(decide([]), clean_sweep=True) == []
    assert not any(c[0] in ("resume", "undrain") for c in slurm.calls)
    assert a.load_state() is not None and a.load_state().clean_sweeps == 0

    slurm.set_state("n01", ours.state)  # the reboot done, back and still drained by us
    kinds = [[x.action for x in a.apply(decide([]), clean_sweep=True)] for _ in range(3)]
    assert kinds == [[], [], ["resume"]]


@pytest.mark.parametrize(("state", "in_hand"), [
    ("IDLE+DRAIN", ""), ("DOWN*+DRAIN", ""), ("MIXED-", ""), ("IDLE+MAINTENANCE", ""),
    ("IDLE+POWERED_DOWN", "POWERED_DOWN"), ("IDLE~", "POWERED_DOWN"),
    ("IDLE#", "POWERING_UP"), ("ALLOCATED^+DRAIN", "REBOOT_ISSUED"),
])
def test_the_reboot_and_power_flags_are_read_from_names_and_suffixes(state, in_hand):
    assert NodeInfo("n01", state).in_hand == in_hand


def test_a_repair_fault_found_under_our_transient_drain_is_never_auto_resumed(cfg, tmp_path):
    """Drained for a mount that went away; the GPU then falls off the bus (XID 79) while the
    drain stands. Once the mount is back the clean sweeps must not resume the node: the
    XID 79 was consumed by the run that found it and is never seen again."""
    slurm = memory_slurm()
    a = actor(slurm, cfg, tmp_path)
    a.apply(decide([finding("mount_missing", family="mount")]))
    assert a.load_state().auto_resumable
    assert a.apply(decide([finding("xid79", repair=True, family="xid")])) == []
    for _ in range(5):
        assert a.apply(decide([]), clean_sweep=True) == []
    assert slurm.info["n01"].drain_set and ("undrain", "n01") not in slurm.calls
    state = a.load_state()
    assert not state.auto_resumable and state.codes == ["mount_missing", "xid79"]


def test_escalating_our_after_job_drain_keeps_what_it_was_for(cfg, tmp_path):
    """Drained after the job for a pending row remap (repair); a mount then goes (drain now,
    transient): once the mount is back, the node still waits for its repair."""
    slurm = memory_slurm()
    a = actor(slurm, cfg, tmp_path)
    a.apply(decide([finding("remap_pending", Severity.DRAIN_AFTER_JOB, True, "remap")]))
    a.apply(decide([finding("mount_missing", family="mount")]))
    assert slurm.info["n01"].reason.startswith("rsc_health:now:mount_missing")
    for _ in range(5):
        assert a.apply(decide([]), clean_sweep=True) == []
    assert slurm.info["n01"].drain_set
    assert a.load_state().codes == ["mount_missing", "remap_pending"]


def test_a_verdict_under_an_operators_drain_is_held_and_its_jobs_still_requeued(cfg, tmp_path):
    slurm = memory_slurm()
    slurm.drain("n01", "rsc_health:manual:manual:DIMM reseat by bob")
    slurm.start_job("n01", "7")
    slurm.calls.clear()
    done = actor(slurm, cfg, tmp_path).apply(decide([finding("xid79", repair=True)]))
    assert [(x.action, x.job_id) for x in done] == [("held_under_drain", None), ("requeue", "7")]
    assert slurm.calls == [("requeue", "7")]
    assert slurm.info["n01"].reason == "rsc_health:manual:manual:DIMM reseat by bob"


def test_a_drain_record_written_with_the_clipped_trailing_space_still_resumes(cfg, tmp_path):
    """Records written before format_reason stripped the clip's trailing space hold "... "
    where Slurm's reason, read back, ends without it: still the same drain."""
    slurm = memory_slurm()
    a = actor(slurm, cfg, tmp_path)
    a.apply(decide([finding("mount_missing", family="mount")]))
    path = tmp_path / "n01" / "slurm_drain.json"
    record = json.loads(path.read_text())
    path.write_text(json.dumps({**record, "reason": record["reason"] + " "}))
    for _ in range(3):
        done = a.apply(decide([]), clean_sweep=True)
    assert [x.action for x in done] == ["resume"]


def _racer_drains_after_my_first_look(slurm, racer="n02"):
    """Between this node's first look (the listing) and its drain, `racer` drains, a second
    earlier: ranked ahead of this node."""
    from datetime import timedelta

    slurm.after("nodes", lambda: slurm.set_state(
        racer, "IDLE+DRAIN", "rsc_health:now:xid79:gpu0 x", user="root",
        when=NOW - timedelta(seconds=1)))


def test_a_drain_whose_guard_look_slurm_did_not_answer_steps_back_on_the_next_run(cfg,
                                                                                  tmp_path):
    """The guard's look after a drain is what holds it at its limit when nodes drain at
    once; slurmctld slow under exactly that (a fabric event) did not answer it, and the drain
    stayed for good: the next run found its own drain on record and kept it, one past the
    limit (10 nodes, limit 1, two drained). Now a drain whose look went unanswered is looked
    at on the next run, and one ranked past the limit steps back then."""
    from rsc_health.slurm.api import SlurmError

    slurm = memory_slurm()
    _racer_drains_after_my_first_look(slurm)
    slurm.stop_after("drain")  # the drain lands, then slurmctld stops answering
    a = actor(slurm, cfg, tmp_path)
    verdict = decide([finding("xid79")])
    with pytest.raises(SlurmError):
        a.apply(verdict)
    slurm.start()
    assert [x.action for x in a.apply(verdict)] == ["guard_tripped"]
    assert not slurm.info["n01"].drain_set and a.load_state() is None
    assert slurm.info["n02"].drain_set


def test_our_drain_that_landed_late_past_the_guards_limit_steps_back_when_found(cfg,
                                                                               tmp_path):
    """A drain whose scontrol timed out and that slurmctld applied later never had the guard's
    look after it; the run that found it adopted it, past the limit. Now it is looked at then."""
    from rsc_health.slurm.api import SlurmError

    slurm = memory_slurm()
    _racer_drains_after_my_first_look(slurm)
    slurm.stop_after("drain", answered=False)  # it lands; its answer does not
    a = actor(slurm, cfg, tmp_path)
    verdict = decide([finding("xid79")])
    with pytest.raises(SlurmError):
        a.apply(verdict)
    slurm.start()
    reads = slurm.reads
    assert [x.action for x in a.apply(verdict)] == ["guard_tripped"]
    assert slurm.reads == reads + 1  # the one node table read serves the look too
    assert not slurm.info["n01"].drain_set and a.load_state() is None


def test_qualification_redrains_of_nodes_already_out_do_not_use_up_the_guards_budget(
        cfg, tmp_path):
    """A qualification that proved nothing (inconclusive, a fail the guard held, a flow cut
    short) or a three-strikes repair drains again a node that was out of service already: the
    re-drain stamps a fresh reason time in Slurm, but takes nothing out of service. In a fabric
    event with qualification running, those must not fill the budget that lets a fresh node
    with a dead GPU drain. A qualification fail still counts (its guard's purpose)."""
    slurm = memory_slurm(20)  # 10% of 20: two automatic drains per window
    for node, code in (("n10", "inconclusive"), ("n11", "guard_held"),
                       ("n12", "interrupted"), ("n13", "three_strikes")):
        slurm.drain(node, f"rsc_health:qualify:{code}:qualification proved nothing")
    verdict = decide([finding("xid79", repair=True)])
    assert [x.action for x in actor(slurm, cfg, tmp_path, "n01").apply(verdict)][0] == (
        "drain_now")
    assert [x.action for x in actor(slurm, cfg, tmp_path, "n02").apply(verdict)][0] == (
        "drain_now")
    assert [x.action for x in actor(slurm, cfg, tmp_path, "n03").apply(verdict)] == [
        "guard_tripped"]
    assert not slurm.info["n03"].drain_set


def test_a_qualification_fail_still_counts_against_the_guards_budget(cfg, tmp_path):
    slurm = memory_slurm(20)
    slurm.drain("n10", "rsc_health:qualify:gpu_burn:gflops 9% under the peers")
    slurm.drain("n11", "rsc_health:lemon:node_fails:node_fails 4 (min 3)")
    verdict = decide([finding("xid79", repair=True)])
    assert [x.action for x in actor(slurm, cfg, tmp_path, "n01").apply(verdict)] == [
        "guard_tripped"]


@pytest.mark.parametrize("drain", ["rsc_health:lemon:node_fails:node_fails 4 (min 3)",
                                   "rsc_health:manual:manual:DIMM reseat by bob"])
def test_a_refused_requeue_under_a_persons_or_lemon_drain_is_said_once_per_job(
        cfg, tmp_path, drain):
    """Under a lemon or `healthctl drain` there is no drain record of ours: the held verdict
    is retried after each back-off (about hourly), and each retry requeued the job again. A
    job that refuses is said once, not on every retry; a new one is still said."""
    slurm = Refusing([f"n{i:02d}" for i in range(10)], now=lambda: NOW)
    slurm.drain("n01", drain)
    slurm.start_job("n01", "8", requeue=False)
    slurm.start_job("n01", "refuses")
    verdict = decide([finding("xid79", repair=True, family="xid")])
    for _ in range(4):
        done = actor(slurm, cfg, tmp_path).apply(verdict)
        assert done[0].action == "held_under_drain"
    assert slurm.calls.count(("requeue", "refuses")) == 4  # still tried each time
    slurm.start_job("n01", "9", requeue=False)
    actor(slurm, cfg, tmp_path).apply(verdict)
    assert [r["job_id"] for r in spooled(tmp_path) if r["action"] == "requeue_refused"] == [
        "8", "refuses", "9"]
    assert slurm.info["n01"].reason == drain


def test_the_shadow_guard_counts_a_node_once_though_its_would_drain_reason_changes():
    """A shadow-drained node whose would_drain reason changes (a second fault) starts a new
    interval in the report; live, it is drained already: no second drain counted, never held."""
    from rsc_health.actions import shadow_guard_held

    parts = {f"n{i:02d}": ["gpu"] for i in range(20)}  # limit 2
    t = NOW
    attempts = [(t, "n00", False), (t + timedelta(seconds=1), "n01", False),
                (t + timedelta(minutes=5), "n00", False),  # n00 again, another reason
                (t + timedelta(minutes=6), "n02", False)]
    assert shadow_guard_held(attempts, parts, max_share=0.10,
                             window=timedelta(minutes=15)) == {3}
    # Past the window the held node goes through on a later sweep, as its live retry would.
    later = [*attempts, (t + timedelta(minutes=20), "n02", False)]
    assert shadow_guard_held(later, parts, max_share=0.10,
                             window=timedelta(minutes=15)) == {3}


# Measured on Slurm 22.05.8 (tests/slurm/test_slurm_reboot.py): a person's `scontrol reboot
# nextstate=RESUME` (ASAP or not, with a reason of theirs or none) over our drain keeps our
# reason, "<ours> : reboot issued" while the node reboots, and when the node registers again
# Slurm makes it IDLE with no reason at all: our drain is gone.
@pytest.mark.parametrize("when", ["before_our_drain", "after_our_drain"])
def test_a_repair_drain_lifted_by_a_reboot_with_nextstate_resume_is_drained_again(
        cfg, tmp_path, when):
    """An XID 79 drain (repair: never auto-resumed) under a reboot a person asked Slurm for
    with nextstate=RESUME, asked before our drain landed or after it. The node came back IDLE
    and the clean sweep after it took the drain for someone's resume and forgot the XID 79:
    the dead GPU was back in service. Now the sweep drains it again with our reason, once;
    it is never auto-resumed, and a person's resume after that is theirs."""
    slurm = memory_slurm()
    a = actor(slurm, cfg, tmp_path)
    slurm.start_job("n01", "7", requeue=False)
    if when == "before_our_drain":
        slurm.set_state("n01", "MIXED+REBOOT_REQUESTED", "reboot requested", user="bob",
                        next_state="RESUME")
    a.apply(decide([finding("xid79", repair=True, family="xid")]))
    ours = slurm.info["n01"].reason
    assert ours.startswith("rsc_health:now:xid79:")
    if when == "after_our_drain":
        slurm.set_state("n01", "MIXED+DRAIN+REBOOT_REQUESTED", next_state="RESUME")
        assert a.apply(decide([]), clean_sweep=True) == []
    slurm.end_job("7")
    slurm.set_state("n01", "DOWN+DRAIN+REBOOT_ISSUED", ours + " : reboot issued",
                    next_state="RESUME")
    assert a.apply(decide([]), clean_sweep=True) == []
    slurm.set_state("n01", "IDLE", "")  # registered again: Slurm lifted the drain

    again = a.apply(decide([]), clean_sweep=True)
    assert [x.action for x in again] == ["drain_now"]
    assert "NextState=RESUME" in again[0].detail
    info = slurm.info["n01"]
    assert info.drain_set and info.reason == ours
    for _ in range(3):
        assert a.apply(decide([]), clean_sweep=True) == []
    assert slurm.info["n01"].drain_set
    assert [r["action"] for r in spooled(tmp_path)][-1] == "drain_now"

    slurm.resume("n01")  # a person's resume after the repair: theirs, not undone
    assert a.apply(decide([]), clean_sweep=True) == []
    assert not slurm.info["n01"].drain_set and a.load_state() is None


def test_a_repair_drain_lifted_by_a_reboot_keeps_its_codes_when_the_next_run_drains(
        cfg, tmp_path):
    """The same lift, and the next run finds a transient fault (a lost mount) rather than a
    clean node: its fresh drain used to write a record of the mount alone, auto-resumable,
    and the XID 79 was resumed with it two clean sweeps later."""
    slurm = memory_slurm()
    a = actor(slurm, cfg, tmp_path)
    slurm.set_state("n01", "IDLE+REBOOT_REQUESTED", "reboot requested", next_state="RESUME")
    a.apply(decide([finding("xid79", repair=True, family="xid")]))
    slurm.set_state("n01", "IDLE", "")
    a.apply(decide([finding("mount_missing", family="mount")]))
    assert slurm.info["n01"].reason.startswith("rsc_health:now:mount_missing:")
    state = a.load_state()
    assert state is not None and "xid79" in state.codes and not state.auto_resumable
    for _ in range(4):
        assert a.apply(decide([]), clean_sweep=True) == []
    assert slurm.info["n01"].drain_set


def test_a_transient_drain_slurm_suffixed_after_a_plain_reboot_is_still_resumed(cfg, tmp_path):
    """A person's plain `scontrol reboot` over our lost-mount drain: Slurm keeps the drain
    and leaves "<ours> : reboot issued" as its reason after the reboot (22.05). The record no
    longer matched the reason word for word, so the node stayed drained for good."""
    slurm = memory_slurm()
    a = actor(slurm, cfg, tmp_path)
    a.apply(decide([finding("mount_missing", family="mount")]))
    ours = slurm.info["n01"].reason
    slurm.set_state("n01", "IDLE+DRAIN", ours + " : reboot issued")
    kinds = [[x.action for x in a.apply(decide([]), clean_sweep=True)] for _ in range(3)]
    assert kinds == [[], [], ["resume"]]
    assert not slurm.info["n01"].drain_set


def test_a_repair_drain_whose_reason_a_persons_reboot_replaced_is_drained_again(cfg, tmp_path):
    """`scontrol reboot nextstate=RESUME reason="bios update"` over our XID 79 drain: Slurm
    (22.05) puts the person's reason in place of ours while the drain stands, then lifts the
    drain when the node is back. Our record was forgotten as "resumed by someone else"."""
    slurm = memory_slurm()
    a = actor(slurm, cfg, tmp_path)
    a.apply(decide([finding("xid79", repair=True, family="xid")]))
    ours = slurm.info["n01"].reason
    slurm.set_state("n01", "DOWN+DRAIN+REBOOT_ISSUED", "bios update : reboot issued",
                    user="bob", next_state="RESUME")
    assert a.apply(decide([]), clean_sweep=True) == []
    slurm.set_state("n01", "IDLE", "")
    assert [x.action for x in a.apply(decide([]), clean_sweep=True)] == ["drain_now"]
    assert slurm.info["n01"].reason == ours


def test_a_persons_own_drain_over_our_repair_drain_stays_theirs_to_lift(cfg, tmp_path):
    """A person's drain (no reboot) over our XID 79 drain, later lifted by them: theirs, as
    ever; the node is not drained again."""
    slurm = memory_slurm()
    a = actor(slurm, cfg, tmp_path)
    a.apply(decide([finding("xid79", repair=True, family="xid")]))
    slurm.set_state("n01", "IDLE+DRAIN", "bob: GPU swapped, burn-in", user="bob")
    assert a.apply(decide([]), clean_sweep=True) == []
    slurm.resume("n01")
    assert a.apply(decide([]), clean_sweep=True) == []
    assert not slurm.info["n01"].drain_set and a.load_state() is None


def test_the_job_start_reads_the_drain_record_the_actor_writes():
    """node/store.reboot_lift_owed names the record without importing the Slurm side."""
    from rsc_health.actions import DRAIN_STATE_FILE
    from rsc_health.node.store import DRAIN_RECORD

    assert DRAIN_RECORD == DRAIN_STATE_FILE


# The same lift with no run there to see the reboot pending (the sweep runs from the timer
# alone, and the node is back within one period): told by Slurm's BootTime, which moves when
# slurmd registers after a reboot (tests/slurm/test_slurm_reboot.py on Slurm 22.05.8).
BOOT = NOW - timedelta(days=3)


class Clock:
    def __init__(self):
        self.t = NOW

    def __call__(self):
        return self.t


def _xid79_drained_and_seen(slurm, cfg, tmp_path):
    """Our XID 79 drain on a node booted three days ago, seen in place by a sweep at NOW."""
    clock = Clock()
    a = Actor(slurm, cfg, "n01", tmp_path / "n01", now=clock, log=lambda m: None)
    a.sleep = lambda seconds: None
    slurm.boot("n01", BOOT)
    a.apply(decide([finding("xid79", repair=True, family="xid")]))
    ours = slurm.info["n01"].reason
    assert ours.startswith("rsc_health:now:xid79:")
    assert a.apply(decide([]), clean_sweep=True) == []
    clock.t = NOW + timedelta(minutes=5)
    return a, ours, clock


def _rebooted(slurm, clock, minutes=10):
    """The node rebooted and slurmd registered (Slurm's BootTime moves); a run at +2 min."""
    slurm.boot("n01", NOW + timedelta(minutes=minutes))
    clock.t = NOW + timedelta(minutes=minutes + 2)


def test_a_repair_drain_gone_across_a_reboot_no_run_saw_is_drained_again(cfg, tmp_path):
    """`scontrol reboot nextstate=RESUME` over our XID 79 drain, issued and done between two
    timer sweeps: Slurm lifted the drain and the sweep took that for a person's resume. The
    node booted after a run saw our drain in place: drained again, once; a person's resume
    after that (same boot) stands."""
    slurm = memory_slurm()
    a, ours, clock = _xid79_drained_and_seen(slurm, cfg, tmp_path)
    slurm.set_state("n01", "IDLE", "")
    _rebooted(slurm, clock)

    again = a.apply(decide([]), clean_sweep=True)
    assert [x.action for x in again] == ["drain_now"]
    assert "rebooted" in again[0].detail
    assert slurm.info["n01"].drain_set and slurm.info["n01"].reason == ours
    for _ in range(3):  # still never auto-resumed
        clock.t += timedelta(minutes=5)
        assert a.apply(decide([]), clean_sweep=True) == []
    slurm.resume("n01")
    assert a.apply(decide([]), clean_sweep=True) == []
    assert not slurm.info["n01"].drain_set and a.load_state() is None


def test_a_job_start_after_an_unseen_reboot_lift_is_refused_and_the_node_drained(
        cfg, tmp_path):
    """The job start comes before the next sweep: it asks Slurm (the record notes a boot),
    drains again and fails the start; with the boot unchanged it drains nothing."""
    from rsc_health.node.store import reboot_lift_owed

    slurm = memory_slurm()
    a, _, clock = _xid79_drained_and_seen(slurm, cfg, tmp_path)
    assert reboot_lift_owed(tmp_path / "n01")
    slurm.set_state("n01", "IDLE", "")
    assert a.apply(decide([])) == []  # a person's resume, no reboot: not ours to undo
    _rebooted(slurm, clock)
    assert [x.action for x in a.apply(decide([]))] == ["drain_now"]
    assert slurm.info["n01"].drain_set


@pytest.mark.parametrize("seconds", [1, 2, 600])
def test_a_persons_resume_is_not_undone_by_slurmd_registering_again(cfg, tmp_path, seconds):
    """slurmd sends its uptime in whole seconds: a slurmd or slurmctld restart moves BootTime
    by a second or two with no reboot (600: a clock stepped since). A person's resume then is
    still theirs."""
    slurm = memory_slurm()
    a, _, clock = _xid79_drained_and_seen(slurm, cfg, tmp_path)
    slurm.resume("n01")
    slurm.boot("n01", BOOT + timedelta(seconds=seconds))
    assert a.apply(decide([]), clean_sweep=True) == []
    assert not slurm.info["n01"].drain_set and a.load_state() is None


def test_a_repair_drain_kept_across_a_reboot_then_resumed_by_a_person_stays_resumed(
        cfg, tmp_path):
    """The repair flow: the node reboots with our drain kept, a sweep sees it back and still
    drained, then a person resumes it: theirs (the boot noted is the new one)."""
    slurm = memory_slurm()
    a, _, clock = _xid79_drained_and_seen(slurm, cfg, tmp_path)
    _rebooted(slurm, clock)
    assert a.apply(decide([]), clean_sweep=True) == []
    assert slurm.info["n01"].drain_set
    clock.t += timedelta(minutes=1)
    slurm.resume("n01")
    assert a.apply(decide([]), clean_sweep=True) == []
    assert not slurm.info["n01"].drain_set and a.load_state() is None


def test_a_reboot_under_a_persons_own_drain_over_ours_leaves_their_resume_standing(
        cfg, tmp_path):
    """A person drains over our XID 79 drain with a reason of theirs, reboots, swaps the GPU
    and resumes: the node is theirs since their drain; nothing drains it again."""
    slurm = memory_slurm()
    a, _, clock = _xid79_drained_and_seen(slurm, cfg, tmp_path)
    slurm.set_state("n01", "IDLE+DRAIN", "bob: GPU swap", user="bob")
    assert a.apply(decide([]), clean_sweep=True) == []
    _rebooted(slurm, clock)
    slurm.resume("n01")
    assert a.apply(decide([]), clean_sweep=True) == []
    assert not slurm.info["n01"].drain_set and a.load_state() is None


def test_a_transient_drain_lifted_by_a_reboot_is_not_drained_again(cfg, tmp_path):
    """A lost-mount drain (auto-resumed after clean sweeps) lifted by a reboot: a reboot is
    a fair repair for it; only never-resumed drains note the boot."""
    slurm = memory_slurm()
    clock = Clock()
    a = Actor(slurm, cfg, "n01", tmp_path / "n01", now=clock, log=lambda m: None)
    a.sleep = lambda seconds: None
    slurm.boot("n01", BOOT)
    a.apply(decide([finding("mount_missing", family="mount")]))
    assert a.apply(decide([]), clean_sweep=True) == []
    slurm.set_state("n01", "IDLE", "")
    _rebooted(slurm, clock)
    assert a.apply(decide([]), clean_sweep=True) == []
    assert not slurm.info["n01"].drain_set and a.load_state() is None


@pytest.mark.parametrize("field,value", [("boot_seen", "yesterday"),
                                         ("boot_seen", "2026-11-22T12:00:00"),
                                         ("boot_seen", 17), ("boot", 17)])
def test_a_garbled_boot_in_the_drain_record_never_drains_on_its_own(cfg, tmp_path, field,
                                                                     value):
    """A sighting that is not an aware ISO time (hand-edited, or an old writer's): no lift is
    read from it; a wrong type is not a record this code wrote (said once, removed)."""
    slurm = memory_slurm()
    a, _, clock = _xid79_drained_and_seen(slurm, cfg, tmp_path)
    path = tmp_path / "n01" / "slurm_drain.json"
    record = json.loads(path.read_text())
    record[field] = value
    path.write_text(json.dumps(record))
    slurm.resume("n01")
    _rebooted(slurm, clock)
    assert a.apply(decide([]), clean_sweep=True) == []
    assert not slurm.info["n01"].drain_set


# Attacks on the boot note (Slurm's BootTime is slurmctld's clock: now - the uptime slurmd
# sends; a sighting's time is the node's own clock, which munge lets lag slurmctld's by up to
# its 5-minute credential TTL).
def test_a_persons_resume_after_a_repair_reboot_stands_with_the_node_clock_behind_slurms(
        cfg, tmp_path):
    """The repair flow (the reboot keeps our drain, a sweep sees the node back still drained,
    a person resumes it) on a node whose clock lags slurmctld's by three minutes: the sweep
    that saw it back is, by the node's clock, before the boot slurmctld stamped. The resume
    is the person's; nothing drains the node again."""
    slurm = memory_slurm()
    a, _, clock = _xid79_drained_and_seen(slurm, cfg, tmp_path)
    slurm.boot("n01", NOW + timedelta(minutes=10))  # slurmctld's clock
    clock.t = NOW + timedelta(minutes=11) - timedelta(minutes=3)  # the node's, 3 min behind
    assert a.apply(decide([]), clean_sweep=True) == []
    assert slurm.info["n01"].drain_set
    clock.t += timedelta(minutes=5)
    slurm.resume("n01")
    assert a.apply(decide([]), clean_sweep=True) == []
    assert not slurm.info["n01"].drain_set and a.load_state() is None


class Kernel:
    """The node's /proc/sys/kernel/random/boot_id: a new id on each reboot."""

    def __init__(self):
        self.id = "boot-a"

    def __call__(self):
        return self.id


def _xid79_seen_with_kernel(slurm, cfg, tmp_path):
    a, ours, clock = _xid79_drained_and_seen(slurm, cfg, tmp_path)
    kernel = Kernel()
    a.boot_id = kernel
    assert a.apply(decide([]), clean_sweep=True) == []  # a sweep on boot-a sees our drain
    assert a.load_state().boot_id == "boot-a"
    return a, ours, clock, kernel


def test_an_unseen_reboot_lift_is_told_with_the_node_clock_ahead_of_slurms(cfg, tmp_path):
    """The node's clock runs five minutes ahead of slurmctld's (munge allows it). A sweep sees
    our XID 79 drain at 12:05 by the node's clock (12:00 by slurmctld's); a reboot with
    nextstate=RESUME two minutes later (BootTime 12:02, slurmctld's) lifts it unseen. By the
    clocks the boot is before the sighting; the kernel's boot id says a reboot came after it:
    drained again, and the job start that asks is refused."""
    slurm = memory_slurm()
    a, ours, clock, kernel = _xid79_seen_with_kernel(slurm, cfg, tmp_path)
    a.apply(decide([]), clean_sweep=True)
    skew = timedelta(minutes=5)
    clock.t = NOW + skew  # the sighting, by the node's clock
    assert a.apply(decide([]), clean_sweep=True) == []
    slurm.set_state("n01", "IDLE", "")  # lifted when slurmd registered
    slurm.boot("n01", NOW + timedelta(minutes=2))
    kernel.id = "boot-b"
    clock.t = NOW + timedelta(minutes=4) + skew
    again = a.apply(decide([]))  # the job start
    assert [x.action for x in again] == ["drain_now"]
    assert slurm.info["n01"].drain_set and slurm.info["n01"].reason == ours
    assert a.load_state().boot_id == "boot-b"
    slurm.resume("n01")  # a person's resume on that boot stands
    clock.t += timedelta(minutes=5)
    assert a.apply(decide([]), clean_sweep=True) == []
    assert not slurm.info["n01"].drain_set


def test_a_repair_reboot_seen_on_the_new_kernel_before_slurmd_registered_keeps_the_resume(
        cfg, tmp_path):
    """The repair flow, a sweep on the new boot seeing our drain kept before slurmd has
    registered (BootTime still the old one): that is a sighting on the new boot. The person's
    resume afterwards stands; the boot id does not take it for a reboot's lift."""
    slurm = memory_slurm()
    a, _, clock, kernel = _xid79_seen_with_kernel(slurm, cfg, tmp_path)
    kernel.id = "boot-b"
    clock.t = NOW + timedelta(minutes=12)
    assert a.apply(decide([]), clean_sweep=True) == []
    assert a.load_state().boot_id == "boot-b" and slurm.info["n01"].drain_set
    slurm.boot("n01", NOW + timedelta(minutes=10))  # slurmd registers
    clock.t += timedelta(minutes=5)
    slurm.resume("n01")
    assert a.apply(decide([]), clean_sweep=True) == []
    assert not slurm.info["n01"].drain_set and a.load_state() is None


def test_a_persons_resume_stands_when_slurmctlds_clock_steps_and_the_kernel_is_the_same(
        cfg, tmp_path):
    """slurmctld's clock steps an hour ahead and slurmd registers again (no reboot): BootTime,
    now minus the uptime, moves an hour past the sighting. The kernel's boot id is the one the
    drain was last seen on: no reboot came, and a person's resume stands."""
    slurm = memory_slurm()
    a, _, clock, kernel = _xid79_seen_with_kernel(slurm, cfg, tmp_path)
    slurm.resume("n01")
    slurm.boot("n01", NOW + timedelta(hours=1))
    clock.t += timedelta(minutes=5)
    assert a.apply(decide([]), clean_sweep=True) == []
    assert not slurm.info["n01"].drain_set and a.load_state() is None


def test_a_drain_record_with_a_key_this_release_does_not_know_still_stands(cfg, tmp_path):
    """A later release wrote the record (a key of its own), then the site rolled back: the
    drain and what it was for still stand (never auto-resumed, the reboot note kept); the key
    is left out, the record is not thrown away."""
    slurm = memory_slurm()
    a, ours, clock = _xid79_drained_and_seen(slurm, cfg, tmp_path)
    path = tmp_path / "n01" / "slurm_drain.json"
    record = json.loads(path.read_text())
    record["a_later_releases_key"] = {"anything": [1, 2]}
    path.write_text(json.dumps(record))
    state = a.load_state()
    assert state is not None and state.codes == ["xid79"] and state.boot
    for _ in range(4):
        clock.t += timedelta(minutes=5)
        assert a.apply(decide([]), clean_sweep=True) == []
    assert slurm.info["n01"].drain_set and slurm.info["n01"].reason == ours
    slurm.set_state("n01", "IDLE", "")  # a reboot lifted it unseen: drained again
    _rebooted(slurm, clock, minutes=40)
    assert [x.action for x in a.apply(decide([]), clean_sweep=True)] == ["drain_now"]


@pytest.mark.parametrize("unreadable", ["", OSError("EIO")])
def test_an_unreadable_boot_id_keeps_the_one_noted_and_tells_nothing(cfg, tmp_path,
                                                                     unreadable):
    """/proc unreadable for a run (a container's /proc, an error): the id noted stays, no
    write for it, and a person's resume on the same boot stands."""
    slurm = memory_slurm()
    a, _, clock, kernel = _xid79_seen_with_kernel(slurm, cfg, tmp_path)
    path = tmp_path / "n01" / "slurm_drain.json"
    before = path.read_bytes()

    def broken():
        if isinstance(unreadable, Exception):
            raise unreadable
        return unreadable

    a.boot_id = broken
    clock.t += timedelta(minutes=5)
    assert a.apply(decide([]), clean_sweep=True) == []
    assert path.read_bytes() == before
    slurm.resume("n01")
    assert a.apply(decide([]), clean_sweep=True) == []
    assert not slurm.info["n01"].drain_set


def test_a_drained_nodes_sweep_does_not_rewrite_its_record_for_boot_time_jitter(
        cfg, tmp_path):
    """slurmctld asks slurmd to register now and then; each registration stamps BootTime
    again from a whole-second uptime (a second either way). That is no change: the sweep of
    the drained node writes nothing. A reboot later is still told (test above)."""
    slurm = memory_slurm()
    a, ours, clock = _xid79_drained_and_seen(slurm, cfg, tmp_path)
    path = tmp_path / "n01" / "slurm_drain.json"
    before = path.read_bytes()
    writes = []
    write = a._write_state
    a._write_state = lambda state: writes.append(state) or write(state)
    for jitter in (1, -1, 2):
        slurm.boot("n01", BOOT + timedelta(seconds=jitter))
        clock.t += timedelta(minutes=5)
        assert a.apply(decide([]), clean_sweep=True) == []
    assert writes == [] and path.read_bytes() == before
    slurm.set_state("n01", "IDLE", "")
    _rebooted(slurm, clock, minutes=30)
    assert [x.action for x in a.apply(decide([]), clean_sweep=True)] == ["drain_now"]
    assert slurm.info["n01"].reason == ours


def test_a_sighting_with_no_boot_time_keeps_the_boot_noted_before(cfg, tmp_path):
    """Slurm prints BootTime=None for a node it has no registration of (slurmctld's state
    lost, the node not yet back): a sweep that sees our drain then learns nothing about the
    boot, and must not forget the one noted. The reboot that then lifts the drain unseen is
    still told by the next sweep."""
    slurm = memory_slurm()
    a, ours, clock = _xid79_drained_and_seen(slurm, cfg, tmp_path)
    slurm._nodes["n01"].boot_time = None
    assert a.apply(decide([]), clean_sweep=True) == []
    slurm.set_state("n01", "IDLE", "")
    _rebooted(slurm, clock)
    assert [x.action for x in a.apply(decide([]), clean_sweep=True)] == ["drain_now"]
    assert slurm.info["n01"].reason == ours


def test_an_unseen_reboot_lift_met_by_a_transient_fault_keeps_the_repair_on_record(
        cfg, tmp_path):
    """The reboot lifted our XID 79 drain unseen, and the next sweep finds a mount missing
    (a transient fault): drained for it, but the XID 79 is still owed a repair. When the
    mount is back the clean sweeps never resume the node."""
    slurm = memory_slurm()
    a, _, clock = _xid79_drained_and_seen(slurm, cfg, tmp_path)
    slurm.set_state("n01", "IDLE", "")
    _rebooted(slurm, clock)
    assert [x.action for x in a.apply(decide([finding("mount_missing", family="mount")]))] \
        == ["drain_now"]
    assert "xid79" in a.load_state().codes
    for _ in range(5):
        clock.t += timedelta(minutes=5)
        assert a.apply(decide([]), clean_sweep=True) == []
    assert slurm.info["n01"].drain_set and "xid79" in a.load_state().codes


def test_an_unseen_reboot_lift_met_by_a_new_fault_is_drained_past_a_tripped_guard(
        cfg, tmp_path):
    """The guard let our XID 79 drain through once; the reboot lifted it unseen; another
    node's drain now fills the partition's share. The sweep that finds a new fault on this
    node restores the drain, as the clean sweep would have: not the guard's to hold."""
    slurm = memory_slurm()  # 10 nodes: one drain per window
    a, _, clock = _xid79_drained_and_seen(slurm, cfg, tmp_path)
    slurm.set_state("n01", "IDLE", "")
    _rebooted(slurm, clock)
    other = actor(slurm, cfg, tmp_path, "n02")
    other.now = lambda: clock.t
    assert [x.action for x in other.apply(decide([finding("mount_missing", family="mount")]))] \
        == ["drain_now"]
    got = a.apply(decide([finding("mount_missing", family="mount")]))
    assert "guard_tripped" not in [x.action for x in got]
    assert slurm.info["n01"].drain_set and "xid79" in a.load_state().codes


def test_two_unseen_reboot_lifts_in_a_row_are_each_drained_again(cfg, tmp_path):
    """Lifted unseen, drained again by the sweep; lifted unseen once more, the node first
    seen DOWN (not responding after the boot: nothing done, the record kept), then a job
    start on it: drained again, by the boot the second drain was noted on."""
    slurm = memory_slurm()
    a, ours, clock = _xid79_drained_and_seen(slurm, cfg, tmp_path)
    slurm.set_state("n01", "IDLE", "")
    _rebooted(slurm, clock)
    assert [x.action for x in a.apply(decide([]), clean_sweep=True)] == ["drain_now"]
    slurm.set_state("n01", "DOWN", "Not responding")
    _rebooted(slurm, clock, minutes=30)
    assert a.apply(decide([]), clean_sweep=True) == [] and a.load_state() is not None
    slurm.set_state("n01", "IDLE", "")
    assert [x.action for x in a.apply(decide([]))] == ["drain_now"]
    assert slurm.info["n01"].reason == ours


def test_a_drain_record_from_before_the_boot_note_is_noted_by_the_next_sweep(cfg, tmp_path):
    """A record written before the note existed (no reboot_resumes, boot, boot_seen): read
    as it is; the next sweep that sees our drain in place notes the boot, and a reboot that
    lifts the drain after that is told."""
    slurm = memory_slurm()
    a, ours, clock = _xid79_drained_and_seen(slurm, cfg, tmp_path)
    path = tmp_path / "n01" / "slurm_drain.json"
    record = json.loads(path.read_text())
    for key in ("reboot_resumes", "boot", "boot_seen"):
        del record[key]
    path.write_text(json.dumps(record))
    assert a.apply(decide([]), clean_sweep=True) == []
    assert a.load_state().boot == BOOT.isoformat()
    slurm.set_state("n01", "IDLE", "")
    _rebooted(slurm, clock)
    assert [x.action for x in a.apply(decide([]), clean_sweep=True)] == ["drain_now"]
    assert slurm.info["n01"].reason == ours


def test_a_persons_drain_seen_over_ours_then_their_reboot_nextstate_resume_stands(
        cfg, tmp_path):
    """A person drains over our XID 79 drain with a reason of theirs ("GPU swapped") and a
    sweep sees it so, with no reboot in hand: the node is theirs. Later they bring it back
    with `scontrol reboot nextstate=RESUME` (Slurm keeps their reason, "... : reboot issued",
    until the node registers): their reboot and their resume, not one over our drain; the
    node is not drained again."""
    slurm = memory_slurm()
    a, _, clock = _xid79_drained_and_seen(slurm, cfg, tmp_path)
    slurm.set_state("n01", "IDLE+DRAIN", "bob: GPU swapped", user="bob")
    assert a.apply(decide([]), clean_sweep=True) == []
    clock.t += timedelta(minutes=5)
    slurm.set_state("n01", "DOWN+DRAIN+REBOOT_ISSUED", "bob: GPU swapped : reboot issued",
                    user="bob", next_state="RESUME")
    assert a.apply(decide([]), clean_sweep=True) == []
    slurm.set_state("n01", "IDLE", "")
    _rebooted(slurm, clock, minutes=15)
    assert a.apply(decide([]), clean_sweep=True) == []
    assert not slurm.info["n01"].drain_set and a.load_state() is None


def test_a_reboot_seen_pending_then_cancelled_and_a_persons_resume_stands(cfg, tmp_path):
    """A person asks `scontrol reboot nextstate=RESUME` of our busy XID 79 node and a sweep
    sees it pending; they change their mind (`scontrol cancel_reboot`) and resume the node
    themselves before any run sees the cancel. No reboot happened (BootTime unchanged): the
    resume is theirs, not a lift by the reboot."""
    slurm = memory_slurm()
    a, ours, clock = _xid79_drained_and_seen(slurm, cfg, tmp_path)
    slurm.set_state("n01", "MIXED+DRAIN+REBOOT_REQUESTED", ours, next_state="RESUME")
    assert a.apply(decide([]), clean_sweep=True) == []
    assert a.load_state().reboot_resumes
    slurm.set_state("n01", "IDLE", "")  # cancel_reboot, then the person's resume
    clock.t += timedelta(minutes=5)
    assert a.apply(decide([]), clean_sweep=True) == []
    assert not slurm.info["n01"].drain_set and a.load_state() is None
