"""Suspect episodes in the historian and the suspect tier in (in-memory) Slurm: evidence opens
and renews, silence expires, qualification clears or confirms, a person's clear wins over old
evidence; the tier takes the trusted feature off short of a drain, in shadow mode changes
nothing, caps suspects per partition, leaves a person's drain alone and re-applies what Slurm
lost. The same story on the real cluster: tests/slurm/test_suspect_tier.py."""

from __future__ import annotations

import json
from datetime import datetime, timedelta

import pytest
from click.testing import CliRunner
from sqlalchemy import insert, select, text

from rsc_health.cli import AppContext
from rsc_health.commands.suspects import suspects as suspects_cmd
from rsc_health.config import load_config
from rsc_health.historian import db
from rsc_health.historian import suspects as hs
from rsc_health.historian.failslow.evidence import STEPS, TELEMETRY, SuspectEvidence
from rsc_health.historian.schema import node_actions, qualify_runs
from rsc_health.model import ActionKind, SuspectState
from rsc_health.slurm.memory import MemorySlurm
from rsc_health.suspects import manager_pass

T0 = datetime(2026, 11, 20, 12, 0)
H = timedelta(hours=1)
DAY = timedelta(days=1)
TRUSTED = "rsc_trusted"


def ev(node, at, *, metric="sm_clock_ratio", value=0.62, peer=0.98, dev=9.5, jobs=("101",),
       source=TELEMETRY, since=None):
    return SuspectEvidence(node=node, metric=metric, value=value, peer_median=peer,
                           deviation=dev, since=since or at - 10 * timedelta(minutes=1),
                           last=at, job_ids=tuple(jobs), source=source,
                           detail=f"gpu3 {metric} in jobs {','.join(jobs)}")


def fleet(n=20, **kw):
    """n trusted nodes at weight 10, as slurm.conf declares them."""
    slurm = MemorySlurm(**kw)
    for i in range(1, n + 1):
        slurm.add_node(f"node{i:02d}", features=("h100", TRUSTED), weight=10)
    return slurm


def cfg(tmp_path, text_=""):
    p = tmp_path / "config.toml"
    p.write_text(text_)
    return load_config(str(p))


def actions(engine, node=None):
    q = select(node_actions.c.node, node_actions.c.action, node_actions.c.reason).order_by(
        node_actions.c.time, node_actions.c.id)
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(q) if node is None or r.node == node]


def run_pass(engine, slurm, config, now, evidence=()):
    return manager_pass(engine, slurm, config, now, detect=lambda e, n, c: list(evidence))


# ---- the historian ------------------------------------------------------------------------------

def test_evidence_opens_an_episode_renews_it_and_silence_expires_it(historian):
    exp = timedelta(hours=24)
    assert hs.record(historian, [ev("node03", T0)], T0, expire_after=exp) == {"node03": "new"}
    [ep] = hs.active(historian)
    assert (ep.node, ep.state, ep.metric, ep.job_ids) == ("node03", SuspectState.SUSPECT,
                                                         "sm_clock_ratio", ("101",))
    assert ep.expires == T0 + exp
    later = T0 + 5 * H
    got = hs.record(historian, [ev("node03", later, jobs=("102",), dev=12.0)], later,
                    expire_after=exp)
    assert got == {"node03": "renewed"}
    [ep] = hs.active(historian)
    assert ep.expires == later + exp and ep.since == T0 - timedelta(minutes=10)
    assert ep.job_ids == ("102", "101") and ep.deviation == 12.0
    assert hs.expire(historian, later + exp - timedelta(seconds=1)) == []
    assert hs.expire(historian, later + exp) == ["node03"]
    assert hs.active(historian) == []
    [ended] = hs.of_node(historian, "node03")
    assert ended.state is SuspectState.EXPIRED and "no evidence since" in ended.change_reason


def test_a_persons_clear_wins_over_evidence_already_known_but_not_over_newer(historian):
    exp = timedelta(hours=24)
    hs.record(historian, [ev("node04", T0)], T0, expire_after=exp)
    cleared = hs.clear(historian, "node04", T0 + H, who="alice", why="job was mis-sharded")
    assert cleared is not None and hs.active(historian) == []
    # The detector still reports the same sweeps (last = T0): no new episode.
    got = hs.record(historian, [ev("node04", T0)], T0 + 2 * H, expire_after=exp)
    assert got["node04"].startswith("ignored")
    assert hs.active(historian) == []
    [ep] = hs.of_node(historian, "node04", limit=1)
    assert (ep.state, ep.changed_by, ep.change_reason) == (
        SuspectState.CLEARED, "alice", "job was mis-sharded")
    # Slow again after the clear: a new episode, from after the clear.
    again = T0 + 3 * H
    assert hs.record(historian, [ev("node04", again, since=T0)], again,
                     expire_after=exp) == {"node04": "new"}
    [ep] = hs.active(historian)
    assert ep.since == T0 + H
    assert hs.clear(historian, "node99", again, who="bob", why="x") is None


