"""A site check runs as root: nobody else may be able to swap the file between the moment it
is judged and the moment it runs, through any directory on its path (issue 21)."""

from __future__ import annotations

import os
from pathlib import Path

from rsc_health import engine
from rsc_health.collect import procs
from rsc_health.model import Level, Status
from rsc_health.policy import decide
from tests.node.site_fakes import program


def run_site(node, checks_dir: str):
    cfg = node.config
    cfg.data["site"].update({"checks_dir": checks_dir})
    findings = engine.run(cfg, node.root, only={"site"}, save_state=False)
    return findings, decide(findings)


def _marking(marker: Path) -> str:
    return f"#!/bin/sh\ntouch {marker}\necho 'warn warn fan0 fan_slow slow'\n"


def test_a_root_owned_check_under_a_directory_others_can_write_is_refused(node, tmp_path):
    """/etc/rsc_health mode 0777 above a root-owned site.d: anyone could rename site.d away and
    put their own in its place between the check and the exec. It ran on main."""
    marker = tmp_path / "ran"
    program(node.path("etc/rsc_health/site.d"), "fan", _marking(marker))
    node.path("etc/rsc_health").chmod(0o777)
    findings, verdict = run_site(node, "/etc/rsc_health/site.d")
    assert not marker.exists()
    assert [(f.status, f.component) for f in findings] == [
        (Status.ERROR, str(node.path("etc/rsc_health/site.d")))]
    reason = findings[0].reason
    assert f"{node.path('etc/rsc_health')} on its path is writable by group or others" in reason
    assert "(mode 777); refused" in reason and "\n" not in reason
    assert verdict.level is Level.CHECKER_ERROR


def test_a_symlink_to_a_program_in_a_directory_others_can_write_is_refused(node, tmp_path):
    marker = tmp_path / "ran"
    shared = tmp_path / "shared"
    target = program(shared / "bin", "fan", _marking(marker))
    shared.chmod(0o777)
    node.path("etc/rsc_health/site.d").mkdir(parents=True)
    node.path("etc/rsc_health/site.d/fan").symlink_to(target)
    findings, verdict = run_site(node, "/etc/rsc_health/site.d")
    assert not marker.exists()
    assert [(f.status, f.component) for f in findings] == [(Status.ERROR, "fan")]
    assert f"{shared} on its path is writable by group or others" in findings[0].reason
    assert verdict.level is Level.CHECKER_ERROR


def test_a_symlinked_checks_dir_whose_link_others_can_replace_is_refused(node, tmp_path):
    """site.d a symlink, kept in a directory anyone can write: the link can be pointed at
    another directory, though everything it points at now is root's."""
    marker = tmp_path / "ran"
    program(tmp_path / "opt" / "site.d", "fan", _marking(marker))
    node.path("etc/rsc_health").mkdir(parents=True)
    node.path("etc/rsc_health/site.d").symlink_to(tmp_path / "opt" / "site.d")
    node.path("etc/rsc_health").chmod(0o777)
    findings, verdict = run_site(node, "/etc/rsc_health/site.d")
    assert not marker.exists()
    assert len(findings) == 1 and findings[0].status is Status.ERROR
    assert f"{node.path('etc/rsc_health')} on its path is writable" in findings[0].reason
    assert verdict.level is Level.CHECKER_ERROR


def test_a_root_owned_sticky_directory_on_the_path_is_fine(node, tmp_path):
    """/tmp: others may create names in it but never rename or remove root's."""
    marker = tmp_path / "ran"
    program(node.path("sticky/site.d"), "fan", _marking(marker))
    node.path("sticky").chmod(0o1777)
    _, verdict = run_site(node, "/sticky/site.d")
    assert marker.exists() and verdict.level is Level.WARN


def test_the_program_judged_is_the_program_run(node, tmp_path, monkeypatch):
    """Swapped for another file after it was judged and before it is started (the window a
    directory someone else can write opens): the judged file still runs, from its descriptor."""
    good, evil = tmp_path / "good", tmp_path / "evil"
    checks = node.path("etc/rsc_health/site.d")
    program(checks, "fan", f"#!/bin/sh\ntouch {good}\necho 'ok none fan0 fan_ok fine'\n")
    swap = program(tmp_path / "planted", "fan", f"#!/bin/sh\ntouch {evil}\n")
    real_run_all = procs.run_all

    def swapped_then_run(*args, **kw):
        os.replace(swap, checks / "fan")
        return real_run_all(*args, **kw)

    monkeypatch.setattr(procs, "run_all", swapped_then_run)
    findings, verdict = run_site(node, "/etc/rsc_health/site.d")
    assert good.exists() and not evil.exists()
    assert verdict.level is Level.OK, findings


def test_checks_find_their_helpers_through_rsc_health_checks_dir(node):
    """Run from a descriptor, a script's $0 is /proc/self/fd/N: the directory is in the env."""
    checks = node.path("etc/rsc_health/site.d")
    (checks / "lib").mkdir(parents=True)
    (checks / "lib/say.sh").write_text("say() { echo \"warn warn $1 helper_used $1\"; }\n")
    program(checks, "fan", '#!/bin/sh\n. "$RSC_HEALTH_CHECKS_DIR/lib/say.sh"\nsay fan0\n')
    findings, verdict = run_site(node, "/etc/rsc_health/site.d")
    assert [(f.component, f.code) for f in findings] == [("fan0", "helper_used")]
    assert verdict.level is Level.WARN


def test_nhc_under_a_directory_others_can_write_is_refused(node):
    from tests.node.site_fakes import fake_nhc

    fake_nhc(node.root, "fail")
    node.path("usr/sbin").chmod(0o777)
    cfg = node.config
    cfg.data["site"].update({"nhc_conf": "/etc/nhc/nhc.conf", "nhc_path": "/usr/sbin/nhc"})
    findings = engine.run(cfg, node.root, only={"site"}, save_state=False)
    assert [(f.status, f.component) for f in findings] == [(Status.ERROR, "[nhc]")]
    assert f"{node.path('usr/sbin')} on its path is writable by group" in findings[0].reason
    assert decide(findings).level is Level.CHECKER_ERROR
