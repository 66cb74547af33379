"""Verdict rules, their evidence and repeat offenders, on a hand-built historian."""

from __future__ import annotations

import tomllib
from datetime import timedelta
from pathlib import Path

import pandas as pd
from lemon_fleet import AS_OF

from rsc_health.config import PACKAGED_DEFAULTS
from rsc_health.historian.lemons.features import lemon_features
from rsc_health.historian.lemons.verdicts import (
    DEFAULTS,
    LemonRules,
    evidence,
    flagged,
    lemon_verdicts,
)

DAY = timedelta(days=1)


def test_every_lemon_default_is_documented_in_the_packaged_config():
    with open(PACKAGED_DEFAULTS, "rb") as fh:
        section = tomllib.load(fh)["lemon"]
    assert section == DEFAULTS
    text = Path(PACKAGED_DEFAULTS).read_text()
    # the section headers, not their names in the file's opening comment
    block = text[text.index("\n[lemon]\n") : text.index("\n[report]\n")]
    for key in section:
        # the line before each key is its comment
        lines = block.splitlines()
        i = next(k for k, line in enumerate(lines) if line.startswith(f"{key} ="))
        assert lines[i - 1].startswith("#"), key


def _frame(**cols):
    base = {c: 0 for c in ("single_node_jobs", "node_fails", "xid_cnt", "tickets", "out_count")}
    return pd.DataFrame([{**base, **row} for row in cols["rows"]], index=cols["index"])


def test_min_signals_and_strong_rules():
    rules = LemonRules.from_config(
        {"min_signals": 2, "strong": ["node_fails"], "node_fails": 3, "xid_cnt": 2, "tickets": 1}
    )
    f = _frame(
        index=["strong", "two_weak", "one_weak", "clean"],
        rows=[{"node_fails": 3}, {"xid_cnt": 2, "tickets": 1}, {"xid_cnt": 5}, {}],
    )
    assert list(flagged(f, rules)) == [True, True, False, False]


def test_rate_rules_need_enough_single_node_jobs():
    rules = LemonRules.from_config(
        {"strong": ["single_node_node_failure_rate"], "single_node_node_failure_rate": 0.2}
    )
    f = _frame(
        index=["few", "many"],
        rows=[
            {"single_node_jobs": 2, "single_node_node_failure_rate": 0.5},
            {"single_node_jobs": 10, "single_node_node_failure_rate": 0.5},
        ],
    )
    assert list(flagged(f, rules)) == [False, True]


def test_verdict_lists_crossings_and_the_jobs_and_events_behind_them(fleet, engine):
    end = AS_OF - 2 * DAY
    pks = [fleet.failed(["bad", f"ok{k}"], "bad", end=end - k * DAY) for k in range(3)]
    fleet.failed(["bad", "ok9"], "ok9", end=end)  # someone else's failure: not evidence
    fleet.failed(["bad"], None, end=end)  # a user's own FAILED job: not evidence either
    fleet.xid("bad", end, "xid79", "gpu5")
    fleet.event("bad", end)
    fleet.ticket("bad", end + timedelta(hours=1))
    fleet.job(["fine"], end=end)
    f = lemon_features(engine, AS_OF)
    rules = LemonRules.from_config(
        {"node_fails": 3, "multi_node_node_fails": 2, "strong": ["node_fails"]}
    )
    verdicts = lemon_verdicts(engine, f, AS_OF, rules)
    assert [v.node for v in verdicts] == ["bad"]
    v = verdicts[0]
    crossed = {c.feature: (c.value, c.threshold) for c in v.crossings}
    assert crossed["node_fails"] == (3, 3)
    assert crossed["multi_node_node_fails"] == (3, 2)
    assert v.top_feature == "multi_node_node_fails"  # 3/2 is further past than 3/3
    assert sorted(r["job_id"] for r in v.evidence["failed_jobs"]) == sorted(
        str(1000 + pk) for pk in pks
    )
    assert [r["code"] for r in v.evidence["xid_events"]] == ["xid79"]
    assert len(v.evidence["out_of_service"]) == 1 and len(v.evidence["tickets"]) == 1
    assert "node_fails=3>=3" in v.summary()
    assert v.to_dict()["top_feature"] == "multi_node_node_fails"


def test_evidence_is_limited_and_windowed(fleet, engine):
    for k in range(5):
        fleet.failed(["n1"], "n1", end=AS_OF - (k + 1) * DAY)
    fleet.failed(["n1"], "n1", end=AS_OF - 40 * DAY)
    ev = evidence(engine, "n1", AS_OF, 28, limit=3)
    assert len(ev["failed_jobs"]) == 3
    ends = [r["end"] for r in ev["failed_jobs"]]
    assert ends == sorted(ends, reverse=True)
    assert len(evidence(engine, "n1", AS_OF, 28)["failed_jobs"]) == 5