def test_qualification_pass_clears_fail_confirms_inconclusive_decides_nothing(historian):
    exp = timedelta(hours=24)
    hs.record(historian, [ev(n, T0) for n in ("node01", "node02", "node03")], T0,
              expire_after=exp)
    with historian.begin() as conn:
        for i, (node, verdict) in enumerate((("node01", "pass"), ("node02", "fail"),
                                             ("node03", "inconclusive"))):
            conn.execute(insert(qualify_runs).values(
                run_id=f"run{i}", node=node, tier="deep", started=T0 + H, ended=T0 + 2 * H,
                verdict=verdict, reason="", gpu_model="H100", driver="550"))
        # A pass from before the episode opened says nothing about it.
        conn.execute(insert(qualify_runs).values(
            run_id="old", node="node03", tier="full", started=T0 - DAY, ended=T0 - DAY,
            verdict="pass", reason="", gpu_model="H100", driver="550"))
        # The flow drained node02 for its failed test (what makes the fail confirm it).
        conn.execute(insert(node_actions).values(
            id="drain02", time=T0 + 2 * H, node="node02", action=ActionKind.QUALIFY_DRAIN.value,
            reason="rsc_health:qualify:gpu_burn:gpu_burn: gpu-burn/fp64_tc_flops:3 -9.1%"))
    settled = {n: s for n, s, _ in hs.settle(historian, T0 + 3 * H, tier="deep")}
    assert settled == {"node01": SuspectState.CLEARED, "node02": SuspectState.CONFIRMED}
    assert [e.node for e in hs.active(historian)] == ["node03"]
    assert hs.counts(historian) == {"cleared": 1, "confirmed": 1, "suspect": 1}


def test_garbled_evidence_is_kept_bounded_and_never_breaks_the_pass(historian):
    exp = timedelta(hours=24)
    junk = [
        ev("node05", T0, value=float("nan"), dev=float("inf"), peer=-1e308,
           jobs=tuple(str(1000 + i) for i in range(500)) + ("9,9",)),
        ev("x" * 300, T0),  # not a node name Slurm could have
        ev("node05", T0 + H, metric="m" * 500, dev=3.0),
        ev("node05", T0 + H, metric="s" * 500, dev=50.0, source=STEPS),
    ]
    assert hs.record(historian, junk, T0 + H, expire_after=exp) == {"node05": "new"}
    [ep] = hs.active(historian)
    # the node's own telemetry leads (steps are the job's word), the finite deviation first
    assert ep.source != STEPS and ep.metric == "m" * 64
    assert len(ep.job_ids) == hs.MAX_JOB_IDS and "9,9" not in ep.job_ids
    assert len(ep.detail) <= hs.MAX_DETAIL


# ---- the tier in Slurm ------------------------------------------------------------------------

def test_a_suspect_loses_the_trusted_feature_and_gains_weight_short_of_a_drain(tmp_path):
    engine = db.connect(f"sqlite:///{tmp_path / 'h.db'}", create_missing=True)
    slurm, config = fleet(), cfg(tmp_path)
    res = run_pass(engine, slurm, config, T0, [ev("node07", T0)])
    n = slurm.info["node07"]
    assert n.features == ("h100",) and n.weight == 1000 and n.state == "IDLE"
    assert not any(c[0] in ("drain", "resume") for c in slurm.calls)
    assert [(c.node, c.kind) for c in res.changes] == [("node07", ActionKind.SUSPECT)]
    [ep] = hs.active(engine)
    assert (ep.tier, ep.slurm_weight) == ("applied", 10)
    # A second pass with the same state changes nothing and records nothing.
    calls = len(slurm.calls)
    run_pass(engine, slurm, config, T0 + timedelta(minutes=1), [ev("node07", T0)])
    assert len(slurm.calls) == calls and len(actions(engine, "node07")) == 1
    # A person clears it: trusted again, at its own weight.
    result = CliRunner().invoke(suspects_cmd, ["clear", "node07", "--reason", "DIMM reseated"],
                                obj=_obj(engine, slurm, tmp_path))
    assert result.exit_code == 0, result.output
    assert slurm.info["node07"].features == ("h100", TRUSTED)
    assert slurm.info["node07"].weight == 10
    assert [a[1] for a in actions(engine, "node07")] == ["suspect", "suspect_restore"]
    engine.dispose()


def _written(slurm, node):
    """What was asked of Slurm for `node` (MemorySlurm.calls holds the writes only)."""
    return [c for c in slurm.calls if c[1:2] == (node,)]


