"""Shadow mode for some nodes only (`[nodes."GLOB".actions] enabled = false`, the README's
way to pilot one set of nodes) holds for every writer to Slurm, not the node path alone: the
lemons' --apply, a person's `healthctl drain` and `resume`, the suspect tier and a
qualification flow each left a pilot's shadow node drained or untrusted (they read the site's
[actions] enabled only). The one door (`slurm.from_config`) refuses a change naming such a
node whoever asks. And a person's `healthctl drain` over a node rsc-health drained for a
repair keeps the repair's reason: replaced, the maintenance's `resume` put a node with an
XID 48 back in service with no qualification pass."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from click.testing import CliRunner
from sqlalchemy import create_engine

import rsc_health.commands.slurm as cs
from rsc_health.actions import Actor
from rsc_health.cli import AppContext
from rsc_health.commands.lemons import lemons
from rsc_health.config import load_config
from rsc_health.historian import db
from rsc_health.historian.failslow.evidence import TELEMETRY, SuspectEvidence
from rsc_health.model import Finding, Severity, Status
from rsc_health.policy import decide
from rsc_health.slurm import ShadowMode, from_config
from rsc_health.slurm.memory import MemorySlurm
from rsc_health.suspects import manager_pass
from tests.lemons.lemon_fleet import AS_OF, Fleet, drained, fleet_slurm

DAY = timedelta(days=1)
SITE = ('[actions]\nenabled = true\n'
        '[nodes."shadow*".actions]\nenabled = false\n'
        '[lemon]\nxid_cnt = 3\nstrong = ["xid_cnt"]\n')


def _site(tmp_path, text=SITE):
    p = tmp_path / "config.toml"
    p.write_text(text)
    return p


def test_a_node_glob_puts_only_its_nodes_in_shadow(tmp_path):
    cfg = load_config(_site(tmp_path))
    assert not cfg.actions_enabled("shadow01") and cfg.actions_enabled("live01")
    assert cfg.actions_enabled() is True
    # as for_node merges them: the last matching table wins
    later = load_config(_site(tmp_path, SITE + '[nodes."shadow0[1]".actions]\nenabled = true\n'))
    assert later.actions_enabled("shadow01") == later.for_node("shadow01").get("actions.enabled")
    assert later.actions_enabled("shadow01") and not later.actions_enabled("shadow02")


def test_the_door_refuses_a_change_naming_a_shadow_node(tmp_path):
    slurm = from_config(load_config(_site(tmp_path)))
    for change in (lambda s: s.drain("shadow01", "rsc_health:now:xid79:gpu3"),
                   lambda s: s.resume("shadow01"), lambda s: s.undrain("shadow01"),
                   lambda s: s.update_node("shadow01", weight=1000),
                   lambda s: s.create_reservation("rsc_qualify_shadow01", "shadow01", "root")):
        with pytest.raises(ShadowMode, match="shadow mode for shadow01"):
            change(slurm)
    assert slurm.shadow_node is not None and not slurm.shadow_node("live01")


def test_lemons_apply_records_a_shadow_nodes_drain_and_drains_the_others(tmp_path):
    eng = create_engine(f"sqlite:///{tmp_path / 'historian.db'}")
    db.create(eng)
    fleet = Fleet(eng)
    for node in ("shadow01", "live01"):
        for k in range(6):
            fleet.xid(node, AS_OF - (2 * k + 1) * DAY, "xid79", f"gpu{k}")
    slurm = fleet_slurm({"shadow01": ("IDLE", ""), "live01": ("IDLE", "")}, size=60)
    obj = AppContext(config_path=str(_site(tmp_path)), db_url=str(eng.url))
    obj.slurm = slurm
    res = CliRunner().invoke(lemons, ["--as-of", AS_OF.strftime("%Y-%m-%d"), "--apply"],
                             obj=obj)
    eng.dispose()
    assert res.exit_code == 0, res.output
    assert [n for n, _ in drained(slurm)] == ["live01"]
    assert "shadow01: xid_cnt" in res.output and "action: would_drain" in res.output


def test_a_persons_drain_and_resume_of_a_shadow_node_change_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("RSC_HEALTH_ROOT", str(tmp_path / "root"))
    slurm = MemorySlurm(["shadow01", "live01"])
    monkeypatch.setattr(cs, "_slurm", lambda ctx: slurm)
    obj = AppContext(config_path=str(_site(tmp_path)))
    out = CliRunner().invoke(cs.drain, ["shadow01", "--reason", "PSU"], obj=obj)
    assert out.exit_code == 0 and "shadow mode" in out.output, out.output
    assert CliRunner().invoke(cs.resume, ["shadow01"], obj=obj).exit_code == 0
    assert slurm.calls == []
    assert CliRunner().invoke(cs.drain, ["live01", "--reason", "PSU"], obj=obj).exit_code == 0
    assert slurm.info["live01"].drain_set


def test_the_suspect_tier_leaves_a_shadow_node_trusted(tmp_path):
    t0 = datetime(2026, 11, 20, 12, 0)
    engine = db.connect(f"sqlite:///{tmp_path / 'h.db'}", create_missing=True)
    slurm = MemorySlurm()
    for name in ("shadow07", *(f"live{i:02d}" for i in range(1, 20))):
        slurm.add_node(name, features=("h100", "rsc_trusted"), weight=10)

    def ev(node):
        return SuspectEvidence(node=node, metric="sm_clock_ratio", value=0.62,
                               peer_median=0.98, deviation=9.5,
                               since=t0 - timedelta(minutes=10), last=t0, job_ids=("101",),
                               source=TELEMETRY, detail="gpu3")

    res = manager_pass(engine, slurm, load_config(_site(tmp_path, SITE.replace(
        "[lemon]", "[suspects]\nmax_share = 0.2\n[lemon]"))), t0,
        detect=lambda e, n, c: [ev("shadow07"), ev("live03")])
    engine.dispose()
    assert [c[1] for c in slurm.calls if c[0] == "update_node"] == ["live03"]
    assert {c.node: c.kind.value for c in res.changes} == {"shadow07": "would_suspect",
                                                          "live03": "suspect"}


def test_a_persons_drain_over_a_repair_drain_still_owes_a_qualification_pass(tmp_path,
                                                                            monkeypatch):
    """A rack's `healthctl drain` over a node rsc-health drained for an XID 48 (never resumed
    by itself) replaced our reason; the node's next clean sweep forgot its drain record (the
    drain was a person's now) and the rack's `resume` put it back with no qualification pass.
    The person's reason still replaces ours (their work, their words; `qualify auto` leaves a
    manual drain alone), and its code says what it went over, which `resume` reads."""
    monkeypatch.setenv("RSC_HEALTH_ROOT", str(tmp_path / "root"))
    slurm = MemorySlurm([f"n{i:02d}" for i in range(20)])
    actor = Actor(slurm, load_config("/dev/null"), "n01", tmp_path / "n01", log=lambda m: None)
    actor.sleep = lambda s: None
    actor.apply(decide([Finding("xid", "gpu2", Status.FAIL, Severity.DRAIN_NOW,
                                "double bit ECC error", "xid48", True)]))
    assert slurm.info["n01"].reason.startswith("rsc_health:now:xid48:")
    monkeypatch.setattr(cs, "_slurm", lambda ctx: slurm)
    obj = AppContext(config_path=str(_site(tmp_path, "")))
    out = CliRunner().invoke(cs.drain, ["n[00-03]", "--reason", "rack 12 PSU swap"], obj=obj)
    assert out.exit_code == 0, out.output
    assert slurm.info["n01"].reason.startswith("rsc_health:manual:over_xid48:rack 12 PSU swap")
    assert "resume asks for a qualification pass" in out.output
    assert slurm.info["n02"].reason.startswith("rsc_health:manual:manual:")
    actor.apply(decide([]), clean_sweep=True)  # the node's sweep during the maintenance
    out = CliRunner().invoke(cs.resume, ["n[00-03]"], obj=obj)
    assert slurm.info["n01"].drain_set and "qualify it" in out.output
    assert not slurm.info["n02"].drain_set
    # --force is a person's word over the repair
    assert CliRunner().invoke(cs.resume, ["n01", "--force"], obj=obj).exit_code == 0
    assert not slurm.info["n01"].drain_set


def test_drain_now_over_a_repair_drain_still_requeues_the_jobs(tmp_path, monkeypatch):
    monkeypatch.setenv("RSC_HEALTH_ROOT", str(tmp_path / "root"))
    slurm = MemorySlurm()
    slurm.add_node("n01", "ALLOCATED+DRAIN", "rsc_health:lemon:xid_cnt:xid_cnt 6 (min 3)")
    job = slurm.start_job("n01")
    monkeypatch.setattr(cs, "_slurm", lambda ctx: slurm)
    obj = AppContext(config_path=str(_site(tmp_path, "")))
    out = CliRunner().invoke(cs.drain, ["n01", "--reason", "swap", "--now", "--json"], obj=obj)
    assert out.exit_code == 0, out.output
    assert ("requeue", job) in slurm.calls
    assert slurm.info["n01"].reason.startswith("rsc_health:manual:over_xid_cnt:")


PILOT = '[actions]\nenabled = false\n[nodes."pilot*".actions]\nenabled = true\n'


def test_a_pilot_inside_a_site_in_shadow_mode_is_live_and_only_it(tmp_path, monkeypatch):
    """The other way round: the site in shadow, `[nodes."pilot*".actions] enabled = true`. The
    writers asked per node went ahead for the pilot while the door, read-only by the site's
    value, refused every write: an error each pass. The door is read-only only when no node
    may be changed; the others are refused per node."""
    cfg = load_config(_site(tmp_path, PILOT))
    assert cfg.actions_enabled("pilot01") and not cfg.actions_enabled("other01")
    assert cfg.actions_enabled_anywhere() and not load_config(
        _site(tmp_path, "[actions]\nenabled = false\n")).actions_enabled_anywhere()
    door = from_config(cfg)
    assert not door.read_only and not door.shadow_node("pilot01")
    with pytest.raises(ShadowMode, match="shadow mode for other01"):
        door.drain("other01", "rsc_health:now:xid79:gpu3")
    monkeypatch.setenv("RSC_HEALTH_ROOT", str(tmp_path / "root"))
    slurm = MemorySlurm(["pilot01", "other01"])
    monkeypatch.setattr(cs, "_slurm", lambda ctx: slurm)
    obj = AppContext(config_path=str(_site(tmp_path, PILOT)))
    assert CliRunner().invoke(cs.drain, ["pilot01", "--reason", "PSU"], obj=obj).exit_code == 0
    out = CliRunner().invoke(cs.drain, ["other01", "--reason", "PSU"], obj=obj)
    assert out.exit_code == 0 and "shadow mode" in out.output
    assert slurm.info["pilot01"].drain_set and not slurm.info["other01"].drain_set


def test_a_persons_drain_of_a_rack_with_one_shadow_node_drains_the_live_ones(tmp_path,
                                                                            monkeypatch):
    """`healthctl drain 'n[01-03]'` where only shadow02 is a pilot's shadow node: the whole
    list was left alone (the command read as shadow); now the live nodes are drained and the
    shadow one recorded as a would-drain, as `lemons --apply` does."""
    monkeypatch.setenv("RSC_HEALTH_ROOT", str(tmp_path / "root"))
    slurm = MemorySlurm(["live01", "shadow02", "live03"])
    monkeypatch.setattr(cs, "_slurm", lambda ctx: slurm)
    obj = AppContext(config_path=str(_site(tmp_path)))
    out = CliRunner().invoke(cs.drain, ["live01,shadow02,live03", "--reason", "rack 12"],
                             obj=obj)
    assert out.exit_code == 0, out.output
    assert [n for n, i in slurm.info.items() if i.drain_set] == ["live01", "live03"]
    assert "shadow02: not drained (shadow mode for shadow02" in out.output
    out = CliRunner().invoke(cs.resume, ["live01,shadow02,live03"], obj=obj)
    assert out.exit_code == 0, out.output
    assert not any(i.drain_set for i in slurm.info.values())
    assert not [c for c in slurm.calls if c[1:2] == ("shadow02",)]
