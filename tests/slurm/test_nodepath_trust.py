"""Issue 11 on the real Slurm: a broken config lets jobs run and shows; a drain the guard held
back happens once the guard allows; a manual check between sweeps hides nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from .test_cluster_scenarios import drained_nodes, inject_xid79

pytestmark = pytest.mark.slurm


def test_a_broken_config_lets_jobs_run_and_the_node_says_it_cannot_look(slurm_cluster):
    c = slurm_cluster
    site = c.root("node01") / "site.toml"
    site.write_text(site.read_text() + "\n[xid]\nsourcez = [\"/dev/kmsg\"]\n")
    job = c.sbatch("-w", "node01", "--gres=gpu:8", "--wrap", "sleep 1")
    c.wait_for(lambda: c.job_state(job) == "COMPLETED", 60, "job COMPLETED")
    assert "DRAIN" not in c.node_state("node01")
    beats = [r for r in c.spool("node01") if r["kind"] == "heartbeat"]
    assert {b["source"] for b in beats} >= {"prolog", "epilog"}
    assert all(b["level"] == "checker_error" for b in beats)
    config_errors = [r for r in c.spool("node01") if r.get("code") == "config_error"]
    assert config_errors and "sourcez" in config_errors[0]["reason"]


def test_a_drain_the_guard_held_back_happens_once_the_guard_allows(slurm_cluster):
    c = slurm_cluster
    # guard_max_share 0.34 of 6 nodes: two drains in the window, the third is held back.
    for node in ("node01", "node02", "node03"):
        inject_xid79(c, node)
        c.sweep(node)
    assert drained_nodes(c) == ["node01", "node02"]
    assert (c.root("node03") / "var/lib/rsc_health/pending_verdict.json").exists()
    c.run(["scontrol", "update", "NodeName=node01", "State=RESUME"])
    c.wait_for(lambda: "DRAIN" not in c.node_state("node01"), 30, "node01 resumed")
    pending = c.root("node03") / "var/lib/rsc_health/pending_verdict.json"
    held = json.loads(pending.read_text())
    assert held["holds"] == 1
    out = c.sweep("node03")  # within the guard's backoff: not tried, still held
    assert out.returncode == 0 and "DRAIN" not in c.node_state("node03"), out.stderr
    held["retry_after"] = "2000-01-01T00:00:00+00:00"  # the backoff has run out
    pending.write_text(json.dumps(held))
    out = c.sweep("node03")  # the XID itself was consumed sweeps ago
    assert out.returncode == 0, out.stderr
    assert c.node("node03")["Reason"].startswith("rsc_health:now:xid79:gpu3")
    assert not (c.root("node03") / "var/lib/rsc_health/pending_verdict.json").exists()


def test_a_manual_check_between_sweeps_does_not_hide_an_xid(slurm_cluster):
    c = slurm_cluster
    assert c.sweep("node04").returncode == 0
    inject_xid79(c, "node04")
    env = c.node_env("node04")
    check = subprocess.run([sys.executable, "-m", "rsc_health.cli", "check", "--json"],
                           env=env, capture_output=True, text=True, timeout=60)
    assert check.returncode == 3, check.stderr
    assert json.loads(check.stdout)["verdict"]["reason"].startswith("rsc_health:now:xid79")
    assert "DRAIN" not in c.node_state("node04")  # check never acts
    c.sweep("node04")
    assert c.node("node04")["Reason"].startswith("rsc_health:now:xid79:gpu3")


def test_a_healthy_prolog_or_sweep_makes_no_slurm_call(slurm_cluster, tmp_path):
    """SchedMD asks prologs not to call Slurm commands: a 1,024-node job start would send
    1,024 RPCs to slurmctld. Slurm's commands are replaced by recorders for this one run."""
    c = slurm_cluster
    bindir = tmp_path / "bin"
    bindir.mkdir()
    calls = tmp_path / "calls.log"
    for cmd in ("scontrol", "squeue", "sinfo", "sacct", "sacctmgr"):
        script = bindir / cmd
        script.write_text(f"#!/bin/sh\necho {cmd} \"$@\" >> {calls}\nexit 1\n")
        script.chmod(0o755)
    root = c.root("node05")
    site = root / "site.toml"
    site.write_text(site.read_text().replace("[slurm]\n", f'[slurm]\nbin_dir = "{bindir}"\n', 1))
    env = dict(c.node_env("node05"), SLURM_JOB_ID="991", SLURM_JOB_NODELIST="node[05-06]",
               PATH=f"{bindir}:{os.environ['PATH']}")
    out = subprocess.run([sys.executable, "-m", "rsc_health.nodepath", "prolog"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert not calls.exists(), calls.read_text()
    # Nor does a healthy sweep of a node rsc-health never drained (16,000 nodes every five
    # minutes would be 53 RPCs a second to slurmctld).
    out = subprocess.run([sys.executable, "-m", "rsc_health.nodepath", "sweep"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert "rsc_health sweep node05: OK" in out.stdout, out.stderr
    assert not calls.exists(), calls.read_text()
    # With a drain of ours on record, the clean sweep asks Slurm (to count towards resuming
    # it): the recorder works.
    from rsc_health.actions import DRAIN_STATE_FILE

    state = root / "var/lib/rsc_health" / DRAIN_STATE_FILE
    state.write_text(json.dumps({"reason": "rsc_health:job:mount_missing:/scratch",
                                 "codes": ["mount_missing"], "auto_resumable": True,
                                 "time": "2026-11-24T00:00:00+00:00"}))
    subprocess.run([sys.executable, "-m", "rsc_health.nodepath", "sweep"], env=env,
                   capture_output=True, text=True, timeout=60)
    assert calls.exists() and "scontrol" in calls.read_text()
