"""Site checks (issue 14 point 4): a site's own programs, and its NHC, become findings that go
through the same policy, spool and reasons as the built-in families; whatever such a program
does wrong (garbage, binary, a hang, a crash, silence with a non-zero exit, too much output, a
file that cannot or must not be run) is one checker finding naming it, never a drain and never
a hang of the prolog."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rsc_health import engine, nodepath
from rsc_health.checks import site
from rsc_health.config import ConfigError, load_config
from rsc_health.model import Level, Severity, Status
from rsc_health.policy import decide
from tests.fixtures.nodes.node_copy import NODE_STATE
from tests.node.site_fakes import fake_nhc, gone, program

CHECKS_DIR = "etc/rsc_health/site.d"


def run_site(node, budget_s: float | None = None, **site_cfg):
    cfg = node.config
    cfg.data["site"].update({"checks_dir": "/" + CHECKS_DIR, **site_cfg})
    findings = engine.run(cfg, node.root, only={"site"}, save_state=False, budget_s=budget_s)
    return findings, decide(findings)


def checks_dir(node) -> Path:
    return node.path(CHECKS_DIR)


def errors(findings):
    return [f for f in findings if f.status is Status.ERROR]


# ---- the line format ----------------------------------------------------------------------------
@pytest.mark.parametrize("line, status, severity", [
    ("ok none /scratch scratch_ok mounted", Status.OK, Severity.NONE),
    ("warn warn gpu0 fan_slow fan at 40%", Status.WARN, Severity.WARN),
    ("fail drain_after_job /scratch scratch_missing not mounted", Status.FAIL,
     Severity.DRAIN_AFTER_JOB),
    ("FAIL drain-now gpu3 burn_failed gpu-burn found errors", Status.FAIL, Severity.DRAIN_NOW),
])
def test_a_well_formed_line_is_a_site_finding_with_that_status_and_severity(line, status,
                                                                           severity):
    finding = site.parse_line("mycheck", line)
    assert (finding.family, finding.status, finding.severity) == ("site", status, severity)
    assert finding.data == {"check": "mycheck"}
    assert finding.reason == line.split(None, 4)[4]


@pytest.mark.parametrize("line", [
    "ok drain_now /scratch x y",          # ok cannot drain
    "warn drain_after_job gpu0 x y",      # a warning cannot drain
    "fail none gpu0 x y",                 # a failure must say what it asks for
    "fail warn gpu0 x y",
    "error drain_now gpu0 x y",           # the checker's own trouble never drains
    "broken none gpu0 x y",               # unknown status
    "fail sometimes gpu0 x y",            # unknown severity
    "fail drain_now gpu0",                # too few fields
    "fail drain_now gpu0 bad:code y",     # code with a separator of the Slurm reason
    "fail drain_now gpu0 x \x1b[31mred",  # terminal escapes: not a finding
])
def test_a_line_that_breaks_the_format_is_not_a_finding(line):
    assert site.parse_line("mycheck", line) is None


def test_an_error_line_is_a_checker_finding_that_never_drains():
    finding = site.parse_line("ib", "error none mlx5_0 ibstat_missing ibstat not installed")
    assert (finding.family, finding.status, finding.severity) == ("checker", Status.ERROR,
                                                                  Severity.NONE)
    assert decide([finding]).level is Level.CHECKER_ERROR


# ---- running programs ---------------------------------------------------------------------------
def test_no_checks_dir_spawns_nothing(node, monkeypatch):
    def no_spawn(*a, **k):
        raise AssertionError("a process was started with the site family off")

    monkeypatch.setattr(subprocess, "Popen", no_spawn)
    findings = engine.run(node.config, node.root, save_state=False)  # every family
    assert not [f for f in findings if f.family == "site" or "site" in f.code]
    assert decide(findings).level is Level.OK


def test_a_failing_check_drains_with_its_own_reason(node):
    program(checks_dir(node), "scratch", "#!/bin/sh\n"
            "echo 'fail drain_after_job /scratch scratch_missing /scratch is not mounted'\n"
            "echo 'ok none /home home_ok mounted'\n")
    findings, verdict = run_site(node)
    assert verdict.level is Level.DRAIN_AFTER_JOB
    assert verdict.reason == "rsc_health:job:scratch_missing:/scratch is not mounted"
    assert not errors(findings)


def test_a_silent_successful_check_is_one_ok_finding(node):
    program(checks_dir(node), "quiet", "#!/bin/sh\nexit 0\n")
    findings, verdict = run_site(node)
    assert [(f.family, f.component, f.status) for f in findings] == [("site", "quiet",
                                                                      Status.OK)]
    assert verdict.level is Level.OK


def test_garbage_lines_are_one_checker_error_naming_the_check_and_the_line(node):
    program(checks_dir(node), "chatty", "#!/bin/sh\n"
            "echo '# a comment is fine'\n"
            "echo 'ok none a a_ok fine'\n"
            "echo 'checking GPUs...'\n"
            "echo 'all good!'\n")
    findings, verdict = run_site(node)
    errs = errors(findings)
    assert len(errs) == 1
    assert "chatty" in errs[0].reason and "line 3" in errs[0].reason
    assert "1 more" in errs[0].reason
    assert verdict.level is Level.CHECKER_ERROR  # loud, not a drain


def test_latin1_output_is_read_as_latin1_and_binary_output_is_garbage(node):
    latin1 = "fail drain_after_job sensor0 temp_high Température 95°C\n".encode("latin-1")
    program(checks_dir(node), "sensors", b"#!/bin/sh\nprintf '" + latin1.replace(b"\n", b"\\n")
            + b"'\nprintf '\\000\\377\\376\\001\\n'\n")
    findings, verdict = run_site(node)
    fail = next(f for f in findings if f.status is Status.FAIL)
    assert fail.reason == "Température 95°C"
    assert verdict.level is Level.DRAIN_AFTER_JOB
    assert len(errors(findings)) == 1 and "line 2" in errors(findings)[0].reason


def test_a_hanging_check_is_killed_with_its_process_group(node, tmp_path):
    pidfile = tmp_path / "child.pid"
    program(checks_dir(node), "hang", f"#!/bin/sh\nsleep 300 &\necho $! > {pidfile}\nwait\n")
    program(checks_dir(node), "fine", "#!/bin/sh\necho 'ok none x x_ok fine'\n")
    started = time.monotonic()
    findings, verdict = run_site(node, timeout_s=0.5)
    assert time.monotonic() - started < 3
    errs = errors(findings)
    assert len(errs) == 1 and "hang" in errs[0].reason and "killed" in errs[0].reason
    assert any(f.component == "x" and f.status is Status.OK for f in findings)  # others ran
    assert verdict.level is Level.CHECKER_ERROR
    child = int(pidfile.read_text())
    deadline = time.monotonic() + 2
    while not gone(child) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert gone(child)


def test_with_no_time_left_in_the_budget_nothing_is_started(node, monkeypatch):
    program(checks_dir(node), "fine", "#!/bin/sh\necho 'ok none x x_ok fine'\n")

    def no_spawn(*a, **k):
        raise AssertionError("started with no time left")

    monkeypatch.setattr(subprocess, "Popen", no_spawn)
    findings, verdict = run_site(node, budget_s=0.05)
    site_errors = [f for f in errors(findings) if f.component == "fine"]
    assert [f.reason for f in site_errors] == [
        "site check fine: no time left in the stage's budget to run it"]


def test_a_child_left_running_by_a_finished_check_is_not_waited_for_nor_killed(node,
                                                                                 tmp_path):
    pidfile = tmp_path / "child.pid"
    program(checks_dir(node), "remount", "#!/bin/sh\n"
            f"sleep 30 &\necho $! > {pidfile}\necho 'ok none /scratch scratch_ok remounted'\n")
    started = time.monotonic()
    findings, verdict = run_site(node, timeout_s=10)
    child = int(pidfile.read_text())
    try:
        assert time.monotonic() - started < 3  # not the 10 s timeout
        assert verdict.level is Level.OK and not errors(findings)
        assert not gone(child)  # a remount or restart the check started is its business
    finally:
        os.kill(child, 9)


def test_the_stage_budget_caps_a_long_timeout(node):
    program(checks_dir(node), "hang", "#!/bin/sh\nexec sleep 300\n")
    started = time.monotonic()
    findings, _ = run_site(node, budget_s=1.0, timeout_s=60)
    assert time.monotonic() - started < 2.5
    assert any("still running" in f.reason for f in errors(findings))


@pytest.mark.parametrize("body, expect", [
    ("#!/bin/sh\necho oops >&2\nexit 3\n", "exited 3 without a warn or fail line: oops"),
    ("#!/bin/sh\nkill -9 $$\n", "killed by signal 9"),
])
def test_a_check_that_fails_without_saying_what_is_a_checker_error(node, body, expect):
    program(checks_dir(node), "broken", body)
    findings, verdict = run_site(node)
    assert [f.reason for f in findings] == [f"site check broken: {expect}"]
    assert verdict.level is Level.CHECKER_ERROR


def test_a_non_zero_exit_with_a_fail_line_is_that_failure(node):
    program(checks_dir(node), "nhc_style", "#!/bin/sh\n"
            "echo 'fail drain_now gpu2 burn_errors gpu-burn saw errors'\nexit 1\n")
    findings, verdict = run_site(node)
    assert verdict.level is Level.DRAIN_NOW and not errors(findings)


def test_endless_output_is_cut_at_max_output_bytes(node):
    program(checks_dir(node), "yes", "#!/bin/sh\nexec yes 'ok none c c_ok fine'\n")
    started = time.monotonic()
    findings, _ = run_site(node, max_output_bytes=1024, timeout_s=5)
    assert time.monotonic() - started < 3  # stopped by the cut, not by the timeout
    assert [f.reason for f in errors(findings)] == [
        "site check yes: printed more than max_output_bytes; the rest was not read"]
    assert 1 <= len([f for f in findings if f.status is Status.OK]) <= 1024 // 20


def test_lines_past_max_lines_are_ignored_and_said(node):
    program(checks_dir(node), "many", "#!/bin/sh\n"
            "for i in $(seq 1 50); do echo \"ok none c$i c_ok fine\"; done\n")
    findings, _ = run_site(node, max_lines=10)
    assert len([f for f in findings if f.status is Status.OK]) == 10
    assert [f.reason for f in errors(findings)] == [
        "site check many: 40 lines past max_lines=10 ignored"]


def test_a_long_line_is_cut_not_dropped(node):
    program(checks_dir(node), "long", "#!/bin/sh\n"
            f"echo 'fail drain_after_job disk0 disk_slow {'x' * 5000}'\n")
    findings, verdict = run_site(node)
    assert verdict.level is Level.DRAIN_AFTER_JOB
    assert len(findings[0].reason) == site.REASON_MAX


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _broken_link(path: Path) -> None:
    os.symlink(path.parent / "nowhere", path)


@pytest.mark.parametrize("make, expect", [
    (lambda p: program(p.parent, p.name, "#!/bin/sh\necho hi\n", 0o644), "not executable"),
    (_fifo, "not a regular file (a FIFO)"),
    (_broken_link, "broken symlink"),
    (lambda p: program(p.parent, p.name, "echo no interpreter line\n"), "Exec format error"),
    (lambda p: program(p.parent, p.name, "#!/bin/sh\necho hi\n", 0o777), "writable by group"),
])
def test_an_entry_that_cannot_or_must_not_run_is_a_checker_error_naming_it(node, make, expect):
    checks_dir(node).mkdir(parents=True)
    make(checks_dir(node) / "entry")
    started = time.monotonic()
    findings, verdict = run_site(node)
    assert time.monotonic() - started < 3  # a FIFO is never opened
    assert len(findings) == 1 and findings[0].component == "entry"
    assert expect in findings[0].reason
    assert verdict.level is Level.CHECKER_ERROR


def test_directories_and_dotfiles_in_the_checks_dir_are_not_run(node):
    (checks_dir(node) / "lib").mkdir(parents=True)
    program(checks_dir(node), ".disabled", "#!/bin/sh\necho 'fail drain_now a b c'\n")
    program(checks_dir(node), "real", "#!/bin/sh\necho 'ok none a a_ok fine'\n")
    findings, verdict = run_site(node)
    assert [(f.component, f.status) for f in findings] == [("a", Status.OK)]
    assert verdict.level is Level.OK


def test_a_missing_checks_dir_is_a_checker_error(node):
    findings, verdict = run_site(node)
    assert len(findings) == 1 and "No such file" in findings[0].reason
    assert verdict.level is Level.CHECKER_ERROR


def test_a_symlink_to_an_executable_runs(node, tmp_path):
    target = program(tmp_path / "bin", "real", "#!/bin/sh\necho 'warn warn fan0 fan_slow slow'\n")
    checks_dir(node).mkdir(parents=True)
    (checks_dir(node) / "fan").symlink_to(target)
    _, verdict = run_site(node)
    assert verdict.level is Level.WARN


def test_site_keys_are_typed(tmp_path):
    bad = tmp_path / "site.toml"
    bad.write_text('[site]\nnhc_severity = "sometimes"\n')
    with pytest.raises(ConfigError, match="nhc_severity"):
        load_config(bad)
    bad.write_text("[site]\ntimeout_s = 0\n")
    with pytest.raises(ConfigError, match="timeout_s"):
        load_config(bad)


# ---- the NHC adapter ----------------------------------------------------------------------------
def run_nhc(node, mode: str, **site_cfg):
    nhc, conf = fake_nhc(node.root, mode)
    cfg = node.config
    cfg.data["site"].update({"nhc_conf": "/etc/nhc/nhc.conf", "nhc_path": "/usr/sbin/nhc",
                             **site_cfg})
    findings = engine.run(cfg, node.root, only={"site"}, save_state=False)
    return findings, decide(findings), conf


def test_a_failed_nhc_check_is_one_finding_named_after_its_function(node):
    findings, verdict, conf = run_nhc(node, "fail")
    assert [(f.status, f.component, f.code, f.reason) for f in findings] == [
        (Status.FAIL, "check_fs_mount", "check_fs_mount", "check_fs_mount: /scratch not mounted")]
    assert findings[0].severity is Severity.DRAIN_AFTER_JOB
    assert verdict.level is Level.DRAIN_AFTER_JOB
    assert verdict.reason.startswith("rsc_health:job:check_fs_mount:check_fs_mount: /scratch")


def test_nhc_in_all_checks_mode_is_one_finding_per_failed_function():
    """NHC_CHECK_ALL=1 set by a site's settings file: several failures, one per function."""
    from rsc_health.site import nhc_adapter

    failed = "ERROR:  nhc:  Health check failed:  "
    out = "".join(f"{failed}{msg}\n" for msg in (
        "check_fs_mount:  /scratch not mounted", "check_hw_physmem:  Actual RAM size (1000 "
        "kB) less than minimum allowed (2000 kB).", "check_fs_mount:  /home not mounted"))
    lines = nhc_adapter.findings(out + "ERROR:  nhc:  3 health checks failed.\n", "", "drain_now")
    assert lines[0] == ("fail drain_now check_fs_mount check_fs_mount check_fs_mount: /scratch "
                        "not mounted; check_fs_mount: /home not mounted")
    assert [ln.split()[2] for ln in lines] == ["check_fs_mount", "check_hw_physmem"]