def _repeat_only() -> LemonRules:
    """Every threshold rule off: only the repeat-offender path can make a verdict."""
    rules = LemonRules.from_config({"strong": []})
    return rules.with_thresholds(**{k: 0 for k in rules.thresholds})


def test_node_back_from_lemon_repair_that_fails_again_is_a_repeat_offender(fleet, engine):
    fleet.ticket("n1", AS_OF - 10 * DAY, AS_OF - 5 * DAY, source="lemon")
    fleet.failed(["n1"], None, end=AS_OF - 7 * DAY, state="NODE_FAIL")  # before the repair
    fleet.failed(["n1"], None, end=AS_OF - 2 * DAY, state="NODE_FAIL")  # after: failed again
    fleet.ticket("n2", AS_OF - 10 * DAY, AS_OF - 5 * DAY, source="lemon")
    fleet.job(["n2"], end=AS_OF - 2 * DAY)  # back and healthy
    fleet.ticket("n3", AS_OF - 10 * DAY, AS_OF - 5 * DAY, source="manual")
    fleet.failed(["n3"], None, end=AS_OF - 2 * DAY, state="NODE_FAIL")  # not a lemon repair
    f = lemon_features(engine, AS_OF)
    rules = _repeat_only()
    verdicts = lemon_verdicts(engine, f, AS_OF, rules)
    assert [v.node for v in verdicts] == ["n1"]
    assert verdicts[0].repeat_offender and verdicts[0].top_feature == "repeat_offender"
    assert verdicts[0].resumed_at == AS_OF - 5 * DAY


def test_resume_action_after_lemon_drain_also_starts_the_repeat_clock(fleet, engine):
    from sqlalchemy import insert

    from rsc_health.historian.schema import node_actions

    with engine.begin() as conn:
        conn.execute(
            insert(node_actions),
            [
                dict(
                    id="a1",
                    time=AS_OF - 9 * DAY,
                    node="n1",
                    action="drain",
                    reason="rsc_health:lemon:node_fails:3 failures",
                ),
                dict(id="a2", time=AS_OF - 4 * DAY, node="n1", action="resume", reason=""),
                dict(
                    id="a3",
                    time=AS_OF - 9 * DAY,
                    node="n2",
                    action="drain",
                    reason="rsc_health:now:xid79:gpu0",
                ),
                dict(id="a4", time=AS_OF - 4 * DAY, node="n2", action="resume", reason=""),
            ],
        )
    fleet.failed(["n1", "n2"], "n1", end=AS_OF - DAY)
    fleet.failed(["n2"], "n2", end=AS_OF - DAY)
    f = lemon_features(engine, AS_OF)
    assert [v.node for v in lemon_verdicts(engine, f, AS_OF, _repeat_only())] == ["n1"]


def test_a_check_drain_auto_resumed_after_a_lemon_repair_does_not_end_the_repair(fleet, engine):
    """Only the resume that lifted the lemon drain (its reason carries the lemon mark) is the
    node's return from repair. A later resume of a check drain (the node agent's, after clean
    sweeps) moved the repair past the node's new failure: the repeat offender went unseen."""
    from sqlalchemy import insert

    from rsc_health.historian.lemons.features import lemon_repairs
    from rsc_health.historian.schema import node_actions

    lemon = "rsc_health:lemon:node_fails:node_fails 4 (min 3)"
    back = AS_OF - 15 * DAY
    rows = []
    for node in ("n1", "n2"):
        rows += [
            dict(id=f"{node}d", time=AS_OF - 20 * DAY, node=node, action="lemon_drain",
                 reason=lemon),
            dict(id=f"{node}r", time=back, node=node, action="resume",
                 reason=f"{lemon} (by ops)"),
        ]
        fleet.failed([node], node, end=AS_OF - 3 * DAY)  # failed again after the repair
    rows += [  # n1's new failure: an XID drain, lifted by the node agent two days later
        dict(id="c1", time=AS_OF - 3 * DAY, node="n1", action="drain_now",
             reason="rsc_health:now:xid79:gpu3"),
        dict(id="c2", time=AS_OF - 2 * DAY, node="n1", action="resume",
             reason="rsc_health:now:xid79:gpu3"),
    ]
    # legacy rows (no reason recorded): the first resume after the lemon drain is the repair's
    rows += [
        dict(id="l1", time=AS_OF - 20 * DAY, node="n3", action="drain", reason=lemon),
        dict(id="l2", time=back, node="n3", action="resume", reason=""),
        dict(id="l3", time=AS_OF - 2 * DAY, node="n3", action="resume", reason=""),
    ]
    fleet.failed(["n3"], "n3", end=AS_OF - 3 * DAY)
    with engine.begin() as conn:
        conn.execute(insert(node_actions), rows)
    assert lemon_repairs(engine, AS_OF) == {"n1": back, "n2": back, "n3": back}
    f = lemon_features(engine, AS_OF)
    verdicts = lemon_verdicts(engine, f, AS_OF, _repeat_only())
    assert [v.node for v in verdicts] == ["n1", "n2", "n3"]
    assert all(v.repeat_offender and v.resumed_at == back for v in verdicts)