def test_a_tier_change_is_one_scontrol_update_of_features_and_weight(tmp_path):
    """Features, then weight, were two `scontrol update` calls: between them slurmctld
    scheduled with a node that had lost rsc_trusted at its old weight (a CI run read it).
    Each change of the tier is one update now, the suspect's, the re-applied and the
    given-back alike."""
    engine = db.connect(f"sqlite:///{tmp_path / 'h.db'}", create_missing=True)
    slurm, config = fleet(), cfg(tmp_path)
    run_pass(engine, slurm, config, T0, [ev("node07", T0)])
    assert _written(slurm, "node07") == [("update_node", "node07", ("h100",), 1000)]
    slurm.add_node("node07", features=("h100", TRUSTED), weight=10)  # scontrol reconfigure
    run_pass(engine, slurm, config, T0 + timedelta(minutes=1))
    assert _written(slurm, "node07")[1:] == [("update_node", "node07", ("h100",), 1000)]
    # Only the weight lost (a site set it by hand): only the weight is sent.
    slurm.add_node("node07", features=("h100",), weight=10)
    run_pass(engine, slurm, config, T0 + timedelta(minutes=2))
    assert _written(slurm, "node07")[2:] == [("update_node", "node07", None, 1000)]
    result = CliRunner().invoke(suspects_cmd, ["clear", "node07", "--reason", "checked"],
                                obj=_obj(engine, slurm, tmp_path))
    assert result.exit_code == 0, result.output
    assert _written(slurm, "node07")[3:] == [("update_node", "node07", ("h100", TRUSTED), 10)]
    engine.dispose()


def test_a_suspect_weight_slurm_would_drop_is_refused_when_the_config_loads(tmp_path):
    """scontrol drops a weight past 4294967280 with exit 0 and sends the features alone: a
    config asking for one is refused where it is read, not half-applied at every pass."""
    from rsc_health.config import ConfigError

    assert cfg(tmp_path, "[suspects]\nsuspect_weight = 4294967280\n").get(
        "suspects.suspect_weight") == 4294967280
    with pytest.raises(ConfigError, match="suspect_weight"):
        cfg(tmp_path, "[suspects]\nsuspect_weight = 4294967281\n")


def _whole(slurm):
    """Every node as slurm.conf has it or as the tier makes it, never half of each."""
    half = {name: (n.features, n.weight) for name, n in slurm.info.items()
            if (TRUSTED in n.features, n.weight) not in ((True, 10), (False, 1000))}
    assert not half, f"half-changed: {half}"


def test_slurmctld_gone_mid_pass_leaves_no_node_half_changed(tmp_path):
    """slurmctld stops answering right after the pass's first write lands: that node has its
    whole change, the others none (before, the first node kept its feature off at its old
    weight until the next pass). Gone before any write: nothing changes, the episodes stay
    unapplied, and the next pass applies each whole."""
    engine = db.connect(f"sqlite:///{tmp_path / 'h.db'}", create_missing=True)
    slurm, config = fleet(), cfg(tmp_path, "[suspects]\nmax_share = 0.5\n")

    class GoneAfterOneWrite:
        def __getattr__(self, name):
            attr = getattr(slurm, name)
            if name in ("node", "nodes") or not callable(attr):
                return attr

            def write(*a, **kw):
                try:
                    return attr(*a, **kw)
                finally:
                    slurm.stop()
            return write

    evidence = [ev(f"node{i:02d}", T0, dev=float(i)) for i in (3, 5, 7)]
    res = manager_pass(engine, GoneAfterOneWrite(), config, T0,
                       detect=lambda e, n, c: evidence)
    _whole(slurm)
    assert [c.node for c in res.changes] == ["node07"] and len(res.errors) == 2, res.errors
    assert slurm.info["node07"].weight == 1000
    slurm.start()
    slurm.after("nodes", slurm.stop)  # listed, then gone before the first write
    res = run_pass(engine, slurm, config, T0 + timedelta(minutes=1))
    _whole(slurm)
    assert res.changes == [] and len(res.errors) == 2, res.errors
    assert "contact slurm controller" in res.errors[0] and "not tried" in res.errors[1]
    assert sorted(e.tier for e in hs.active(engine)) == ["", "", "applied"]
    slurm.start()
    res = run_pass(engine, slurm, config, T0 + timedelta(minutes=2))
    _whole(slurm)
    assert sorted(c.node for c in res.changes) == ["node03", "node05"] and not res.errors
    assert all(slurm.info[f"node{i:02d}"].weight == 1000 for i in (3, 5, 7))
    engine.dispose()