def test_nhc_is_told_to_stop_at_a_failure_and_never_to_drain_or_resume_itself(node):
    _, _, conf = run_nhc(node, "pass")
    args = Path(f"{conf}.args").read_text().split("\n")
    assert "-a" not in args and args[args.index("-c") + 1] == str(conf)
    assert {"MARK_OFFLINE=0", "OFFLINE_NODE=:", "ONLINE_NODE=:"} <= set(args)


def test_a_passing_nhc_is_one_ok_finding(node):
    findings, verdict, _ = run_nhc(node, "pass")
    assert [(f.component, f.status) for f in findings] == [(site.NHC, Status.OK)]
    assert verdict.level is Level.OK


def test_nhc_severity_is_configurable(node):
    findings, verdict, _ = run_nhc(node, "fail", nhc_severity="warn")
    assert verdict.level is Level.WARN
    assert {f.status for f in findings} == {Status.WARN}


def test_nhc_s_own_watchdog_timeout_is_a_checker_error_not_a_drain(node):
    findings, verdict, _ = run_nhc(node, "watchdog")
    assert verdict.level is Level.CHECKER_ERROR
    assert [(f.component, f.code) for f in findings] == [("check_fs_mount", "nhc_timeout")]


def test_a_hanging_nhc_is_killed_inside_the_site_timeout(node):
    started = time.monotonic()
    findings, verdict, conf = run_nhc(node, "hang", timeout_s=1.5)
    assert time.monotonic() - started < 4
    assert verdict.level is Level.CHECKER_ERROR
    assert any(f.code == "nhc_timeout" and "killed" in f.reason for f in findings)
    child = int(Path(f"{conf}.child").read_text())
    deadline = time.monotonic() + 2
    while not gone(child) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert gone(child)


