"""`lemons --apply` semantics against an in-memory Slurm: dry run, human drains, the guard."""

from __future__ import annotations

import os
from datetime import timedelta

from lemon_fleet import AS_OF, drained, fleet_slurm
from sqlalchemy import select

from rsc_health.historian.lemons.apply import CountGuard, apply_verdicts, lemon_reason
from rsc_health.historian.lemons.verdicts import Crossing, LemonVerdict
from rsc_health.historian.schema import node_actions, tickets
from rsc_health.policy import parse_reason


def _verdict(node: str, fails: int = 4) -> LemonVerdict:
    return LemonVerdict(
        node,
        [Crossing("node_fails", fails, 3), Crossing("xid_cnt", 3, 3)],
    )


def test_reason_uses_the_policy_grammar_with_the_top_feature():
    reason = lemon_reason(_verdict("n1", fails=6))
    assert parse_reason(reason) == {
        "mode": "lemon",
        "code": "node_fails",
        "text": "node_fails 6 (min 3), +1 more signal",
    }


def test_dry_run_changes_nothing(engine):
    slurm = fleet_slurm()
    actions = apply_verdicts(engine, [_verdict("n1")], slurm, CountGuard(10), now=AS_OF)
    assert [(a.node, a.action) for a in actions] == [("n1", "would_drain")]
    assert drained(slurm) == []
    with engine.connect() as conn:
        assert conn.execute(select(tickets)).all() == []


def test_apply_drains_opens_a_lemon_ticket_and_records_the_action(engine):
    slurm = fleet_slurm()
    actions = apply_verdicts(engine, [_verdict("n1")], slurm, CountGuard(10), now=AS_OF, apply=True)
    assert [(a.node, a.action) for a in actions] == [("n1", "drain")]
    assert drained(slurm) == [("n1", lemon_reason(_verdict("n1")))]
    with engine.connect() as conn:
        t = conn.execute(select(tickets)).one()
        act = conn.execute(select(node_actions)).one()
    assert (t.node, t.source, t.opened, t.closed) == ("n1", "lemon", AS_OF, None)
    assert (act.node, act.action) == ("n1", "lemon_drain")
    assert act.reason.startswith("rsc_health:lemon:node_fails:")


def test_human_drains_and_notes_are_left_alone(engine):
    slurm = fleet_slurm(
        {
            "human": ("IDLE+DRAIN", "bad dimm, ticket 1234 -- bob"),
            "note": ("MIXED", "watching this one"),
            "ours": ("ALLOCATED+DRAIN", "rsc_health:now:xid79:gpu3 fell off the bus"),
            "free": ("IDLE", ""),
        }
    )
    verdicts = [_verdict(n) for n in ("human", "note", "ours", "free")]
    actions = apply_verdicts(engine, verdicts, slurm, CountGuard(10), now=AS_OF, apply=True)
    by_node = {a.node: a for a in actions}
    assert by_node["human"].action == "skip" and "human" in by_node["human"].why
    assert by_node["note"].action == "skip"
    assert by_node["ours"].action == "skip" and "(now)" in by_node["ours"].why
    assert by_node["free"].action == "drain"
    assert [n for n, _ in drained(slurm)] == ["free"]


def test_guard_holds_back_drains_beyond_its_limit(engine):
    slurm = fleet_slurm()
    verdicts = [_verdict(f"n{k}") for k in range(5)]
    actions = apply_verdicts(engine, verdicts, slurm, CountGuard(2), now=AS_OF, apply=True)
    assert [a.action for a in actions].count("drain") == 2
    held = [a for a in actions if a.action == "held"]
    assert [a.node for a in held] == ["n2", "n3", "n4"]
    assert "limited to 2" in held[0].why
    assert [n for n, _ in drained(slurm)] == ["n0", "n1"]  # the most damning go first
    with engine.connect() as conn:
        assert len(conn.execute(select(tickets)).all()) == 2


