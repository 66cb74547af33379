"""The suspect tier under what a fleet does to it between passes: a person's drain or a DOWN
while the guard's share moves on, a job's step files piling onto a telemetry suspect, Slurm
away when an episode ends, shadow mode switched on and off, two passes at once, a node whose
own weight is the suspect weight or above it, a detector that fails, a person's clear stamped
by a clock a year ahead. Each of these left a node untrusted past the guard's cap, trusted
when it should not be, at weight 1 for good, or out of reach of new evidence."""

from __future__ import annotations

from datetime import timedelta

import pytest
from click.testing import CliRunner

from rsc_health.cli import AppContext
from rsc_health.commands.suspects import suspects as suspects_cmd
from rsc_health.historian import db
from rsc_health.historian import suspects as hs
from rsc_health.historian.failslow.evidence import STEPS
from rsc_health.slurm.memory import MemorySlurm
from rsc_health.suspects import manager_pass
from tests.historian.test_suspects import T0, TRUSTED, H, cfg, ev, fleet, run_pass

MIN = timedelta(minutes=1)


@pytest.fixture
def engine(tmp_path):
    e = db.connect(f"sqlite:///{tmp_path / 'h.db'}", create_missing=True)
    yield e
    e.dispose()


def _untrusted(slurm) -> list[str]:
    return sorted(n for n, i in slurm.info.items() if TRUSTED not in i.features)


@pytest.mark.parametrize("state", [("IDLE+DRAIN", "checking fans -- alice"),
                                   ("DOWN", "Not responding")])
def test_a_suspect_held_by_a_person_or_a_down_comes_back_trusted_when_the_guard_is_full(
        engine, tmp_path, state):
    """Cap one (20 nodes at 5%). node07 was applied, then drained by a person (or DOWN);
    node08 took the place. When node07 returned, the guard held it but left the tier's marks
    on it: two nodes untrusted under a cap of one, and node07 never qualified."""
    slurm, config = fleet(20), cfg(tmp_path)
    run_pass(engine, slurm, config, T0, [ev("node07", T0)])
    assert _untrusted(slurm) == ["node07"]
    slurm.set_state("node07", *state)
    run_pass(engine, slurm, config, T0 + 5 * MIN, [ev("node08", T0 + 5 * MIN, dev=5.0)])
    slurm.set_state("node07", "IDLE", "")
    t = T0 + 10 * MIN
    run_pass(engine, slurm, config, t, [ev("node07", t), ev("node08", t, dev=5.0)])
    assert _untrusted(slurm) == ["node08"]
    assert slurm.info["node07"].weight == 10
    assert {e.node: e.tier for e in hs.active(engine)} == {"node07": "held", "node08": "applied"}


def test_step_files_piled_onto_a_telemetry_suspect_never_give_its_place_away(engine, tmp_path):
    """A user's job writing slow steps for node07, already a telemetry suspect holding the
    guard's one place, refiled its episode under the step files (weaker, last in the
    guard's line): node07 went back to big jobs and node08 took its place."""
    slurm, config = fleet(20), cfg(tmp_path)
    run_pass(engine, slurm, config, T0, [ev("node07", T0), ev("node08", T0, dev=5.0)])
    assert _untrusted(slurm) == ["node07"]
    for k in (1, 2):  # with its telemetry, then the step files alone
        t = T0 + 5 * k * MIN
        evidence = [ev("node07", t, dev=3.0, source=STEPS, jobs=("555",)),
                    ev("node08", t, dev=5.0)] + ([ev("node07", t)] if k == 1 else [])
        run_pass(engine, slurm, config, t, evidence)
        assert _untrusted(slurm) == ["node07"]
        [ep] = [e for e in hs.active(engine) if e.node == "node07"]
        assert ep.source != STEPS and ep.deviation == 9.5 and "555" in ep.job_ids


def test_an_episode_that_ended_while_slurm_was_away_gives_the_node_its_own_weight(engine,
                                                                                 tmp_path):
    """node07 expired while slurmctld was unreachable (its restore failed); new evidence opened
    a new episode on a node still marked, which saved weight 1, and at its end node07 went
    from weight 10 to 1, the first node Slurm fills."""
    slurm, config = fleet(20), cfg(tmp_path)
    run_pass(engine, slurm, config, T0, [ev("node07", T0)])
    slurm.stop()
    assert run_pass(engine, slurm, config, T0 + 25 * H).expired == ["node07"]
    slurm.start()
    t = T0 + 25 * H + 2 * MIN
    run_pass(engine, slurm, config, t, [ev("node07", t - MIN)])
    assert slurm.info["node07"].weight == 1000
    assert run_pass(engine, slurm, config, t + 25 * H).expired == ["node07"]
    assert slurm.info["node07"].weight == 10 and TRUSTED in slurm.info["node07"].features