def test_nhc_printing_garbage_and_failing_is_a_checker_error(node):
    findings, verdict, _ = run_nhc(node, "garbage")
    assert verdict.level is Level.CHECKER_ERROR
    assert [(f.component, f.code) for f in findings] == [("nhc", "nhc_error")]
    assert findings[0].reason.startswith(
        "[nhc]: nhc exited 1 without naming a failed check: ?")
    assert findings[0].reason.endswith("not nhc Segmentation fault")


def test_a_missing_nhc_conf_is_a_checker_error_not_a_pass(node):
    _, conf = fake_nhc(node.root, "fail")
    conf.unlink()
    cfg = node.config
    cfg.data["site"].update(nhc_conf="/etc/nhc/nhc.conf")
    findings = engine.run(cfg, node.root, only={"site"}, save_state=False)
    assert decide(findings).level is Level.CHECKER_ERROR
    assert [(f.component, f.code) for f in findings] == [("nhc", "nhc_conf")]
    assert "missing (NHC would run no checks and pass)" in findings[0].reason


def test_an_nhc_conf_that_marks_nodes_offline_itself_is_flagged_and_still_run(node):
    _, conf = fake_nhc(node.root, "fail")
    conf.write_text(conf.read_text() + "* || export MARK_OFFLINE=1\n")
    cfg = node.config
    cfg.data["site"].update(nhc_conf="/etc/nhc/nhc.conf")
    findings = engine.run(cfg, node.root, only={"site"}, save_state=False)
    assert [(f.code, "MARK_OFFLINE=1" in f.reason) for f in errors(findings)] == [
        ("nhc_conf", True)]
    assert decide(findings).level is Level.DRAIN_AFTER_JOB


