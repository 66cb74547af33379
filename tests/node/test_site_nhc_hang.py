"""A hung NHC check must not outlive the run, and NHC's watchdog must still name the check that
hung. Run with LBNL NHC's own driver (tests/fixtures/nhc). Found by helper-128: the adapter
started NHC in a session of its own, so the site family's SIGKILL of the adapter's process group
missed it, and the adapter's own kill was timed from its own start: when the interpreter was
slow to start (a loaded node, a venv on cold NFS) the family killed the adapter first, and NHC
with the command it was stuck in stayed behind, one more after every prolog."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

from rsc_health import engine
from rsc_health.model import Level, Status
from rsc_health.policy import decide
from tests.node.site_fakes import gone, real_nhc


def hung(node, tmp_path: Path, timeout_s: float, settings: str = "", deaf: bool = False):
    """NHC whose one check hangs in an external command; (findings, NHC's pid, the command's).
    `settings`: lines added to NHC's settings file; `deaf`: the command ignores SIGALRM and
    SIGTERM (only SIGKILL ends it)."""
    pids = tmp_path / "pids"
    ignore = "trap '' ALRM TERM; " if deaf else ""
    real_nhc(node.root, "* || check_hangs\n", {"site.nhc": (
        "function check_hangs() {\n"
        f"    echo $$ > {pids}.nhc\n"
        f"    sh -c \"{ignore}echo \\$\\$ > {pids}.sleep; exec sleep 300\"\n"
        "}\n")})
    with open(node.path("etc/sysconfig/nhc"), "a") as fh:
        fh.write(settings)
    cfg = node.config
    cfg.data["site"].update({"nhc_conf": "/etc/nhc/nhc.conf", "nhc_path": "/usr/sbin/nhc",
                             "timeout_s": timeout_s})
    started = time.monotonic()
    findings = engine.run(cfg, node.root, only={"site"}, save_state=False)
    took = time.monotonic() - started
    return findings, took, [int(Path(f"{pids}.{what}").read_text()) for what in ("nhc", "sleep")]


def left_running(pids: list[int]) -> list[int]:
    """The pids still running 3 s on (each killed here, so the test leaves nothing behind)."""
    deadline = time.monotonic() + 3
    while any(not gone(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    alive = [p for p in pids if not gone(p)]
    for pid in alive:
        os.kill(pid, signal.SIGKILL)
    return alive


def test_the_watchdog_names_the_hung_check_and_nothing_is_left_running(node, tmp_path):
    findings, took, pids = hung(node, tmp_path, 3.0)
    assert took < 3.5
    assert [(f.status, f.component, f.code) for f in findings] == [
        (Status.ERROR, "check_hangs", "nhc_timeout")]
    assert 'Script timed out while executing "check_hangs"' in findings[0].reason
    assert decide(findings).level is Level.CHECKER_ERROR
    assert left_running(pids) == []


def test_a_hung_nhc_does_not_outlive_an_adapter_slow_to_start(node, tmp_path, monkeypatch):
    slow = tmp_path / "slow-python"  # the interpreter takes 0.6 s to start
    slow.write_text(f"#!/bin/sh\nsleep 0.6\nexec {sys.executable} \"$@\"\n")
    slow.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(slow))
    # TIMEOUT=0 (NHC's settings, read after its command line): NHC starts no watchdog of its
    # own, as a site that lets slurmd's HealthCheckProgram bound it may have set.
    findings, took, pids = hung(node, tmp_path, 1.8, "TIMEOUT=0\n")
    assert took < 2.3
    assert left_running(pids) == [], "NHC or its hung command outlived the site family"
    assert decide(findings).level is Level.CHECKER_ERROR


def test_a_hung_command_deaf_to_the_watchdog_goes_with_the_adapter(node, tmp_path):
    """The watchdog's SIGALRM cannot end it and NHC waits on it, so NHC is killed at the
    adapter's deadline; the command, left in the adapter's group, is killed with that group
    when the adapter exits."""
    findings, took, pids = hung(node, tmp_path, 2.0, deaf=True)
    assert took < 2.5
    assert [(f.code, "killed" in f.reason) for f in findings] == [("nhc_timeout", True)]
    assert left_running(pids) == []
