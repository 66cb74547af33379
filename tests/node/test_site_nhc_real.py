"""The adapter against LBNL NHC's own driver (tests/fixtures/nhc, mej/nhc 9c4a38c): every way a
check fails on a bad node that NHC as HealthCheckProgram drains for must be a fail finding, never
a silent pass nor a checker error (which never drains). Found by helper-128: the adapter passed
`-a`, under which NHC says nothing of a check that fails without `die` (`* || /bin/false`, a
function returning 1, a function no script defines) and exits 0; and a check written as NHC's
README shows (`die 1 "Stuff is not working"`, no `$FUNCNAME:`) was an nhc_error."""

from __future__ import annotations

from rsc_health import engine
from rsc_health.model import Level, Status
from rsc_health.policy import decide
from tests.node.site_fakes import real_nhc

# Check functions as sites write them in /etc/nhc/scripts/site.nhc.
SITE_NHC = """\
function check_stuff_works() {
    die 1 "Stuff is not working"
    return 1
}
function check_returns_only() {
    return 1
}
function check_passes() {
    return 0
}
"""


def run(node, conf_text: str):
    real_nhc(node.root, conf_text, {"site.nhc": SITE_NHC})
    cfg = node.config
    cfg.data["site"].update({"nhc_conf": "/etc/nhc/nhc.conf", "nhc_path": "/usr/sbin/nhc"})
    findings = engine.run(cfg, node.root, only={"site"}, save_state=False)
    return [(f.status, f.component, f.code, f.reason) for f in findings], decide(findings)


def test_a_function_named_failure_from_nhcs_own_check_drains(node):
    # A directory that is there but not a mount point: for a missing one NHC's check makes it
    # (`mkdir -p`, as root, on the real /) and says "auto-fixed", and the test's first run on
    # a fresh machine saw another message than every later run.
    scratch = node.root / "scratch"
    scratch.mkdir()
    seen, verdict = run(node, f"* || check_fs_mount_rw {scratch}\n")
    assert seen == [(Status.FAIL, "check_fs_mount", "check_fs_mount",
                     f"check_fs_mount: {scratch} not mounted")]
    assert verdict.level is Level.DRAIN_AFTER_JOB


def test_a_check_written_as_nhcs_readme_shows_drains(node):
    seen, verdict = run(node, "* || check_stuff_works\n")
    assert seen == [(Status.FAIL, "nhc", "nhc_check", "Stuff is not working")]
    assert verdict.level is Level.DRAIN_AFTER_JOB


def test_a_failing_command_in_nhc_conf_drains(node):
    seen, verdict = run(node, "* || check_passes\n* || /bin/false\n")
    assert seen == [(Status.FAIL, "/bin/false", "nhc_check", "Check /bin/false returned 1")]
    assert verdict.level is Level.DRAIN_AFTER_JOB


def test_a_check_function_returning_failure_without_die_drains(node):
    seen, verdict = run(node, "* || check_returns_only\n")
    assert seen == [(Status.FAIL, "check_returns_only", "check_returns_only",
                     "Check check_returns_only returned 1")]
    assert verdict.level is Level.DRAIN_AFTER_JOB


def test_a_check_no_script_defines_drains(node):
    seen, verdict = run(node, "* || check_typo_in_conf -f /scratch\n")
    assert seen == [(Status.FAIL, "check_typo_in_conf", "check_typo_in_conf",
                     "Check check_typo_in_conf -f /scratch returned 127")]
    assert verdict.level is Level.DRAIN_AFTER_JOB


def test_passing_checks_are_one_ok_finding(node):
    seen, verdict = run(node, "* || check_passes\n* || /bin/true\n")
    assert [s[:2] for s in seen] == [(Status.OK, "[nhc]")]
    assert verdict.level is Level.OK


def test_a_settings_file_asking_for_every_check_is_a_checker_error_and_still_runs(node):
    real_nhc(node.root, "* || check_stuff_works\n", {"site.nhc": SITE_NHC})
    settings = node.path("etc/sysconfig/nhc")
    settings.write_text(settings.read_text() + "NHC_CHECK_ALL=1\n")
    cfg = node.config
    cfg.data["site"].update({"nhc_conf": "/etc/nhc/nhc.conf", "nhc_path": "/usr/sbin/nhc"})
    findings = engine.run(cfg, node.root, only={"site"}, save_state=False)
    assert sorted((f.status.value, f.code) for f in findings) == [
        ("error", "nhc_conf"), ("fail", "nhc_check")]
    error = next(f for f in findings if f.status is Status.ERROR)
    assert f"{settings} sets 'NHC_CHECK_ALL=1'" in error.reason


def test_a_settings_file_with_a_watchdog_of_its_own_is_a_checker_error_and_still_runs(node):
    """TIMEOUT= in NHC's settings file wins over the adapter's -t 0: NHC then starts a watchdog
    in a process group of its own, which outlived a hung NHC the site family killed by that
    many seconds and then signalled NHC's old pid (helper-135). Said; NHC still runs. A
    TIMEOUT of 0 (no watchdog of NHC's) is not."""
    real_nhc(node.root, "* || check_stuff_works\n", {"site.nhc": SITE_NHC})
    settings = node.path("etc/sysconfig/nhc")
    kept = settings.read_text()
    cfg = node.config
    cfg.data["site"].update({"nhc_conf": "/etc/nhc/nhc.conf", "nhc_path": "/usr/sbin/nhc"})
    settings.write_text(kept + 'TIMEOUT="0"\n')
    findings = engine.run(cfg, node.root, only={"site"}, save_state=False)
    assert [(f.status.value, f.code) for f in findings] == [("fail", "nhc_check")]
    settings.write_text(kept + "export TIMEOUT=30\n")
    findings = engine.run(cfg, node.root, only={"site"}, save_state=False)
    assert sorted((f.status.value, f.code) for f in findings) == [
        ("error", "nhc_conf"), ("fail", "nhc_check")]
    error = next(f for f in findings if f.status is Status.ERROR)
    assert f"{settings} sets 'export TIMEOUT=30'" in error.reason