def test_a_lemon_drained_node_is_not_drained_twice(engine):
    slurm = fleet_slurm()
    apply_verdicts(engine, [_verdict("n1")], slurm, CountGuard(10), now=AS_OF, apply=True)
    later = AS_OF + timedelta(days=1)
    actions = apply_verdicts(engine, [_verdict("n1")], slurm, CountGuard(10), now=later, apply=True)
    assert actions[0].action == "skip" and "(lemon)" in actions[0].why
    assert len(drained(slurm)) == 1


def test_partition_guard_counts_our_recent_drains_and_this_runs(engine):
    from datetime import UTC, datetime

    from rsc_health.config import load_config
    from rsc_health.historian.lemons.apply import PartitionGuard

    now = datetime.now(UTC).replace(tzinfo=None)
    slurm = fleet_slurm(size=20)  # guard_max_share 0.10 of 20 nodes: 2 drains per window
    slurm.drain("n19", "rsc_health:now:xid79:gpu1 fell off the bus")  # ours, just now
    slurm.calls.clear()
    guard = PartitionGuard.from_slurm(slurm, load_config(os.devnull), now)
    verdicts = [_verdict(f"n{k}") for k in range(4)]
    actions = apply_verdicts(engine, verdicts, slurm, guard, now=now, apply=True)
    assert [(a.node, a.action) for a in actions] == [
        ("n0", "drain"),
        ("n1", "held"),
        ("n2", "held"),
        ("n3", "held"),
    ]
    assert "partition learn at its limit" in actions[1].why
    assert [n for n, _ in drained(slurm)] == ["n0"]


def test_a_drain_that_landed_while_slurmctld_froze_is_completed_by_the_rerun(engine):
    """The drain RPC timed out but landed: no ticket, no record. The next run finds the lemon
    drain in Slurm and completes both, once; a third run changes nothing."""
    from rsc_health.slurm.api import SlurmUnavailable

    slurm = fleet_slurm()
    slurm.stop_after("drain", answered=False)  # the drain RPC landed, its answer did not
    try:
        apply_verdicts(engine, [_verdict("n1")], slurm, CountGuard(10), now=AS_OF, apply=True)
    except SlurmUnavailable:
        pass
    with engine.connect() as conn:
        assert conn.execute(select(tickets)).all() == []
    slurm.start()
    again = apply_verdicts(engine, [_verdict("n1")], slurm, CountGuard(10), now=AS_OF, apply=True)
    assert [(a.node, a.action) for a in again] == [("n1", "repaired")]
    third = apply_verdicts(engine, [_verdict("n1")], slurm, CountGuard(10), now=AS_OF, apply=True)
    assert [a.action for a in third] == ["skip"]
    with engine.connect() as conn:
        assert len(conn.execute(select(tickets)).all()) == 1
        assert [r.action for r in conn.execute(select(node_actions))] == ["lemon_drain"]
    assert len(drained(slurm)) == 1


def test_a_name_naming_many_nodes_is_skipped_without_asking_slurm(engine):
    """An imported row's node `n[0-9]` or `n1,n2` would reach scontrol as many nodes; it is
    skipped before any Slurm call, and the real candidate beside it is still drained."""
    slurm = fleet_slurm()
    verdicts = [_verdict("n[0-9]"), _verdict("n1,n2"), _verdict("n3")]
    actions = apply_verdicts(engine, verdicts, slurm, CountGuard(10), now=AS_OF, apply=True)
    assert [(a.node, a.action) for a in actions] == [
        ("n[0-9]", "skip"), ("n1,n2", "skip"), ("n3", "drain")]
    assert all("not one Slurm node name" in a.why for a in actions[:2])
    assert slurm.reads == 2  # n3 only (and again before its drain): the others never looked up
    assert [n for n, _ in drained(slurm)] == ["n3"]
    with engine.connect() as conn:
        assert conn.execute(select(tickets.c.node)).scalars().all() == ["n3"]