def test_an_update_that_landed_but_timed_out_still_gives_the_nodes_own_weight_back(tmp_path):
    """scontrol timed out after slurmctld took the update: the node is a suspect in Slurm,
    but the pass heard an error and kept nothing. The next pass found weight 1000 already and
    saved 1 as the weight to give back: a person's clear put the node at weight 1, not its
    own 10 (Slurm then filled it before every other node). The weight to give back is kept
    before the update is sent."""
    engine = db.connect(f"sqlite:///{tmp_path / 'h.db'}", create_missing=True)
    slurm, config = fleet(), cfg(tmp_path)
    slurm.stop_after("update_node", answered=False)
    res = run_pass(engine, slurm, config, T0, [ev("node07", T0)])
    assert res.errors and "did not answer" in res.errors[0], res.errors
    assert (slurm.info["node07"].features, slurm.info["node07"].weight) == (("h100",), 1000)
    slurm.start()
    run_pass(engine, slurm, config, T0 + timedelta(minutes=1))
    [ep] = hs.active(engine)
    assert (ep.tier, ep.slurm_weight) == ("applied", 10)
    result = CliRunner().invoke(suspects_cmd, ["clear", "node07", "--reason", "checked"],
                                obj=_obj(engine, slurm, tmp_path))
    assert result.exit_code == 0, result.output
    assert (slurm.info["node07"].features, slurm.info["node07"].weight) == (
        ("h100", TRUSTED), 10)
    engine.dispose()


def test_what_slurm_lost_at_a_reconfigure_is_re_applied_and_said(tmp_path):
    engine = db.connect(f"sqlite:///{tmp_path / 'h.db'}", create_missing=True)
    slurm, config = fleet(), cfg(tmp_path)
    run_pass(engine, slurm, config, T0, [ev("node07", T0)])
    # scontrol reconfigure: the node reads slurm.conf again (where its weight is now 20).
    slurm.add_node("node07", features=("h100", TRUSTED), weight=20)
    res = run_pass(engine, slurm, config, T0 + timedelta(minutes=1))
    [ch] = res.changes
    assert ch.kind is ActionKind.SUSPECT and ch.why.startswith("re-applied")
    assert slurm.info["node07"].features == ("h100",) and slurm.info["node07"].weight == 1000
    [ep] = hs.active(engine)
    assert ep.slurm_weight == 20  # the weight to give back is slurm.conf's, not ours
    engine.dispose()


def test_shadow_mode_records_would_suspect_once_and_changes_nothing(tmp_path):
    engine = db.connect(f"sqlite:///{tmp_path / 'h.db'}", create_missing=True)
    slurm, config = fleet(), cfg(tmp_path, "[actions]\nenabled = false\n")
    for k in range(3):
        run_pass(engine, slurm, config, T0 + k * timedelta(minutes=1), [ev("node07", T0)])
    assert [c for c in slurm.calls if c[0] == "update_node"] == []
    assert [a[1] for a in actions(engine)] == ["would_suspect"]
    assert hs.active(engine)[0].tier == "shadow"
    engine.dispose()


def test_shadow_mode_writes_nothing_even_where_the_guard_would_give_a_node_back(tmp_path):
    """The tier applied two suspects; then the site turns actions off and lowers the cap. The
    guard's give-back is a write to Slurm like any other: in shadow mode it is only said."""
    engine = db.connect(f"sqlite:///{tmp_path / 'h.db'}", create_missing=True)
    slurm = fleet(40)
    run_pass(engine, slurm, cfg(tmp_path, "[suspects]\nmax_share = 0.05\n"), T0,
             [ev("node04", T0, dev=4.0), ev("node05", T0, dev=5.0)])
    assert sorted(n for n, i in slurm.info.items() if TRUSTED not in i.features) == [
        "node04", "node05"]
    calls = len(slurm.calls)
    shadow = cfg(tmp_path, "[suspects]\nmax_share = 0.01\n[actions]\nenabled = false\n")
    run_pass(engine, slurm, shadow, T0 + timedelta(minutes=1))
    assert [c for c in slurm.calls[calls:] if c[0] == "update_node"] == []
    assert slurm.info["node04"].weight == 1000  # left as it was: shadow mode touches nothing
    engine.dispose()


def test_the_guard_caps_suspects_per_partition_strongest_first(tmp_path):
    engine = db.connect(f"sqlite:///{tmp_path / 'h.db'}", create_missing=True)
    slurm, config = fleet(40), cfg(tmp_path, "[suspects]\nmax_share = 0.05\n")
    evidence = [ev(f"node{i:02d}", T0, dev=float(i)) for i in range(1, 6)]
    run_pass(engine, slurm, config, T0, evidence)
    lost = sorted(n for n, i in slurm.info.items() if TRUSTED not in i.features)
    assert lost == ["node04", "node05"]  # 5% of 40: the two strongest
    held = {a[0] for a in actions(engine) if a[1] == "suspect_held"}
    assert held == {"node01", "node02", "node03"}
    # A stronger one found later waits: what the tier holds keeps its place.
    run_pass(engine, slurm, config, T0 + timedelta(minutes=1), [ev("node06", T0, dev=99.0)])
    lost = sorted(n for n, i in slurm.info.items() if TRUSTED not in i.features)
    assert lost == ["node04", "node05"]
    # The strongest is cleared: the next in line takes its place, and it is given back.
    hs.clear(engine, "node05", T0 + H, who="carol", why="fan replaced")
    run_pass(engine, slurm, config, T0 + H)
    lost = sorted(n for n, i in slurm.info.items() if TRUSTED not in i.features)
    assert lost == ["node04", "node06"]
    assert slurm.info["node05"].weight == 10
    # The cap lowered to one: the weaker one is given back, not left half-applied.
    run_pass(engine, slurm, cfg(tmp_path, "[suspects]\nmax_share = 0.01\n"), T0 + 2 * H)
    lost = sorted(n for n, i in slurm.info.items() if TRUSTED not in i.features)
    assert lost == ["node06"] and slurm.info["node04"].weight == 10  # the strongest stays
    engine.dispose()


