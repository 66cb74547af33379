"""Every way a node-path run ends says so in both places a fleet reads: the spool (a
heartbeat) and the Prometheus textfile (this run's verdict level). The watchdog's exit
spooled its heartbeat but left the textfile as the last good run wrote it (or absent), so a
prolog that hung on slurmctld showed verdict 0 to the fleet's alerts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rsc_health import nodepath
from tests.fixtures.nodes.node_copy import NODE_STATE

from .test_nodepath_faults import (
    REPO,
    XID79,
    _gauge,
    _no_slurm,
    _records,
    node_env,  # noqa: F401 - the fixture
)


def _level(root: Path, source: str) -> str | None:
    return _gauge(root, f'rsc_health_verdict_level{{source="{source}"}}')


def _says(root: Path, source: str, level: str, fault: str | None) -> None:
    textfile = root / "var/lib/node_exporter" / nodepath.TEXTFILE
    assert textfile.exists(), "no textfile written"
    assert _level(root, source) == level
    records = _records(root)
    assert [r for r in records if r["kind"] == "heartbeat"], "no heartbeat spooled"
    if fault:
        assert fault in [r.get("code") for r in records]


def _set(key_line: str) -> None:
    site = Path(os.environ["RSC_HEALTH_CONFIG"])
    text = site.read_text()
    site.write_text(text.replace("[slurm]", f"[slurm]\n{key_line}", 1) if "[slurm]" in text
                    else text + f"\n[slurm]\n{key_line}\n")


def test_a_clean_run_says_it(node_env):  # noqa: F811 - pytest fixture by name
    assert nodepath.run_stage("sweep", slurm_factory=_no_slurm) == 0
    _says(node_env, "sweep", "0", None)


def test_a_checker_fault_says_it(node_env, monkeypatch):  # noqa: F811
    def broken(*args, **kwargs):
        raise RuntimeError("bug after the verdict")

    monkeypatch.setattr(nodepath, "_job_records", broken)
    assert nodepath.run_stage("prolog", slurm_factory=_no_slurm) == 0
    _says(node_env, "prolog", "4", "checker_fault")


def test_a_broken_config_says_it(node_env):  # noqa: F811
    assert nodepath.run_stage("sweep", slurm_factory=_no_slurm) == 0  # the last good config
    _set("prolog_budgte_s = 1")
    assert nodepath.run_stage("sweep", slurm_factory=_no_slurm) == 0
    _says(node_env, "sweep", "4", "config_error")


@pytest.mark.parametrize("healthy_first", [False, True], ids=["first_run", "after_a_good_one"])
def test_the_watchdogs_exit_says_it(node_env, healthy_first):  # noqa: F811
    """A prolog whose drain call hangs past its budget: the watchdog ends it (exit 1, the
    verdict was drain); the textfile says a checker error and the pending drain."""
    if healthy_first:
        assert nodepath.run_stage("sweep", slurm_factory=_no_slurm) == 0
        assert _level(node_env, "sweep") == "0"
    _set("prolog_budget_s = 1")
    (node_env / "dev/kmsg").open("a").write(XID79)
    script = ("import time\nfrom rsc_health import nodepath\n"
              "raise SystemExit(nodepath.run_stage('prolog', "
              "slurm_factory=lambda cfg, deadline: time.sleep(600)))\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 1 and "still running after" in proc.stderr, proc.stderr
    _says(node_env, "prolog", "4", "checker_timeout")
    assert _gauge(node_env, "rsc_health_pending_drain") == "1"
    assert json.loads((node_env / NODE_STATE / nodepath.PENDING_VERDICT_FILE).read_text())[
        "why"] == "fault"