def test_shadow_mode_apply_changes_nothing_and_records_what_it_would_have_done(engine):
    """[actions] enabled = false holds for lemons too: --apply drains nothing and opens no
    ticket; the drain it would have made is recorded once as would_drain."""
    slurm = fleet_slurm()
    for day in (0, 1):  # two nightly runs
        actions = apply_verdicts(engine, [_verdict("n1")], slurm, CountGuard(10),
                                 now=AS_OF + timedelta(days=day), apply=True, shadow=True)
        assert [(a.node, a.action) for a in actions] == [("n1", "would_drain")]
        assert "shadow mode" in actions[0].why
    assert drained(slurm) == [] and "DRAIN" not in slurm.node("n1").state
    with engine.connect() as conn:
        assert conn.execute(select(tickets)).all() == []
        rows = conn.execute(select(node_actions.c.node, node_actions.c.action,
                                   node_actions.c.reason)).all()
    assert rows == [("n1", "would_drain", lemon_reason(_verdict("n1")))]


def test_a_candidate_slurm_no_longer_knows_is_skipped_and_the_others_still_drain(engine):
    """A node decommissioned or renamed within the lemon window is still a candidate in the
    historian; `scontrol show node` says "Node ... not found". apply_verdicts raised on it,
    so `lemons --apply` drained no lemon at all, every night, while it stayed in the window."""
    slurm = fleet_slurm()
    verdicts = [_verdict("gone42", fails=9), _verdict("n1")]
    actions = apply_verdicts(engine, verdicts, slurm, CountGuard(10), now=AS_OF, apply=True)
    by_node = {a.node: a for a in actions}
    assert by_node["gone42"].action == "skip" and "not found" in by_node["gone42"].why
    assert by_node["n1"].action == "drain"
    assert [n for n, _ in drained(slurm)] == ["n1"]


def test_a_person_who_drains_a_candidate_while_the_run_reads_the_others_keeps_their_reason(
        engine):
    """The run reads every candidate (on 22.05 each read costs slurmctld the whole node table),
    and only then drains: a person's drain of the first candidate in that time ("reseating GPU
    3") was overwritten by the lemon reason, which only `healthctl resume` lifts. Each node is
    read again just before its drain, and a drain that is not ours is left alone."""
    slurm = fleet_slurm()
    slurm.after("node", lambda: slurm.set_state("n1", "IDLE+DRAIN", "bob: reseating GPU 3",
                                                user="bob"))
    actions = apply_verdicts(engine, [_verdict("n1"), _verdict("n2")], slurm, CountGuard(10),
                             now=AS_OF, apply=True)
    by_node = {a.node: a for a in actions}
    assert by_node["n1"].action == "skip" and "bob: reseating GPU 3" in by_node["n1"].why
    assert slurm.info["n1"].reason == "bob: reseating GPU 3"
    assert [n for n, _ in drained(slurm)] == ["n2"]
    with engine.connect() as conn:
        assert [t.node for t in conn.execute(select(tickets)).all()] == ["n2"]


def _record_resume(engine, node: str, reason: str, when) -> None:
    """A resume as `healthctl resume --force` records it: the reason it lifted, and who."""
    import uuid

    with engine.begin() as conn:
        conn.execute(node_actions.insert().values(
            id=uuid.uuid4().hex, time=when, node=node, action="resume",
            reason=f"{reason} (by alice)"))


def test_a_lemon_drain_after_a_recorded_resume_is_recorded_again_with_the_same_reason(engine):
    """`healthctl resume --force` with the lemon ticket still open, then new evidence whose
    reason reads the same: the second drain reached Slurm but left no node_actions row (its id
    was sha256 of the node and the reason, already taken by the first), so the historian showed
    one drain and the resume as the node's last word while the node sat drained."""
    slurm = fleet_slurm()
    apply_verdicts(engine, [_verdict("n1")], slurm, CountGuard(10), now=AS_OF, apply=True)
    slurm.resume("n1")
    _record_resume(engine, "n1", lemon_reason(_verdict("n1")), AS_OF + timedelta(hours=1))
    later = AS_OF + timedelta(days=2)
    actions = apply_verdicts(engine, [_verdict("n1")], slurm, CountGuard(10), now=later,
                             apply=True)
    assert [a.action for a in actions] == ["drain"]
    assert len(drained(slurm)) == 2
    with engine.connect() as conn:
        rows = conn.execute(select(node_actions.c.action, node_actions.c.time)
                            .order_by(node_actions.c.time)).all()
        assert len(conn.execute(select(tickets)).all()) == 1  # the open one still holds it
    assert rows == [("lemon_drain", AS_OF), ("resume", AS_OF + timedelta(hours=1)),
                    ("lemon_drain", later)]
    # the run after it: already drained, nothing more recorded
    again = apply_verdicts(engine, [_verdict("n1")], slurm, CountGuard(10),
                           now=later + timedelta(days=1), apply=True)
    assert [a.action for a in again] == ["skip"]
    with engine.connect() as conn:
        assert len(conn.execute(select(node_actions)).all()) == 3