def test_a_persons_drain_or_down_is_left_alone(tmp_path):
    engine = db.connect(f"sqlite:///{tmp_path / 'h.db'}", create_missing=True)
    slurm, config = fleet(), cfg(tmp_path)
    # A node the site itself keeps without the feature, at the suspects' weight: not ours.
    slurm.add_node("node20", features=("a100",), weight=1000)
    slurm.set_state("node03", "IDLE+DRAIN", "bad fan -- alice", user="alice")
    slurm.set_state("node04", "DOWN*", "Not responding", user="slurm")
    run_pass(engine, slurm, config, T0, [ev("node03", T0), ev("node04", T0)])
    assert slurm.info["node03"].features == ("h100", TRUSTED)
    assert slurm.info["node04"].features == ("h100", TRUSTED)
    assert slurm.info["node20"].features == ("a100",)
    assert [c for c in slurm.calls if c[0].startswith("set_")] == []
    assert sorted(a[:2] for a in actions(engine)) == [("node03", "suspect_held"),
                                                      ("node04", "suspect_held")]
    engine.dispose()


def test_a_controller_away_or_a_hostile_name_is_an_error_not_a_crash(tmp_path):
    engine = db.connect(f"sqlite:///{tmp_path / 'h.db'}", create_missing=True)
    slurm, config = fleet(), cfg(tmp_path)
    slurm.stop()
    res = run_pass(engine, slurm, config, T0, [ev("node07", T0)])
    assert res.errors and "Slurm" in res.errors[0]
    assert hs.active(engine)[0].tier == ""  # recorded; applied at the next pass
    slurm.start()
    res = run_pass(engine, slurm, config, T0 + timedelta(minutes=1))
    assert slurm.info["node07"].weight == 1000 and not res.errors
    # A name from a detector that reads like a hostlist is never handed to scontrol.
    res = run_pass(engine, slurm, config, T0 + 2 * timedelta(minutes=1),
                   [ev("node[01-20]", T0 + H)])
    assert all(TRUSTED in slurm.info[f"node{i:02d}"].features for i in range(1, 7))
    engine.dispose()


def test_no_detector_installed_is_said_and_the_pass_still_runs(tmp_path, monkeypatch):
    import rsc_health.suspects as tier

    engine = db.connect(f"sqlite:///{tmp_path / 'h.db'}", create_missing=True)
    monkeypatch.setattr(tier, "detector", lambda: None)
    res = manager_pass(engine, fleet(), cfg(tmp_path), T0)
    assert res.notes and "no fail-slow detector" in res.notes[0]
    engine.dispose()


# ---- the operator's command ----------------------------------------------------------------------

def _obj(engine, slurm, tmp_path):
    config = tmp_path / "cli.toml"
    config.write_text("")
    obj = AppContext(config_path=str(config), db_url=str(engine.url))
    obj.slurm = slurm
    return obj


def test_healthctl_suspects_shows_the_evidence_and_json(tmp_path):
    engine = db.connect(f"sqlite:///{tmp_path / 'h.db'}", create_missing=True)
    hs.record(engine, [ev("node07", T0, jobs=("4242", "4243"))], T0,
              expire_after=timedelta(hours=24))
    out = CliRunner().invoke(suspects_cmd, [], obj=_obj(engine, fleet(), tmp_path))
    assert out.exit_code == 0, out.output
    assert "node07: suspect: sm_clock_ratio 0.62 vs peers 0.98 (deviation 9.5" in out.output
    assert "jobs 4242, 4243" in out.output
    js = json.loads(CliRunner().invoke(suspects_cmd, ["--json"],
                                       obj=_obj(engine, fleet(), tmp_path)).output)
    [row] = js["suspects"]
    assert row["node"] == "node07" and row["job_ids"] == ["4242", "4243"]
    bad = CliRunner().invoke(suspects_cmd, ["clear", "node08", "--reason", "x"],
                             obj=_obj(engine, fleet(), tmp_path))
    assert bad.exit_code == 1 and "no open suspect episode" in bad.output
    slurm = fleet()
    ok = CliRunner().invoke(suspects_cmd, ["clear", "node07", "--reason", "PSU swapped"],
                            obj=_obj(engine, slurm, tmp_path))
    assert ok.exit_code == 0, ok.output
    assert "no suspect node" in CliRunner().invoke(
        suspects_cmd, [], obj=_obj(engine, slurm, tmp_path)).output
    shown = CliRunner().invoke(suspects_cmd, ["--all"], obj=_obj(engine, slurm, tmp_path))
    assert "node07: cleared (" in shown.output and ": PSU swapped)" in shown.output
    engine.dispose()