def test_shadow_mode_in_between_keeps_the_weight_to_give_back(engine, tmp_path):
    slurm, on = fleet(20), cfg(tmp_path)
    run_pass(engine, slurm, on, T0, [ev("node07", T0)])
    (tmp_path / "shadow").mkdir()
    shadow = cfg(tmp_path / "shadow", "[actions]\nenabled = false\n")
    run_pass(engine, slurm, shadow, T0 + 25 * H)  # expires; nothing written
    t = T0 + 26 * H
    run_pass(engine, slurm, shadow, t, [ev("node07", t)])  # a new episode, in shadow
    run_pass(engine, slurm, on, t + MIN, [ev("node07", t + MIN)])
    assert run_pass(engine, slurm, on, t + 26 * H).expired == ["node07"]
    assert slurm.info["node07"].weight == 10 and TRUSTED in slurm.info["node07"].features


def test_two_passes_at_once_never_replace_the_saved_weight_with_a_guess(engine, tmp_path):
    """Pass A read the node (weight 10) and saved it; pass B had read the episodes and the
    node after A's update (weight 1000, no saved weight yet) and saved 1 over A's 10."""
    slurm, config = fleet(20), cfg(tmp_path)
    hs.record(engine, [ev("node07", T0)], T0, expire_after=timedelta(hours=24))
    [ep] = hs.active(engine)
    hs.keep_weight(engine, ep.id, 10)  # pass A
    hs.keep_weight(engine, ep.id, 1, replace=False)  # pass B's guess
    assert hs.active(engine)[0].slurm_weight == 10
    hs.keep_weight(engine, ep.id, 12)  # a weight read off the node (a reconfigure changed it)
    assert hs.active(engine)[0].slurm_weight == 12
    slurm.update_node("node07", features=("h100",), weight=1000)  # A's update, landed
    run_pass(engine, slurm, config, T0 + MIN, [ev("node07", T0 + MIN)])
    assert hs.active(engine)[0].slurm_weight == 12


def test_a_node_whose_own_weight_is_the_suspect_weight_gets_it_back(engine, tmp_path):
    slurm = MemorySlurm()
    for i in range(1, 21):
        slurm.add_node(f"node{i:02d}", features=("h100", TRUSTED), weight=1000 if i == 7 else 10)
    config = cfg(tmp_path)
    run_pass(engine, slurm, config, T0, [ev("node07", T0)])
    assert hs.active(engine)[0].slurm_weight == 1000
    run_pass(engine, slurm, config, T0 + 25 * H)
    assert slurm.info["node07"].weight == 1000 and TRUSTED in slurm.info["node07"].features


def test_a_suspect_weight_not_above_the_nodes_own_is_said(engine, tmp_path):
    """Nodes at Weight=5000: a suspect lowered to 1000 is the first node small jobs get."""
    slurm = MemorySlurm()
    for i in range(1, 21):
        slurm.add_node(f"node{i:02d}", features=("h100", TRUSTED), weight=5000)
    res = run_pass(engine, slurm, cfg(tmp_path), T0, [ev("node07", T0)])
    assert _untrusted(slurm) == ["node07"]  # kept off big jobs all the same
    assert any("own weight 5000 is not below [suspects] suspect_weight 1000" in e
               for e in res.errors)


def test_a_failing_detector_still_brings_slurm_in_line_and_expires(engine, tmp_path):
    """A reconfigure gave node07 its feature back while the detector failed every pass (a
    statement timeout): the pass stopped before the tier, so node07 stayed trusted."""
    slurm, config = fleet(20), cfg(tmp_path)
    run_pass(engine, slurm, config, T0, [ev("node07", T0)])
    slurm.update_node("node07", features=("h100", TRUSTED), weight=10)  # a reconfigure

    def broken(engine, now, cfg):
        raise TimeoutError("canceling statement due to statement timeout")

    res = manager_pass(engine, slurm, config, T0 + MIN, detect=broken)
    assert _untrusted(slurm) == ["node07"]
    assert res.detector_error.startswith("fail-slow detector: TimeoutError")
    assert res.errors == [] and res.failed and res.as_dict()["detector_error"]
    res = manager_pass(engine, slurm, config, T0 + 25 * H, detect=broken)
    assert res.expired == ["node07"] and _untrusted(slurm) == []


