"""NHC runs as root and bash evaluates every line of nhc.conf (`TARGET || CHECK`: eval CHECK)
and sources its settings file (/etc/sysconfig/nhc) and each INCDIR/*.nhc: each of them is
something root runs, so each must pass the rule the nhc binary and the site programs pass
(durable.trust_refusal: root's, writable by no one else, on a path no one else can swap). Run
with LBNL NHC's own driver (tests/fixtures/nhc). Found by helper-128: only the binary was
judged, so a conf a user owned, a 0666 conf, or one in a directory anyone could write ran their
commands as root."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rsc_health import engine
from rsc_health.checks import site
from rsc_health.model import Level, Status
from rsc_health.policy import decide
from tests.node.site_fakes import real_nhc

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to chown to another user")

USER = 1000


def run(node, marker: Path, conf_text: str | None = None, scripts: dict[str, str] | None = None):
    nhc, conf = real_nhc(node.root, conf_text or f"* || touch {marker}\n", scripts)
    cfg = node.config
    cfg.data["site"].update({"nhc_conf": "/etc/nhc/nhc.conf", "nhc_path": "/usr/sbin/nhc"})
    return nhc, conf, cfg


def findings_of(node, cfg):
    findings = engine.run(cfg, node.root, only={"site"}, save_state=False)
    return findings, decide(findings)


def refused(findings, needle: str) -> bool:
    return [(f.status, f.component) for f in findings] == [(Status.ERROR, site.NHC)] and (
        needle in findings[0].reason and "refused" in findings[0].reason)


def test_a_trusted_conf_runs_its_lines(node, tmp_path):
    marker = tmp_path / "ran"
    _, _, cfg = run(node, marker)
    findings, verdict = findings_of(node, cfg)
    assert marker.exists()
    assert verdict.level is Level.OK, [f.reason for f in findings]


def test_an_nhc_conf_a_user_owns_is_refused_and_not_run(node, tmp_path):
    marker = tmp_path / "ran"
    _, conf, cfg = run(node, marker)
    os.chown(conf, USER, USER)
    findings, verdict = findings_of(node, cfg)
    assert not marker.exists(), "root ran a line of a conf uid 1000 owns"
    assert refused(findings, f"nhc_conf {conf}: owned by uid {USER}")
    assert verdict.level is Level.CHECKER_ERROR


def test_a_world_writable_nhc_conf_is_refused_and_not_run(node, tmp_path):
    marker = tmp_path / "ran"
    _, conf, cfg = run(node, marker)
    conf.chmod(0o666)
    findings, _ = findings_of(node, cfg)
    assert not marker.exists()
    assert refused(findings, "writable by group or others (mode 666)")


def test_an_nhc_conf_in_a_directory_anyone_can_write_is_refused(node, tmp_path):
    marker = tmp_path / "ran"
    _, conf, cfg = run(node, marker)
    conf.parent.chmod(0o777)
    findings, _ = findings_of(node, cfg)
    assert not marker.exists()
    assert refused(findings, f"{conf.parent} on its path is writable by group or others")


def test_a_missing_conf_where_anyone_could_make_one_is_refused(node, tmp_path):
    _, conf, cfg = run(node, tmp_path / "ran")
    conf.unlink()
    conf.parent.chmod(0o1777)  # sticky is no help: anyone may make the missing name
    findings, _ = findings_of(node, cfg)
    assert refused(findings, f"{conf.parent}: writable by group or others")


def test_a_check_script_a_user_owns_in_incdir_is_refused(node, tmp_path):
    marker = tmp_path / "ran"
    _, conf, cfg = run(node, marker, scripts={"site.nhc": f"touch {marker}\n"})
    script = conf.parent / "scripts" / "site.nhc"
    os.chown(script, USER, USER)
    findings, _ = findings_of(node, cfg)
    assert not marker.exists(), "root sourced a *.nhc uid 1000 owns"
    assert refused(findings, f"NHC script {script}: owned by uid {USER}")


def test_an_incdir_anyone_can_write_is_refused(node, tmp_path):
    marker = tmp_path / "ran"
    _, conf, cfg = run(node, marker)
    (conf.parent / "scripts").chmod(0o777)
    findings, _ = findings_of(node, cfg)
    assert not marker.exists()
    assert refused(findings, f"NHC INCDIR {conf.parent / 'scripts'}: writable by group")


def test_a_settings_file_others_can_write_is_refused(node, tmp_path):
    marker = tmp_path / "ran"
    _, _, cfg = run(node, marker)
    settings = node.path("etc/sysconfig/nhc")
    settings.chmod(0o646)
    findings, _ = findings_of(node, cfg)
    assert not marker.exists()
    assert refused(findings, f"NHC settings {settings}: writable by group or others")


@pytest.mark.parametrize("var", ["INCDIR", "CONFFILE", "export CONFDIR", "SYSCONFIGDIR"])
def test_a_settings_file_that_sends_nhc_elsewhere_is_refused_and_not_run(node, tmp_path, var):
    """NHC sources its settings file after the VAR=value arguments the adapter gives it, so an
    INCDIR= or CONFFILE= there (shared scripts on NFS, often an admin account's) won over the
    judged ones, and root sourced or ran files no one judged (helper-135: a *.nhc and a conf
    uid 1000 owns, both run, the node said ok). Refused: NHC is not run."""
    marker = tmp_path / "ran-as-root"
    theirs = tmp_path / "shared"
    theirs.mkdir()
    (theirs / "evil.nhc").write_text(f"touch {marker}\n")
    (theirs / "their.conf").write_text(f"* || touch {marker}\n")
    for path in (theirs, theirs / "evil.nhc", theirs / "their.conf"):
        os.chown(path, USER, USER)
    tmp_path.chmod(0o755)
    _, _, cfg = run(node, tmp_path / "conf-ran", "* || check_fs_mount_rw -f /\n")
    target = theirs / "their.conf" if var == "CONFFILE" else theirs
    with open(node.path("etc/sysconfig/nhc"), "a") as fh:
        fh.write(f"{var}={target}\n")
    findings, verdict = findings_of(node, cfg)
    assert not marker.exists(), [(f.status, f.reason) for f in findings]
    assert refused(findings, f"sets {var.split()[-1]}"), [f.reason for f in findings]
    assert verdict.level is Level.CHECKER_ERROR