def test_migration_0010_adds_the_table_as_schema_py_has_it(historian_url, tmp_path):
    """Both dialects: a version-8 historian upgraded to 10 keeps its rows and has the suspects
    table with schema.py's columns and indexes."""
    from sqlalchemy import inspect

    from rsc_health.historian.schema import suspects as table

    old = db.engine_for(historian_url)
    dialect = old.dialect.name
    old_dir = tmp_path / "old"
    old_dir.mkdir()
    for mig in db.migrations(dialect):
        if mig.version <= 8:
            (old_dir / mig.path.name).write_text(mig.path.read_text())
    try:
        db.migrate(old, 0, old_dir)
        with old.begin() as conn:
            conn.execute(text("INSERT INTO tickets (node, opened, reason, source) "
                              "VALUES ('gpu001', '2026-01-01 00:00:00', 'PSU', 'manual')"))
        assert 10 in db.migrate(old, 8)
        insp = inspect(old)
        cols = {c["name"]: c["nullable"] for c in insp.get_columns("suspects")}
        assert cols == {c.name: c.nullable for c in table.columns}
        assert {i["name"] for i in insp.get_indexes("suspects")} == {i.name for i in table.indexes}
        hs.record(old, [ev("node01", T0), ev("node02", T0)], T0,
                  expire_after=timedelta(hours=1))
        assert hs.counts(old) == {"suspect": 2}
        with old.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM tickets")).scalar() == 1
    finally:
        old.dispose()


def test_status_and_node_show_the_suspect_with_its_evidence(tmp_path, monkeypatch):
    from rsc_health.commands import slurm as slurm_cmds
    from rsc_health.commands.nodeview import node as node_cmd
    from rsc_health.commands.slurm import status as status_cmd

    engine = db.connect(f"sqlite:///{tmp_path / 'h.db'}", create_missing=True)
    slurm, config = fleet(), cfg(tmp_path)
    monkeypatch.setattr(slurm_cmds, "_slurm", lambda ctx: slurm)
    run_pass(engine, slurm, config, T0, [ev("node07", T0, jobs=("4242",))])
    out = CliRunner().invoke(status_cmd, [], obj=_obj(engine, slurm, tmp_path))
    assert "suspects: 1 node(s) kept from big jobs" in out.output, out.output
    assert "node07           sm_clock_ratio deviation 9.5" in out.output
    assert out.exit_code == 0  # a suspect alone is not a problem status exits 1 for
    js = CliRunner().invoke(status_cmd, ["--json"], obj=_obj(engine, slurm, tmp_path))
    [row] = json.loads(js.output)["suspects"]
    assert (row["node"], row["tier"], row["job_ids"]) == ("node07", "applied", ["4242"])
    hs.clear(engine, "node07", T0 + H, who="alice", why="fan replaced")
    out = CliRunner().invoke(node_cmd, ["node07"], obj=_obj(engine, slurm, tmp_path))
    assert ("suspect   CLEARED, alice 2026-11-20 13:00: fan replaced: sm_clock_ratio 0.62 "
            "vs peers 0.98 (deviation 9.5, telemetry) since 2026-11-20 11:50; jobs 4242 "
            "[applied]") in out.output, out.output
    out = CliRunner().invoke(node_cmd, ["node01"], obj=_obj(engine, slurm, tmp_path))
    assert "suspect   never" in out.output
    engine.dispose()