def test_a_clear_stamped_by_a_clock_a_year_ahead_does_not_shut_out_new_evidence(engine,
                                                                                tmp_path):
    slurm, config = fleet(20), cfg(tmp_path)
    run_pass(engine, slurm, config, T0, [ev("node07", T0)])
    hs.clear(engine, "node07", T0 + 365 * 24 * H, who="alice", why="fans")
    t = T0 + 2 * H
    assert run_pass(engine, slurm, config, t, [ev("node07", t)]).recorded == {"node07": "new"}
    assert _untrusted(slurm) == ["node07"]


def test_clear_in_shadow_mode_says_slurm_was_left_as_it_is(engine, tmp_path):
    slurm, config = fleet(20), cfg(tmp_path)
    run_pass(engine, slurm, config, T0, [ev("node07", T0)])
    shadow = tmp_path / "shadow.toml"
    shadow.write_text("[actions]\nenabled = false\n")
    obj = AppContext(config_path=str(shadow), db_url=str(engine.url))
    obj.slurm = slurm
    out = CliRunner().invoke(suspects_cmd, ["clear", "node07", "--reason", "fans"], obj=obj)
    assert out.exit_code == 0, out.output
    assert "shadow mode" in out.output and "nothing is written to Slurm" in out.output
    assert _untrusted(slurm) == ["node07"]


@pytest.mark.parametrize("line", ['trusted_feature = ""', 'trusted_feature = "a,b"',
                                  'trusted_feature = "has space"', "expire_after_h = 1e12",
                                  "expire_after_h = 0"])
def test_a_trusted_feature_slurm_cannot_take_or_an_absurd_expiry_is_a_config_error(tmp_path,
                                                                                     line):
    from rsc_health import ConfigError

    with pytest.raises(ConfigError, match="trusted_feature|expire_after_h"):
        cfg(tmp_path, f"[suspects]\n{line}\n")


def test_a_node_features_plugins_active_modes_are_kept_not_set_to_every_available_one(engine,
                                                                                      tmp_path):
    """With a node_features plugin (knl_generic, helpers) a node lists modes it could boot
    into (AvailableFeatures) beside those it runs (ActiveFeatures). The tier sent the
    available list as active too: mutually exclusive modes all marked on."""
    from rsc_health.slurm.cli_backend import node_update_argv, parse_node_line
    from tests.slurm.test_cli_backend import DRAINED  # scontrol -o show node, Slurm 22.05

    line = DRAINED.replace("AvailableFeatures=(null) ActiveFeatures=(null)",
                           "AvailableFeatures=quad,snc2,cache,flat,rsc_trusted "
                           "ActiveFeatures=quad,cache,rsc_trusted")
    info = parse_node_line(line)
    assert info.features == ("quad", "snc2", "cache", "flat", TRUSTED)
    assert info.active == ("quad", "cache", TRUSTED)
    slurm = fleet(20)
    slurm._nodes["node07"].features = info.features
    slurm._nodes["node07"].active_features = info.active
    config = cfg(tmp_path)
    run_pass(engine, slurm, config, T0, [ev("node07", T0)])
    n = slurm.info["node07"]
    assert n.features == ("quad", "snc2", "cache", "flat") and n.active == ("quad", "cache")
    assert "ActiveFeatures=quad,cache" in node_update_argv(
        "node07", n.features, 1000, n.active)
    run_pass(engine, slurm, config, T0 + 25 * H)  # expired: both lists get it back
    n = slurm.info["node07"]
    assert TRUSTED in n.features and n.active == ("quad", "cache", TRUSTED) and n.weight == 10
    # without a plugin the two lists are one (scontrol prints them alike)
    plain = parse_node_line(line.replace("ActiveFeatures=quad,cache,rsc_trusted",
                                         "ActiveFeatures=quad,snc2,cache,flat,rsc_trusted"))
    assert plain.active_features is None and plain.active == plain.features