def test_a_lemon_drain_a_person_lifts_with_scontrol_stays_lifted_and_is_their_return(engine):
    """A person's raw `scontrol update State=RESUME` of a lemon-drained node, the lemon ticket
    still open: the next --apply saw an undrained node and drained it again on the same
    evidence, and the re-drain left no record (same id), so the node flapped nightly while the
    historian showed one drain. Now the lift is the person's decision: not drained again, and
    recorded once as the resume it was (carrying the lifted lemon reason), so lemon_repairs
    counts it as the node's return and its windows start over; the ticket is left open."""
    from rsc_health.historian.lemons.features import lemon_repairs

    slurm = fleet_slurm()
    apply_verdicts(engine, [_verdict("n1")], slurm, CountGuard(10), now=AS_OF, apply=True)
    slurm.resume("n1")  # the person, in the morning
    night = AS_OF + timedelta(days=1)
    dry = apply_verdicts(engine, [_verdict("n1")], slurm, CountGuard(10), now=night)
    assert [a.action for a in dry] == ["skip"] and "not recorded (dry run)" in dry[0].why
    assert lemon_repairs(engine, night) == {}
    actions = apply_verdicts(engine, [_verdict("n1")], slurm, CountGuard(10), now=night,
                             apply=True)
    assert [a.action for a in actions] == ["skip"]
    assert "lifted outside healthctl" in actions[0].why
    assert len(drained(slurm)) == 1 and "DRAIN" not in slurm.node("n1").state
    with engine.connect() as conn:
        rows = conn.execute(select(node_actions.c.action, node_actions.c.time,
                                   node_actions.c.reason).order_by(node_actions.c.time)).all()
        open_tickets = conn.execute(select(tickets.c.node).where(tickets.c.closed.is_(None))
                                    ).scalars().all()
    reason = lemon_reason(_verdict("n1"))
    assert [(a, t) for a, t, _ in rows] == [("lemon_drain", AS_OF), ("resume", night)]
    assert rows[1].reason.startswith(reason + " (lifted outside healthctl")
    assert lemon_repairs(engine, night) == {"n1": night}  # the windows start over here
    assert open_tickets == ["n1"]


def test_a_lifted_lemon_drain_is_drained_again_on_new_evidence_and_recorded(engine):
    """After the recorded return, a verdict is on evidence since it (the windows start
    there): that drain is made, and recorded as a drain of its own, even with the same text."""
    slurm = fleet_slurm()
    apply_verdicts(engine, [_verdict("n1")], slurm, CountGuard(10), now=AS_OF, apply=True)
    slurm.resume("n1")
    apply_verdicts(engine, [_verdict("n1")], slurm, CountGuard(10),
                   now=AS_OF + timedelta(days=1), apply=True)
    later = AS_OF + timedelta(days=9)
    actions = apply_verdicts(engine, [_verdict("n1")], slurm, CountGuard(10), now=later,
                             apply=True)
    assert [a.action for a in actions] == ["drain"]
    assert len(drained(slurm)) == 2
    with engine.connect() as conn:
        assert [r.action for r in conn.execute(
            select(node_actions.c.action).order_by(node_actions.c.time))] == [
            "lemon_drain", "resume", "lemon_drain"]