def test_two_passes_at_once_open_one_episode_the_other_renews_it(historian, monkeypatch):
    """The timer's pass and the strigger hook's can run together: one node, one open episode.
    Each pass is slowed between its read and its write, so both would read "no episode"."""
    import threading
    import time

    fields = hs._fields

    def slow(*a, **kw):
        time.sleep(0.3)
        return fields(*a, **kw)

    monkeypatch.setattr(hs, "_fields", slow)
    exp = timedelta(hours=24)
    barrier = threading.Barrier(4)
    said: list[dict] = []

    def one(k):
        barrier.wait()
        said.append(hs.record(historian, [ev("node09", T0 + k * timedelta(seconds=1))],
                              T0, expire_after=exp))

    threads = [threading.Thread(target=one, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(d["node09"] for d in said) == ["new", "renewed", "renewed", "renewed"]
    assert hs.counts(historian) == {"suspect": 1}
    with pytest.raises(Exception, match="(?i)unique"):
        with historian.begin() as conn:  # the database itself refuses a second open episode
            conn.execute(insert(hs.suspects).values(
                node="node09", state="suspect", since=T0, last_evidence=T0, expires=T0,
                metric="x", job_ids="", source="telemetry", detail="", changed=T0,
                changed_by="", change_reason="", tier=""))


def test_two_tier_passes_at_once_record_one_re_application(historian, tmp_path):
    """A reconfigure fires the strigger hook's pass while the timer's runs: both read Slurm
    before either wrote, both re-apply the tier (the same scontrol update twice, harmless),
    and each recorded its own `suspect` action: one re-application, two records."""
    from rsc_health.suspects import apply

    engine = historian
    slurm, config = fleet(), cfg(tmp_path)
    run_pass(engine, slurm, config, T0, [ev("node07", T0)])
    slurm.add_node("node07", features=("h100", TRUSTED), weight=10)  # scontrol reconfigure
    stale = slurm.nodes()  # what the hook's pass read, before the timer's pass wrote

    class ReadBefore:
        def __getattr__(self, name):
            return getattr(slurm, name)

        def nodes(self, names=None):
            return stale

    first, _ = apply(engine, slurm, config, T0 + timedelta(minutes=1))
    second, _ = apply(engine, ReadBefore(), config, T0 + timedelta(minutes=1, seconds=2))
    assert [c.kind for c in first] == [ActionKind.SUSPECT] == [c.kind for c in second]
    assert slurm.info["node07"].features == ("h100",) and slurm.info["node07"].weight == 1000
    again = [a for a in actions(engine, "node07") if a[2].startswith("re-applied")]
    assert len(again) == 1, again
    # A later reconfigure and its re-application is a record of its own.
    slurm.add_node("node07", features=("h100", TRUSTED), weight=10)
    apply(engine, slurm, config, T0 + timedelta(minutes=9))
    assert len([a for a in actions(engine, "node07") if a[2].startswith("re-applied")]) == 2


def test_a_controller_that_stops_answering_mid_pass_costs_one_timeout_not_one_per_node(
        tmp_path):
    """A reconfigure gives every suspect its feature back; slurmctld then freezes. Each of
    the pass's changes waited its own [slurm] call_timeout_s (10 s each, one call a node:
    800 suspects of a 16,000-node fleet, hours). After the first "unavailable" the pass
    tries no other node; the next pass re-applies them."""
    from rsc_health.slurm.api import SlurmUnavailable
    from rsc_health.suspects import apply

    engine = db.connect(f"sqlite:///{tmp_path / 'h.db'}", create_missing=True)
    slurm, config = fleet(), cfg(tmp_path, "[suspects]\nmax_share = 0.5\n")
    evidence = [ev(f"node{i:02d}", T0) for i in (3, 5, 7)]
    run_pass(engine, slurm, config, T0, evidence)
    assert all(TRUSTED not in slurm.info[f"node{i:02d}"].features for i in (3, 5, 7))
    for i in (3, 5, 7):  # scontrol reconfigure
        slurm.add_node(f"node{i:02d}", features=("h100", TRUSTED), weight=10)
    tried = []

    class Frozen:
        def __getattr__(self, name):
            return getattr(slurm, name)

        def update_node(self, node, *, features=None, weight=None):
            tried.append(node)
            raise SlurmUnavailable("scontrol did not answer within 10s")

    changes, errors = apply(engine, Frozen(), config, T0 + timedelta(minutes=1))
    assert len(tried) == 1 and changes == []
    assert len(errors) == 3 and "not tried" in errors[-1], errors
    changes, errors = apply(engine, slurm, config, T0 + timedelta(minutes=2))
    assert sorted(c.node for c in changes) == ["node03", "node05", "node07"] and not errors
    engine.dispose()


def _qualify_suspect(engine, slurm, node, verdict, guard):
    """`qualify auto`'s flow for an idle suspect (undrained, in its reservation); the node's
    job stores `verdict` as `qualify run` does, under the job's id."""
    import uuid
    from datetime import UTC

    from rsc_health.qualify.flow import Flow, HistorianSide

    job_id = str(slurm._next_job + 1)  # the id the flow's sbatch gets

    def store():
        now = datetime.now(UTC).replace(tzinfo=None)
        with engine.begin() as conn:
            conn.execute(insert(qualify_runs).values(
                run_id=uuid.uuid4().hex, node=node, tier="deep", started=now - timedelta(
                    minutes=9), ended=now, verdict=verdict, reason="gpu_burn: gpu-burn/"
                "fp64_tc_flops:3 -9.1% vs peers median", gpu_model="H100", driver="550",
                job_id=job_id))

    slurm.after("submit", store)
    return Flow(slurm, HistorianSide(engine), command=["healthctl"], tier="deep", timeout_s=5,
                poll_s=0.01, guard=guard).run(node, suspect=True)


def test_a_suspects_failed_qualification_the_guard_held_back_does_not_give_trust_back(
        tmp_path):
    """The mass-drain guard held the fail's drain back, so the flow left the suspect in
    service as it came (undrained, still kept off big jobs): the stored fail still confirmed
    the episode and ended it, and the tier gave the node its trusted feature and weight back,
    into big jobs, failed and undrained, with nothing left to qualify it again. Only a fail
    that drained the node confirms; a fail the flow drained still does."""
    engine = db.connect(f"sqlite:///{tmp_path / 'h.db'}", create_missing=True)
    slurm, config = fleet(), cfg(tmp_path)
    from datetime import UTC

    now = datetime.now(UTC).replace(tzinfo=None, microsecond=0) - H
    run_pass(engine, slurm, config, now, [ev("node07", now), ev("node08", now)])
    assert TRUSTED not in slurm.info["node07"].features

    held = _qualify_suspect(engine, slurm, "node07", "fail",
                            guard=lambda node: "mass-drain guard: 2/20 nodes of partition "
                            "batch drained by rsc-health within the window")
    assert held.result == "inconclusive" and "held by the mass-drain guard" in held.detail
    assert not slurm.info["node07"].drain_set  # left in service as it came
    drained = _qualify_suspect(engine, slurm, "node08", "fail", guard=lambda node: None)
    assert drained.result == "fail" and slurm.info["node08"].drain_set

    settled = {n: s for n, s, _ in run_pass(engine, slurm, config,
                                            now + 2 * H).settled}
    assert settled == {"node08": SuspectState.CONFIRMED}
    assert [e.node for e in hs.active(engine)] == ["node07"]
    n = slurm.info["node07"]
    assert TRUSTED not in n.features and n.weight == 1000  # still kept off big jobs
    engine.dispose()


def test_suspects_the_guard_held_are_never_sent_to_qualification(tmp_path):
    """Step files are a job's own word (untrusted: enough for a suspect, never a drain). A
    user's jobs writing slow steps on five idle nodes of a 40-node partition: the guard applies
    two ([suspects] max_share 5%) and holds three, yet every open episode was a qualification
    candidate, so the files took up to [qualify] auto_max_nodes idle nodes into reservations
    each `qualify auto`, past the guard's bound. Held episodes now wait for the guard: only
    what the tier applied (or shadow mode would have) is qualified; when one clears, the next
    in line is applied and becomes due."""
    from rsc_health.qualify.flow import HistorianSide, suspect_candidates

    engine = db.connect(f"sqlite:///{tmp_path / 'h.db'}", create_missing=True)
    slurm, config = fleet(40), cfg(tmp_path, "[suspects]\nmax_share = 0.05\n")
    evidence = [ev(f"node{i:02d}", T0, dev=float(i), source=STEPS, metric="step_time")
                for i in range(1, 6)]
    run_pass(engine, slurm, config, T0, evidence)
    nodes = slurm.nodes()
    assert {n.name for n in nodes if n.flags == {"IDLE"}} >= {f"node{i:02d}" for i in range(1, 6)}

    def due():
        return sorted(n for n, _why in suspect_candidates(
            slurm.nodes(), hs.active(engine), HistorianSide(engine), T0 + H, retry_min=30,
            retry_max_min=720, limit=4))

    assert due() == ["node04", "node05"]
    hs.clear(engine, "node05", T0 + H, who="carol", why="qualified")
    run_pass(engine, slurm, config, T0 + H)
    assert due() == ["node03", "node04"]
    engine.dispose()


def test_step_files_never_push_telemetry_suspects_out_of_the_guards_share(tmp_path):
    """A job's step times are its own word, and so is the deviation the detector draws from
    them: step files claiming a node 99 robust z-scores slow took the guard's share ([suspects]
    max_share: 2 of 40) from a node the node's own telemetry showed slow, which the guard then
    held (left trusted, and never qualified). Telemetry evidence now goes first; step-file
    suspects share what is left."""
    engine = db.connect(f"sqlite:///{tmp_path / 'h.db'}", create_missing=True)
    slurm, config = fleet(40), cfg(tmp_path, "[suspects]\nmax_share = 0.05\n")
    evidence = [ev(f"node{i:02d}", T0, dev=99.0, source=STEPS, metric="step_time")
                for i in range(1, 4)] + [ev("node10", T0, dev=5.0)]
    run_pass(engine, slurm, config, T0, evidence)
    lost = sorted(n for n, i in slurm.info.items() if TRUSTED not in i.features)
    assert "node10" in lost and len(lost) == 2, lost
    engine.dispose()