def test_an_operators_own_healthctl_drain_is_a_persons_state_the_tier_leaves_alone(engine,
                                                                                   tmp_path):
    """`healthctl drain` writes our prefix with mode manual: the guard and qualification
    treat it as a person's decision; the tier took it for its own and changed the node."""
    from rsc_health.policy import MANUAL_MODE

    slurm, config = fleet(20), cfg(tmp_path)
    slurm.set_state("node07", "IDLE+DRAIN", f"rsc_health:{MANUAL_MODE}:operator:bob DIMM "
                    "reseat pending", user="bob")
    res = run_pass(engine, slurm, config, T0, [ev("node07", T0)])
    assert [(c.node, c.kind.value) for c in res.changes] == [("node07", "suspect_held")]
    assert TRUSTED in slurm.info["node07"].features and slurm.info["node07"].weight == 10
    slurm.set_state("node07", "IDLE+DRAIN", "rsc_health:now:xid79:gpu3 fell off the bus")
    run_pass(engine, slurm, config, T0 + MIN, [ev("node07", T0 + MIN)])
    assert _untrusted(slurm) == ["node07"]  # our own automatic drain: the tier applies


def test_a_persons_clear_while_a_pass_applies_the_episode_leaves_the_node_trusted(engine,
                                                                                 tmp_path):
    """The timer's pass read node07's new episode, then a person cleared it and their clear's
    own pass found Slurm still trusting node07 (nothing to give back); the timer's update landed
    after: node07 was kept off big jobs with no episode until the next pass. Its pass now
    checks the episode after its update and gives the node back at once."""
    from rsc_health.suspects import apply

    slurm, config = fleet(20), cfg(tmp_path)
    hs.record(engine, [ev("node07", T0)], T0, expire_after=timedelta(hours=24))
    real = slurm.update_node
    raced = []

    def update_node(node, **kw):
        if not raced:  # the person's clear and its own pass, between our read and our write
            raced.append(node)
            assert hs.clear(engine, "node07", T0 + MIN, who="alice", why="mis-sharded job")
            assert apply(engine, slurm, config, T0 + MIN) == ([], [])
        real(node, **kw)

    slurm.update_node = update_node
    done, errors = apply(engine, slurm, config, T0 + MIN)
    assert raced == ["node07"] and errors == []
    assert _untrusted(slurm) == [] and slurm.info["node07"].weight == 10
    assert [c.kind.value for c in done] == ["suspect", "suspect_restore"]
    assert "ended while this pass applied it" in done[-1].why
    # and the next pass has nothing to change
    assert apply(engine, slurm, config, T0 + 2 * MIN) == ([], [])


def test_a_suspect_drained_by_a_person_comes_back_trusted_after_suspect_weight_was_raised(
        engine, tmp_path):
    """node07 is a suspect (rsc_trusted off, weight 1000, its own 10 saved). A person drains it
    for repair; meanwhile the operator raises [suspects] suspect_weight to 2000 (as the pass's
    own error tells a site whose weights are high to do). The person clears the episode: the
    feature and its own weight come back. The tier knew its marks only at the current suspect
    weight, and left node07 off big jobs at 1000 for good."""
    slurm, config = fleet(20), cfg(tmp_path)
    run_pass(engine, slurm, config, T0, [ev("node07", T0)])
    assert TRUSTED not in slurm.info["node07"].features
    assert slurm.info["node07"].weight == 1000
    slurm.set_state("node07", "IDLE+DRAIN", "replacing GPU3 -- alice", user="alice")
    (tmp_path / "new").mkdir()
    raised = cfg(tmp_path / "new", "[suspects]\nsuspect_weight = 2000\n")
    run_pass(engine, slurm, raised, T0 + MIN)
    assert slurm.info["node07"].weight == 1000  # the person's drain wins: left as it is
    hs.clear(engine, "node07", T0 + 2 * MIN, who="alice", why="GPU replaced")
    for k in range(3, 6):
        run_pass(engine, slurm, raised, T0 + k * MIN)
    slurm.set_state("node07", "IDLE", "")
    run_pass(engine, slurm, raised, T0 + 10 * MIN)
    run_pass(engine, slurm, raised, T0 + 30 * H)
    info = slurm.info["node07"]
    assert TRUSTED in info.features, f"node07 never trusted again: {info.features}"
    assert info.weight == 10


