"""What a root check takes as evidence must be something no unprivileged user could have
written. `[xid] sources` plain files (a kern.log) and `[dcgm] health_file` / `diag_file` were
read whoever owned them: a user who could write one (the file, a directory above it, or a
symlink planted on its path) drained the fleet with one forged "kernel: NVRM: Xid ... 79" line,
or kept a failing node in service with a forged healthy DCGM verdict. They now follow the rule
the site config follows (durable.trust_refusal): refused loudly, as the family's checker error,
and nothing consumed (the XID is judged once the file is fixed). Ubuntu and DGX OS keep
kern.log as syslog:adm in a root:syslog 0775 /var/log: `[xid] log_writers` names the logging
daemon's user and group, trusted beside root."""

from __future__ import annotations

import grp
import os
import pwd

import pytest

from rsc_health.engine import run
from rsc_health.model import Level, Status
from rsc_health.policy import decide

KERN_LOG = "var/log/kern.log"
XID79 = ("Nov 27 10:00:00 gpu042 kernel: NVRM: Xid (PCI:0000:1b:00): 79, pid=1234, "
         "name=python3, GPU has fallen off the bus.\n")


def _file_source(node, **xid):
    cfg = node.config
    cfg.data["xid"].update(sources=["/" + KERN_LOG], **xid)
    return cfg


def _errors(findings) -> list[str]:
    return [f.reason for f in findings if f.status is Status.ERROR]


def _kern_log(node, how: str):
    node.write(KERN_LOG, XID79)
    log = node.path(KERN_LOG)
    log.chmod(0o640)
    log.parent.chmod(0o755)
    if how == "others_may_write":
        log.chmod(0o666)
    elif how == "owned_by_someone_else":
        os.chown(log, 65534, 65534)
    elif how == "directory_others_may_write":
        log.parent.chmod(0o777)
    elif how == "symlink_into_a_users_directory":
        users = node.path("home/alice")
        users.mkdir(parents=True)
        os.chown(users, 65534, 65534)
        (users / "kern.log").write_text(XID79)
        log.unlink()
        log.symlink_to(users / "kern.log")
    return log


def _mend(node, how: str) -> None:
    log = node.path(KERN_LOG)
    if how == "symlink_into_a_users_directory":
        log.unlink()
        log.write_text(XID79)
    os.chown(log, 0, 0) if os.geteuid() == 0 else None
    log.chmod(0o640)
    log.parent.chmod(0o755)


HOW = ["others_may_write", "owned_by_someone_else", "directory_others_may_write",
       "symlink_into_a_users_directory"]


@pytest.mark.parametrize("how", HOW)
def test_a_kern_log_others_could_write_is_refused_loudly_and_consumes_nothing(node, how):
    if os.geteuid() != 0 and how in ("owned_by_someone_else", "symlink_into_a_users_directory"):
        pytest.skip("chown needs root")
    _kern_log(node, how)
    cfg = _file_source(node)
    findings = run(cfg, node.root, only={"xid"})
    assert decide(findings).level is Level.CHECKER_ERROR, [f.reason for f in findings]
    assert not [f for f in findings if f.code == "xid79"]
    assert any("refused" in e and "kern.log" in e for e in _errors(findings))
    _mend(node, how)
    findings = run(cfg, node.root, only={"xid"})
    assert [f.code for f in findings if f.family == "xid" and f.status is not Status.OK] \
        == ["xid79"]
    assert decide(findings).level is Level.DRAIN_NOW


def test_an_sxid_source_others_could_write_is_refused_too(node):
    node.write(KERN_LOG, "Nov 27 10:00:00 gpu042 kernel: nvidia-nvswitch0: SXid "
               "(PCI:0000:c2:00.0): 20034, Fatal, Link 28 LTSSM Fault Up\n")
    node.path(KERN_LOG).chmod(0o666)
    findings = run(_file_source(node), node.root, only={"sxid"})
    assert not [f for f in findings if f.code == "sxid20034"]
    assert any("refused" in e for e in _errors(findings))