def test_a_pilots_shadow_nodes_take_none_of_the_runs_lemon_drains(engine):
    """`[nodes."GLOB".actions] enabled = false` nodes were granted by the guard before the
    shadow check: with max_drains_per_run of them among the candidates (never repaired, so
    candidates every night, and the most damning sort first) every live lemon was held back,
    every night. They are recorded as would_drain outside the cap, and the live one drains."""
    slurm = fleet_slurm()
    verdicts = [_verdict("n1", 9), _verdict("n2", 8), _verdict("n5", 4)]
    for night in (0, 1):
        actions = apply_verdicts(engine, verdicts, slurm, CountGuard(2),
                                 now=AS_OF + timedelta(days=night), apply=True,
                                 shadow_node=lambda n: n in ("n1", "n2"))
        by = {a.node: a for a in actions}
        assert by["n1"].action == by["n2"].action == "would_drain"
        assert "shadow mode for this node" in by["n1"].why
    assert [n for n, _ in drained(slurm)] == ["n5"]  # night 0; night 1 finds it drained
    with engine.connect() as conn:
        rows = conn.execute(select(node_actions.c.node, node_actions.c.action)
                            .order_by(node_actions.c.node)).all()
    assert rows == [("n1", "would_drain"), ("n2", "would_drain"), ("n5", "lemon_drain")]


def test_a_pilots_shadow_nodes_take_none_of_a_partitions_share(engine):
    """The partition guard counted each granted shadow node as a drain of ours (recent_ours):
    two shadow candidates filled a 20-node partition's 10% and held its live lemon."""
    from datetime import UTC, datetime

    from rsc_health.config import load_config
    from rsc_health.historian.lemons.apply import PartitionGuard

    now = datetime.now(UTC).replace(tzinfo=None)
    slurm = fleet_slurm(size=20)  # guard_max_share 0.10 of 20 nodes: 2 drains per window
    guard = PartitionGuard.from_slurm(slurm, load_config(os.devnull), now)
    verdicts = [_verdict("n1", 9), _verdict("n2", 8), _verdict("n5", 4)]
    actions = apply_verdicts(engine, verdicts, slurm, guard, now=now, apply=True,
                             shadow_node=lambda n: n in ("n1", "n2"))
    assert {a.node: a.action for a in actions} == {
        "n1": "would_drain", "n2": "would_drain", "n5": "drain"}
    assert [n for n, _ in drained(slurm)] == ["n5"]


def test_a_dry_run_names_a_shadow_node_as_shadowed_without_recording(engine):
    slurm = fleet_slurm()
    actions = apply_verdicts(engine, [_verdict("n1"), _verdict("n5")], slurm, CountGuard(1),
                             now=AS_OF, shadow_node=lambda n: n == "n1")
    assert [(a.node, a.action) for a in actions] == [("n1", "would_drain"),
                                                     ("n5", "would_drain")]
    assert "shadow mode for this node" in actions[0].why
    with engine.connect() as conn:
        assert conn.execute(select(node_actions)).all() == []


def test_failures_after_a_lift_outside_healthctl_count_as_new_evidence(engine):
    """A person lifts a lemon drain with raw scontrol in the morning and the node fails four
    jobs that day. The lift was recorded at the nightly run's own time, so the return the
    windows restart from fell after those failures: they were erased and the lemon stayed in
    service on a clean slate (helper-134). The lift is now dated by the first job that started
    on the node after the drain; the day's failures are evidence since the return."""
    from lemon_fleet import Fleet

    from rsc_health.historian.lemons.features import lemon_repairs
    from rsc_health.historian.lemons.verdicts import repeat_offenders

    fleet = Fleet(engine)
    slurm = fleet_slurm()
    apply_verdicts(engine, [_verdict("n1")], slurm, CountGuard(10), now=AS_OF, apply=True)
    slurm.resume("n1")  # the person, at AS_OF + ~1 h: nothing recorded
    for hours in (3, 6, 9, 12):  # back in service, it fails four jobs of an hour each
        fleet.failed(["n1"], "n1", end=AS_OF + timedelta(hours=hours))
    night = AS_OF + timedelta(days=1)
    actions = apply_verdicts(engine, [_verdict("n1")], slurm, CountGuard(10), now=night,
                             apply=True)
    assert [a.action for a in actions] == ["skip"]  # the lift stands
    back = lemon_repairs(engine, night)["n1"]
    assert AS_OF < back <= AS_OF + timedelta(hours=2), back  # the first job's start
    offenders = repeat_offenders(engine, night + timedelta(hours=1), 28, 1)
    assert int(offenders.at["n1", "fails_since"]) == 4