def test_raising_suspect_weight_moves_a_suspect_and_keeps_its_own_weight(engine, tmp_path):
    """node07 suspect at weight 1000 (own 10 saved). suspect_weight raised to 2000: the next
    pass moves it to 2000 and keeps 10 as its own (it took the old suspect weight for the
    node's own and saved 1000), so when the episode ends node07 comes back at 10."""
    slurm, config = fleet(20), cfg(tmp_path)
    run_pass(engine, slurm, config, T0, [ev("node07", T0)])
    (tmp_path / "new").mkdir()
    raised = cfg(tmp_path / "new", "[suspects]\nsuspect_weight = 2000\n")
    res = run_pass(engine, slurm, raised, T0 + MIN)
    assert slurm.info["node07"].weight == 2000
    assert hs.active(engine)[0].slurm_weight == 10
    assert not res.errors  # its own 10 is below 2000: nothing to say
    assert "changed since the tier set it" in " ".join(c.why for c in res.changes)
    hs.clear(engine, "node07", T0 + 2 * MIN, who="alice", why="checked")
    run_pass(engine, slurm, raised, T0 + 3 * MIN)
    info = slurm.info["node07"]
    assert TRUSTED in info.features
    assert info.weight == 10, f"node07 given back weight {info.weight}, not its own 10"


def test_lowering_suspect_weight_still_gives_a_suspect_back_its_own_weight(engine, tmp_path):
    """The same the other way: suspect_weight lowered to 500 (still above every node's own)."""
    slurm, config = fleet(20), cfg(tmp_path)
    run_pass(engine, slurm, config, T0, [ev("node07", T0)])
    (tmp_path / "new").mkdir()
    lowered = cfg(tmp_path / "new", "[suspects]\nsuspect_weight = 500\n")
    hs.clear(engine, "node07", T0 + MIN, who="alice", why="checked")
    run_pass(engine, slurm, lowered, T0 + 2 * MIN)
    info = slurm.info["node07"]
    assert TRUSTED in info.features and info.weight == 10


def test_a_shadow_nodes_would_suspect_never_takes_the_guards_place_from_a_live_one(engine,
                                                                                  tmp_path):
    """A pilot: the site in shadow mode, node0[1-9] live ([nodes."node0*".actions] enabled).
    20 nodes, max_share 5%: one suspect in Slurm at once. node15 (shadow: nothing is written
    for it) has the stronger evidence; node03 (live) is slow too. The guard bounds suspects in
    Slurm: node03 is applied, and node15's would_suspect is still recorded (it counted as the
    partition's one suspect and held node03: no node was kept from big jobs at all)."""
    slurm = fleet(20)
    config = cfg(tmp_path, '[actions]\nenabled = false\n\n[nodes."node0*".actions]\n'
                           'enabled = true\n')
    run_pass(engine, slurm, config, T0, [ev("node15", T0, dev=20.0), ev("node03", T0)])
    tiers = {e.node: e.tier for e in hs.active(engine)}
    assert _untrusted(slurm) == ["node03"], f"untrusted in Slurm: {_untrusted(slurm)}; {tiers}"
    assert tiers == {"node03": "applied", "node15": "shadow"}


def test_shadow_nodes_are_judged_by_the_guard_as_if_the_fleet_were_live(engine, tmp_path):
    """Two shadow nodes in a partition whose share is one: one would be a suspect, the other
    would be held, as going live would do. Neither holds a live node back."""
    slurm = fleet(20)
    config = cfg(tmp_path, '[actions]\nenabled = false\n\n[nodes."node0*".actions]\n'
                           'enabled = true\n')
    run_pass(engine, slurm, config, T0, [ev("node15", T0, dev=20.0), ev("node16", T0),
                                         ev("node03", T0)])
    tiers = {e.node: e.tier for e in hs.active(engine)}
    assert tiers == {"node03": "applied", "node15": "shadow", "node16": "held"}
    assert _untrusted(slurm) == ["node03"]


def _qualified(engine, node: str, tier: str, verdict: str, when) -> None:
    from sqlalchemy import insert

    from rsc_health.historian.schema import qualify_runs

    with engine.begin() as conn:
        conn.execute(insert(qualify_runs).values(
            run_id=f"{tier}-{verdict}-{when:%H%M}", node=node, tier=tier, started=when - MIN,
            ended=when, verdict=verdict, reason="", gpu_model="H100", driver="550"))


@pytest.mark.parametrize("qualify_tier,passed,clears", [
    ("deep", "lite", False), ("deep", "full", False), ("deep", "deep", True),
    ("full", "lite", False), ("full", "full", True), ("full", "deep", True)])