def test_the_logging_daemons_own_group_may_write_var_log(node):
    """Ubuntu / DGX OS: /var/log is root:syslog 0775 and kern.log syslog:adm 0640. With the
    daemon named in [xid] log_writers that layout is evidence; without, it is refused."""
    log = _kern_log(node, "ok")
    group = grp.getgrgid(os.getegid()).gr_name if os.geteuid() != 0 else "adm"
    gid = grp.getgrnam(group).gr_gid
    os.chown(log.parent, os.geteuid(), gid)
    log.parent.chmod(0o775)
    refused = run(_file_source(node, log_writers=[]), node.root, only={"xid"})
    assert any("refused" in e for e in _errors(refused))
    judged = run(_file_source(node, log_writers=[group]), node.root, only={"xid"})
    assert decide(judged).level is Level.DRAIN_NOW and _errors(judged) == []


def test_a_kern_log_owned_by_the_logging_daemons_user_is_evidence(node):
    if os.geteuid() != 0:
        pytest.skip("chown needs root")
    daemon = next((p for p in pwd.getpwall() if 0 < p.pw_uid < 1000), None)
    if daemon is None:
        pytest.skip("no system account here")
    log = _kern_log(node, "ok")
    os.chown(log, daemon.pw_uid, 0)
    refused = run(_file_source(node, log_writers=[]), node.root, only={"xid"})
    assert any("refused" in e for e in _errors(refused))
    judged = run(_file_source(node, log_writers=[daemon.pw_name]), node.root, only={"xid"})
    assert decide(judged).level is Level.DRAIN_NOW and _errors(judged) == []


def _dcgm(node, **dcgm):
    cfg = node.config
    cfg.data["dcgm"].update(dcgm)
    return run(cfg, node.root, only={"dcgm"})


def test_a_saved_dcgm_verdict_others_could_write_is_refused(node):
    """A forged `"Overall Health": {"value": "Healthy"}` in a world-writable health_file hid a
    failing node; now the file is refused as dcgmi would be, a checker error."""
    from rsc_health.sim.qualify_tools import dcgm_health

    node.write("saved/health.json", dcgm_health([
        ("GPU", 1, "Memory system", "Failure", "A volatile double-bit ECC error has occurred")]))
    assert decide(_dcgm(node, health_file="/saved/health.json")).level is Level.DRAIN_AFTER_JOB
    node.path("saved/health.json").chmod(0o666)
    findings = _dcgm(node, health_file="/saved/health.json")
    assert decide(findings).level is Level.CHECKER_ERROR
    assert any("refused" in e for e in _errors(findings))
    node.path("saved/health.json").chmod(0o644)
    node.path("saved").chmod(0o777)
    findings = _dcgm(node, diag_file="/saved/health.json")
    assert any("refused" in e for e in _errors(findings))


def test_the_log_writers_are_looked_up_only_when_a_source_asks_for_them(node, monkeypatch):
    """A healthy node's kernel log (root's, on root's directories) never asks who the logging
    daemon is: no pwd/grp lookup (NSS reading /etc/passwd and /etc/group) on a job start. A
    group-writable /var/log does ask, and then gets the same answer as before."""
    from rsc_health.collect import kmsg

    asked: list[str] = []
    real_user, real_group = pwd.getpwnam, grp.getgrnam
    monkeypatch.setattr(pwd, "getpwnam", lambda n: asked.append(n) or real_user(n))
    monkeypatch.setattr(grp, "getgrnam", lambda n: asked.append(n) or real_group(n))
    uids, gids = kmsg.log_writers(["syslog", "adm"])
    read = kmsg.read_new_events(node.root, ["/dev/kmsg"], {}, writers=(uids, gids))
    assert read.errors == [] and asked == []
    assert 0 not in uids or 0 in {p.pw_uid for p in pwd.getpwall() if p.pw_name in (
        "syslog", "adm")}  # asked now: the same ids a lookup gives
    assert asked == ["syslog", "adm"]
    expect = {g.gr_gid for g in grp.getgrall() if g.gr_name in ("syslog", "adm")}
    assert all(gid in gids for gid in expect) and (12345678 in gids) is False