def test_a_node_that_keeps_dying_and_going_to_repair_is_a_lemon_with_its_history(fleet, engine):
    # Only one outage and one ticket in the 28-day window: the history features carry it.
    for days in (80, 50, 5):
        fleet.event("n1", AS_OF - days * DAY - DAY, state="DOWN", reason="Not responding")
        fleet.ticket("n1", AS_OF - days * DAY, closed=AS_OF - (days - 1) * DAY)
    fleet.ticket("n1", AS_OF - 120 * DAY)  # beyond history_days: neither counted nor listed
    fleet.ticket("n2", AS_OF - 50 * DAY)  # one repair in a quarter is ordinary wear
    for i in range(20):  # the quiet rest of the fleet, which n1 is judged against
        fleet.job([f"q{i:02d}"], end=AS_OF - 3 * DAY)
    f = lemon_features(engine, AS_OF)
    # each ticket, opened a day after its DOWN, is that DOWN's repair: 3 episodes, not 6
    assert f.loc["n1", ["episodes", "repairs"]].tolist() == [3, 3]
    (v,) = lemon_verdicts(engine, f, AS_OF, LemonRules.from_config())
    assert v.node == "n1"
    assert v.summary().startswith(
        "tickets_history=3>=3, out_count_history=3>=3, down_outs_history=3>=2"
    )
    assert v.top_feature == "down_outs_history"
    assert len(v.evidence["tickets"]) == 3 and len(v.evidence["out_of_service"]) == 3
    assert len(evidence(engine, "n1", AS_OF, 28, history_days=28)["tickets"]) == 1


def test_a_node_resumed_after_a_lemon_drain_made_by_apply_is_back_from_repair(fleet, engine):
    """`lemons --apply` records its drains as lemon_drain (ActionKind); lemon_repairs looked
    for the older word "drain" only, so a node resumed after one was never back from repair
    and its failures from before the drain kept counting against it."""
    from lemon_fleet import fleet_slurm
    from sqlalchemy import insert

    from rsc_health.historian.lemons.apply import CountGuard, apply_verdicts
    from rsc_health.historian.lemons.features import lemon_repairs
    from rsc_health.historian.lemons.verdicts import Crossing, LemonVerdict
    from rsc_health.historian.schema import node_actions
    from rsc_health.model import ActionKind

    drained_at, resumed_at = AS_OF - 9 * DAY, AS_OF - 4 * DAY
    done = apply_verdicts(engine, [LemonVerdict("n1", [Crossing("node_fails", 4, 3)])],
                          fleet_slurm(), CountGuard(10), now=drained_at, apply=True)
    assert [a.action for a in done] == ["drain"]
    with engine.begin() as conn:  # `healthctl resume n1` after the repair
        conn.execute(insert(node_actions).values(id="r1", time=resumed_at, node="n1",
                                                 action=ActionKind.RESUME.value, reason=""))
    assert lemon_repairs(engine, AS_OF) == {"n1": resumed_at}
    fleet.failed(["n1"], "n1", end=AS_OF - DAY)  # and it fails again: a repeat offender
    f = lemon_features(engine, AS_OF)
    (v,) = lemon_verdicts(engine, f, AS_OF, _repeat_only())
    assert v.node == "n1" and v.repeat_offender and v.resumed_at == resumed_at


def test_a_verdict_names_the_episodes_its_incident_days_took():
    from rsc_health.historian.lemons.verdicts import Crossing, LemonVerdict, _peer

    row = pd.Series({"rate_q": 1e-4, "peer_group": "c/p", "rate_by": "episodes",
                     "episodes": 6, "rate_expected": 0.8, "repairs": 0,
                     "repairs_expected": 0.1, "incident_episodes": 2})
    v = LemonVerdict("n1", [Crossing("rate_surprise", 4.0, 2.0)], peer=_peer(row))
    assert v.peer["incident_episodes"] == 2
    assert v.summary() == ("episodes=6 vs 0.80 expected at the rate of c/p (q=1.0e-04) "
                           "(2 episodes on fleet-wide incident days of c/p left out)")
    assert v.to_dict()["peer"]["incident_episodes"] == 2
    quiet = LemonVerdict("n2", [Crossing("rate_surprise", 4.0, 2.0)],
                         peer=_peer(row.drop("incident_episodes")))
    assert "incident" not in quiet.summary()