def test_only_a_pass_of_the_qualify_tier_or_a_deeper_one_clears_a_suspect(
        engine, tmp_path, qualify_tier, passed, clears):
    """node07 is a fail-slow suspect, waiting for [suspects] qualify_tier. A pass of a
    shallower tier (`qualify run --tier lite`: DCGM level 1, seconds; it cannot see a GPU in HW
    slowdown or an x8 link) clears nothing: node07 stays off big jobs. Tiers are ordered lite <
    full < deep. Any tier's pass cleared it."""
    slurm = fleet(20)
    config = cfg(tmp_path, f'[suspects]\nqualify_tier = "{qualify_tier}"\n')
    run_pass(engine, slurm, config, T0, [ev("node07", T0)])
    _qualified(engine, "node07", passed, "pass", T0 + 2 * MIN)
    res = run_pass(engine, slurm, config, T0 + 3 * MIN)
    assert [n for n, _, _ in res.settled] == (["node07"] if clears else [])
    assert [e.node for e in hs.active(engine)] == ([] if clears else ["node07"])
    assert (TRUSTED in slurm.info["node07"].features) is clears


def test_a_shallow_pass_after_the_qualify_tiers_fail_does_not_hide_the_fail(engine, tmp_path):
    """The deep tier failed and the flow drained node07 for it; a lite pass after it is not
    the newest run that decides: the episode is confirmed."""
    from sqlalchemy import insert

    from rsc_health.historian.schema import node_actions
    from rsc_health.model import ActionKind

    slurm, config = fleet(20), cfg(tmp_path)
    run_pass(engine, slurm, config, T0, [ev("node07", T0)])
    _qualified(engine, "node07", "deep", "fail", T0 + 2 * MIN)
    with engine.begin() as conn:
        conn.execute(insert(node_actions).values(
            id="drain07", time=T0 + 2 * MIN, node="node07",
            action=ActionKind.QUALIFY_DRAIN.value,
            reason="rsc_health:qualify:gpu_burn:gpu_burn: gpu-burn/fp64_tc_flops:3 -9.1%"))
    _qualified(engine, "node07", "lite", "pass", T0 + 4 * MIN)
    res = run_pass(engine, slurm, config, T0 + 5 * MIN)
    assert [(n, s.value) for n, s, _ in res.settled] == [("node07", "confirmed")]


def test_a_node_the_site_took_off_big_jobs_long_after_its_episode_stays_off(engine, tmp_path):
    """node07 was a suspect in January: the tier saved its weight 10, set 1000, and at the
    episode's end gave back rsc_trusted and weight 10. Weeks later the site itself takes
    node07 off big jobs (no rsc_trusted, weight 50: a node on probation, another hardware
    class). No episode is open and nothing is owed: the saved weight of that closed,
    given-back episode must not make weight 50 read as the tier's marks (helper-210)."""
    slurm, config = fleet(20), cfg(tmp_path)
    run_pass(engine, slurm, config, T0, [ev("node07", T0)])
    assert TRUSTED not in slurm.info["node07"].features
    assert run_pass(engine, slurm, config, T0 + 25 * H).expired == ["node07"]
    assert TRUSTED in slurm.info["node07"].features and slurm.info["node07"].weight == 10
    # the site's own change, weeks later
    slurm.update_node("node07", features=("h100",), weight=50)
    run_pass(engine, slurm, config, T0 + 40 * 24 * H)
    assert TRUSTED not in slurm.info["node07"].features, "given back a feature never taken"
    assert slurm.info["node07"].weight == 50


def test_a_node_turned_shadow_while_the_tier_holds_it_still_counts_toward_the_guard(
        engine, tmp_path):
    """20 nodes, max_share 5%: one suspect in Slurm at once. node07 is live and applied; the
    pilot then turns node07 shadow ([nodes."node07".actions] enabled = false): the tier writes
    nothing for it, so its marks stay in Slurm. node15 (live) is slow: it must be held, not
    applied beside it, two nodes kept from big jobs where the cap is one (helper-210)."""
    slurm = fleet(20)
    run_pass(engine, slurm, cfg(tmp_path), T0, [ev("node07", T0, dev=20.0)])
    assert _untrusted(slurm) == ["node07"]
    (tmp_path / "pilot").mkdir()
    narrowed = cfg(tmp_path / "pilot", '[nodes."node07".actions]\nenabled = false\n')
    t = T0 + 5 * MIN
    run_pass(engine, slurm, narrowed, t, [ev("node07", t, dev=20.0), ev("node15", t)])
    assert len(_untrusted(slurm)) <= 1, f"untrusted in Slurm: {_untrusted(slurm)}"
