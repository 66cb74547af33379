"""A person's `healthctl drain` is that person's: another person's `drain` or `resume`
needs --force to replace or lift it, as for any drain a person set; the same person may drain
again or resume their own (helper-208)."""
from __future__ import annotations

from click.testing import CliRunner

import rsc_health.commands.slurm as cs
from rsc_health.cli import AppContext
from rsc_health.slurm.memory import MemorySlurm


def _run(tmp_path, monkeypatch, slurm, cmd, args, site=""):
    monkeypatch.setenv("RSC_HEALTH_ROOT", str(tmp_path / "root"))
    monkeypatch.delenv("RSC_HEALTH_DB", raising=False)
    cfg = tmp_path / "config.toml"
    cfg.write_text(site)
    monkeypatch.setattr(cs, "_slurm", lambda ctx: slurm)
    res = CliRunner().invoke(cmd, args, obj=AppContext(config_path=str(cfg)))
    print(res.output)
    return res


def test_a_second_persons_drain_keeps_the_first_persons_reason(tmp_path, monkeypatch):
    """Alice drained gpu042 with `healthctl drain --code rma --reason "RMA 4711, PSU on
    order, do not power on"`. Bob, on the night shift, runs `healthctl drain gpu0[40-47]
    --reason "rack 4 cabling"` for his rack work: `drain` refuses a person's drain unless
    --force ('A node a person drained or set DOWN keeps its reason unless --force'), but a
    `healthctl drain` carries our prefix, so is_ours() says it is ours and Bob's reason
    silently replaces Alice's: the RMA note (and its code) is gone from Slurm."""
    alice = "rsc_health:manual:rma:RMA 4711, PSU on order, do not power on by alice"
    slurm = MemorySlurm()
    slurm.add_node("gpu042", "IDLE+DRAIN", alice, user="alice")
    res = _run(tmp_path, monkeypatch, slurm, cs.drain, ["gpu042", "--reason", "rack 4 cabling"],
               site="")
    assert slurm.info["gpu042"].reason == alice, (
        f"a person's healthctl drain overwritten without --force: {res.output}")


def test_a_bulk_resume_leaves_another_persons_drain(tmp_path, monkeypatch):
    """Alice: `healthctl drain gpu045 --code rma --reason "GPU5 HBM errors, RMA 4711, awaiting
    swap"`. Bob finishes his rack-4 cabling and runs `healthctl resume gpu0[40-47]`: the
    docstring says a person's drain needs --force, but Alice's drain carries our prefix, is
    not a repair (manual, not over_), so Bob's resume lifts it without --force and without a
    word: a GPU awaiting RMA runs jobs again."""
    alice = "rsc_health:manual:rma:GPU5 HBM errors, RMA 4711, awaiting swap by alice"
    bob = "rsc_health:manual:manual:rack 4 cabling by bob"
    slurm = MemorySlurm()
    for i in range(40, 48):
        slurm.add_node(f"gpu0{i}", "IDLE+DRAIN", alice if i == 45 else bob,
                       user="alice" if i == 45 else "bob")
    monkeypatch.setenv("SUDO_USER", "bob")
    res = _run(tmp_path, monkeypatch, slurm, cs.resume, ["gpu0[40-47]"], site="")
    assert not slurm.info["gpu040"].drain_set  # Bob's own drains lifted
    assert slurm.info["gpu045"].drain_set, (
        f"another person's drain lifted by a bulk resume without --force: {res.output}")


ALICE = "rsc_health:manual:rma:RMA 4711, PSU on order, do not power on by alice"


def test_force_replaces_and_lifts_another_persons_drain(tmp_path, monkeypatch):
    monkeypatch.setenv("SUDO_USER", "bob")
    slurm = MemorySlurm()
    slurm.add_node("gpu042", "IDLE+DRAIN", ALICE, user="alice")
    _run(tmp_path, monkeypatch, slurm, cs.drain,
         ["gpu042", "--reason", "rack 4 cabling", "--force"])
    assert slurm.info["gpu042"].reason.endswith("rack 4 cabling by bob")
    slurm.add_node("gpu043", "IDLE+DRAIN", ALICE, user="alice")
    _run(tmp_path, monkeypatch, slurm, cs.resume, ["gpu043", "--force"])
    assert not slurm.info["gpu043"].drain_set


def test_the_same_person_drains_again_and_resumes_their_own(tmp_path, monkeypatch):
    monkeypatch.setenv("SUDO_USER", "alice")
    slurm = MemorySlurm()
    slurm.add_node("gpu042", "IDLE+DRAIN", ALICE, user="alice")
    _run(tmp_path, monkeypatch, slurm, cs.drain, ["gpu042", "--reason", "RMA 4712 instead"])
    assert slurm.info["gpu042"].reason.endswith("RMA 4712 instead by alice")
    res = _run(tmp_path, monkeypatch, slurm, cs.resume, ["gpu042"])
    assert res.exit_code == 0 and not slurm.info["gpu042"].drain_set


def test_a_long_reason_keeps_who_drained(tmp_path, monkeypatch):
    """The reason is clipped to Slurm's length in its text, not in its `by NAME`: the name
    is what tells the person's own drain from another's."""
    monkeypatch.setenv("SUDO_USER", "alice")
    slurm = MemorySlurm()
    slurm.add_node("gpu042", "IDLE")
    _run(tmp_path, monkeypatch, slurm, cs.drain, ["gpu042", "--reason", "x" * 300])
    reason = slurm.info["gpu042"].reason
    assert reason.endswith(" by alice") and len(reason) <= 120, reason
    res = _run(tmp_path, monkeypatch, slurm, cs.resume, ["gpu042"])
    assert res.exit_code == 0 and not slurm.info["gpu042"].drain_set
