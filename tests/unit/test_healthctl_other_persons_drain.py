"""A person's `healthctl drain` is that person's: another person's `drain` or `resume`
needs --force to replace or lift it, as for any drain a person set; the same person may drain
again or resume their own (helper-208)."""
from __future__ import annotations

import os

import rsc_health.commands
import rsc_health.commands.slurm as cs
from rsc_health.slurm.memory import MemorySlurm
from tests.unit.conftest import run_slurm_command

_run = run_slurm_command


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


def _as(monkeypatch, login, sudo_user):
    """A shell of `login`'s session (its audit login) that became root (`sudo -i`, `su -`)
    and runs healthctl there, maybe with a habitual `sudo` in front (SUDO_USER=root then).
    raising=False: on a tree from before audit_login, the patch is a no-op and the test
    fails on what it asserts."""
    monkeypatch.setattr(rsc_health.commands, "audit_login", lambda: login, raising=False)
    for var in ("LOGNAME", "USER"):
        monkeypatch.setenv(var, "root")
    if sudo_user is None:
        monkeypatch.delenv("SUDO_USER", raising=False)
    else:
        monkeypatch.setenv("SUDO_USER", sudo_user)


def test_a_drain_from_a_root_shell_is_the_login_persons(tmp_path, monkeypatch):
    """Alice, in her `sudo -i` root shell, runs `sudo healthctl drain gpu045 --reason "RMA
    4711"` (SUDO_USER=root there): the drain said `by root`. Bob, in his own root shell, ran
    `sudo healthctl resume gpu045`: he was `root` too, so Alice's RMA drain counted as his
    own and was lifted without --force (helper-209). The person is the audit login."""
    slurm = MemorySlurm()
    slurm.add_node("gpu045", "IDLE")
    _as(monkeypatch, "alice", "root")
    _run(tmp_path, monkeypatch, slurm, cs.drain, ["gpu045", "--reason", "RMA 4711 awaiting swap"])
    assert slurm.info["gpu045"].reason.endswith("by alice")
    _as(monkeypatch, "bob", "root")
    _run(tmp_path, monkeypatch, slurm, cs.resume, ["gpu045"])
    assert slurm.info["gpu045"].drain_set, (
        f"another person's drain lifted without --force: {slurm.info['gpu045'].reason!r}")


def test_su_to_root_still_resumes_ones_own_drain(tmp_path, monkeypatch):
    """Alice drains with `sudo healthctl drain` (by alice), later resumes from an `su -` shell
    (SUDO_USER unset, LOGNAME=USER=root): she was `root`, her own drain "another person's",
    and resume refused without --force (helper-209)."""
    slurm = MemorySlurm()
    slurm.add_node("gpu042", "IDLE")
    _as(monkeypatch, "alice", "alice")
    _run(tmp_path, monkeypatch, slurm, cs.drain, ["gpu042", "--reason", "reseat DIMM"])
    assert slurm.info["gpu042"].reason.endswith("by alice")
    _as(monkeypatch, "alice", None)
    res = _run(tmp_path, monkeypatch, slurm, cs.resume, ["gpu042"])
    assert not slurm.info["gpu042"].drain_set, f"own drain refused: {res.output}"


def test_the_audit_login_is_read_from_the_kernel_and_unset_is_none(tmp_path, monkeypatch):
    """/proc/self/loginuid: a uid mapped to its name; 4294967295 ((uid_t)-1) is no login,
    and then SUDO_USER, then the login name, says who."""
    import pwd

    from rsc_health import commands

    monkeypatch.undo()  # the real audit_login, not conftest's stand-in
    me = pwd.getpwuid(os.getuid()).pw_name
    file = tmp_path / "loginuid"
    monkeypatch.setattr(commands, "LOGINUID_FILE", str(file))
    file.write_text(str(os.getuid()))
    monkeypatch.setenv("SUDO_USER", "someone-else")
    assert commands.audit_login() == me and commands.invoking_person() == me
    file.write_text("4294967295")
    assert commands.audit_login() is None
    assert commands.invoking_person() == "someone-else"
    monkeypatch.delenv("SUDO_USER")
    monkeypatch.setenv("LOGNAME", "carol")
    assert commands.invoking_person() == "carol"