def test_the_adapter_runs_by_hand(tmp_path):
    nhc, conf = fake_nhc(tmp_path, "fail")
    adapter = Path(site.NHC_ADAPTER)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # it finds its package
    out = subprocess.run([sys.executable, str(adapter), "--nhc", str(nhc), "--conf", str(conf),
                          "--severity", "drain_now", "--timeout", "5"],
                         capture_output=True, text=True, env=env, timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["fail drain_now check_fs_mount check_fs_mount "
                                       "check_fs_mount: /scratch not mounted"]


# ---- end to end: the prolog ---------------------------------------------------------------------
@pytest.fixture
def prolog_env(node, monkeypatch):
    monkeypatch.setenv("RSC_HEALTH_ROOT", str(node.root))
    monkeypatch.setenv("SLURMD_NODENAME", "node01")
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    for name in ("SLURM_JOB_PARTITION", "SLURM_JOBID", "SLURM_JOB_NODELIST"):
        monkeypatch.delenv(name, raising=False)

    def configure(extra: str) -> None:
        site_toml = node.path("site.toml")
        site_toml.write_text(node.path("config.toml").read_text() + extra)
        monkeypatch.setenv("RSC_HEALTH_CONFIG", str(site_toml))

    return configure


def _spooled(node) -> list[dict]:
    text = node.path(f"{NODE_STATE}/spool/pending.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines()]


def prolog_site(site_extra: str = "", slurm_extra: str = "") -> str:
    """The fixture's config plus the site family in the prolog; Slurm is away (no bin_dir), so
    a drain verdict is kept in pending_verdict.json for the test to read."""
    return (f'\n[site]\nchecks_dir = "/{CHECKS_DIR}"\n{site_extra}\n[slurm]\n'
            'prolog_families = ["gpu", "xid", "ecc", "remap", "mount", "infiniband", "site"]\n'
            f'bin_dir = "/nonexistent-slurm"\n{slurm_extra}\n')


def test_prolog_a_high_severity_site_failure_drains_with_the_site_reason(node, prolog_env):
    program(checks_dir(node), "gpuburn", "#!/bin/sh\n"
            "echo 'fail drain_now gpu3 burn_errors gpu-burn found 12 errors'\n")
    prolog_env(prolog_site())

    assert nodepath.main(["prolog"]) == 1  # the job start fails: slurmd drains, Slurm requeues

    records = _spooled(node)
    check = next(r for r in records if r["kind"] == "check" and r["check"] == "site")
    assert (check["component"], check["code"], check["severity"]) == (
        "gpu3", "burn_errors", "drain_now")
    assert next(r for r in records if r["kind"] == "heartbeat")["level"] == "drain_now"
    pending = nodepath.load_pending(node.path(NODE_STATE))  # Slurm is away in this test
    assert decide(list(pending.verdict.causes)).reason == (
        "rsc_health:now:burn_errors:gpu3 gpu-burn found 12 errors")


def test_prolog_a_hanging_site_check_finishes_in_budget_with_a_checker_error(node, prolog_env):
    program(checks_dir(node), "hang", "#!/bin/sh\nsleep 300\n")
    prolog_env(prolog_site("timeout_s = 60", "prolog_budget_s = 4"))

    started = time.monotonic()
    assert nodepath.main(["prolog"]) == 0  # the job runs
    assert time.monotonic() - started < 4

    records = _spooled(node)
    beat = next(r for r in records if r["kind"] == "heartbeat")
    assert beat["level"] == "checker_error" and beat["families"].get("checker") == "error"
    assert any(r["kind"] == "check" and "hang" in r["reason"] and "killed" in r["reason"]
               for r in records)
    assert not any(r["kind"] == "action" for r in records)
    assert nodepath.load_pending(node.path(NODE_STATE)) is None


def test_a_snapshot_replay_runs_no_site_programs(node, tmp_path):
    from click.testing import CliRunner

    from rsc_health.cli import cli

    marker = tmp_path / "ran"
    program(checks_dir(node), "touch", f"#!/bin/sh\ntouch {marker}\n"
            "echo 'fail drain_now a b c'\n")
    config = node.path("site.toml")
    config.write_text(node.path("config.toml").read_text()
                      + f'\n[site]\nchecks_dir = "/{CHECKS_DIR}"\n')
    snap = tmp_path / "snap.json"
    base = ["--root", str(node.root), "--config", str(config)]
    assert CliRunner().invoke(cli, [*base, "check"]).exit_code == 3  # live: the check runs
    marker.unlink()
    # The snapshot runs them once and carries what they printed ...
    assert CliRunner().invoke(cli, [*base, "snapshot", "--out", str(snap)]).exit_code == 0
    assert marker.exists()
    marker.unlink()
    # ... and the replay judges that, running nothing here.
    res = CliRunner().invoke(cli, ["check", "--from", str(snap)])
    assert res.exit_code == 3, res.output
    assert "rsc_health:now:b:a c" in res.output
    assert not marker.exists()
