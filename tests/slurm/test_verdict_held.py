"""Issue 21 on the real Slurm: a drain verdict that meets a drain rsc-health does not own (a
person's, slurmd's own "Prolog error") is kept, said, and carried out once that drain is
lifted; an operator's `healthctl drain` does not use up the mass-drain guard's budget."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .test_cluster_scenarios import inject_xid79

pytestmark = pytest.mark.slurm

STATE = Path("var/lib/rsc_health")


def pending(c, node: str) -> dict | None:
    path = c.root(node) / STATE / "pending_verdict.json"
    return json.loads(path.read_text()) if path.exists() else None


def backoff_ran_out(c, node: str) -> None:
    """Time passes: the held verdict's backoff ([actions] guard_retry_min, doubling) is over."""
    path = c.root(node) / STATE / "pending_verdict.json"
    held = json.loads(path.read_text())
    held["retry_after"] = "2000-01-01T00:00:00+00:00"
    path.write_text(json.dumps(held))


def actions(c, node: str) -> list[str]:
    return [r["action"] for r in c.spool(node) if r["kind"] == "action"]


def with_textfile(c, node: str) -> Path:
    site = c.root(node) / "site.toml"
    site.write_text(site.read_text().replace(
        "[slurm]\n", '[node]\ntextfile_dir = "/textfile"\n\n[slurm]\n', 1))
    return c.root(node) / "textfile" / "rsc_health.prom"


def healthctl(c, db: str, *args: str) -> subprocess.CompletedProcess:
    env = dict(c.env, RSC_HEALTH_CONFIG=os.devnull, PYTHONPATH=str(Path(__file__).parents[2]))
    return subprocess.run([sys.executable, "-m", "rsc_health.cli", "--db", db, *args], env=env,
                          capture_output=True, text=True, timeout=60)


def flush(c, db: str, node: str) -> None:
    out = healthctl(c, db, "spool", "flush", "--dir", str(c.root(node) / STATE / "spool"))
    assert out.returncode == 0, out.stderr


def test_xid79_under_a_persons_drain_is_kept_said_and_drained_for_once_resumed(
        slurm_cluster, tmp_path):
    c = slurm_cluster
    db = f"sqlite:///{tmp_path / 'historian.db'}"
    assert healthctl(c, db, "db", "upgrade").returncode == 0
    prom = with_textfile(c, "node02")
    c.run(["scontrol", "update", "NodeName=node02", "State=DRAIN",
           "Reason=alice: BIOS update"])
    inject_xid79(c, "node02")  # the GPU falls off the bus during the maintenance

    out = c.sweep("node02")
    assert out.returncode == 0, out.stderr
    node = c.node("node02")
    assert node["Reason"].startswith("alice: BIOS update")  # a person's drain stays theirs
    held = pending(c, "node02")
    assert held is not None and held["why"] == "foreign_drain"
    assert [x["code"] for x in held["causes"]] == ["xid79"]
    assert actions(c, "node02") == ["held_under_drain"]
    assert "rsc_health_pending_drain 1" in prom.read_text()

    # While the person's drain stands, the next sweep waits out the backoff (no Slurm call,
    # nothing new spooled) and keeps the verdict.
    out = c.sweep("node02")
    assert out.returncode == 0 and "someone else's drain held" in out.stderr, out.stderr
    assert pending(c, "node02") is not None and actions(c, "node02") == ["held_under_drain"]

    flush(c, db, "node02")
    status = healthctl(c, db, "status")
    assert status.returncode == 1, status.stdout + status.stderr
    line = next(ln for ln in status.stdout.splitlines() if ln.lstrip().startswith("node02 ")
                and "held" in ln)
    assert "held under a drain rsc-health does not lift" in line and "xid79" in line
    assert "alice: BIOS update" in line
    story = healthctl(c, db, "node", "node02")
    assert "HELD" in story.stdout and "xid79" in story.stdout, story.stdout + story.stderr

    # The person resumes it, knowing nothing of the XID: status still names the verdict.
    c.run(["scontrol", "update", "NodeName=node02", "State=RESUME"])
    c.wait_for(lambda: "DRAIN" not in c.node_state("node02"), 30, "node02 resumed")
    status = healthctl(c, db, "status")
    assert "now lifted" in status.stdout and "xid79" in status.stdout, status.stdout

    backoff_ran_out(c, "node02")
    out = c.sweep("node02")  # the XID itself was consumed two sweeps ago
    assert out.returncode == 0, out.stderr
    node = c.node("node02")
    assert "DRAIN" in node["State"] and node["Reason"].startswith("rsc_health:now:xid79:gpu3")
    assert pending(c, "node02") is None
    assert actions(c, "node02") == ["drain_now"]  # spooled since the flush
    assert "rsc_health_pending_drain 0" in prom.read_text()
    flush(c, db, "node02")
    status = healthctl(c, db, "status")
    assert not [ln for ln in status.stdout.splitlines() if "held" in ln and "node02" in ln]


def test_a_prolog_error_drain_resumed_by_an_operator_the_next_job_start_drains_for_xid79(
        slurm_cluster, tmp_path):
    c = slurm_cluster
    site = c.root("node01") / "site.toml"
    good = site.read_text()
    # The prolog finds the XID but cannot set its reason (no scontrol it can run): it exits 1
    # and slurmd drains the node itself, "Prolog error".
    site.write_text(good.replace("[slurm]\n", f'[slurm]\nbin_dir = "{tmp_path / "none"}"\n', 1))
    inject_xid79(c, "node01")
    ran = tmp_path / "ran"
    job = c.sbatch("-N", "1", "-w", "node01", "--requeue", "--wrap", f"touch {ran}")
    c.wait_for(lambda: "DRAIN" in c.node_state("node01"), 60, "node01 drained by slurmd")
    assert c.node("node01")["Reason"].startswith("Prolog error")
    assert pending(c, "node01")["why"] == "slurm_unavailable"
    c.wait_for(lambda: c.job_state(job) == "PENDING", 30, "job requeued")
    c.run(["scancel", job])

    site.write_text(good)
    out = c.sweep("node01")
    assert out.returncode == 0, out.stderr
    assert c.node("node01")["Reason"].startswith("Prolog error")  # not ours to replace
    assert pending(c, "node01")["why"] == "foreign_drain"

    # An operator resumes it, as one does after a "Prolog error" that looks transient. The
    # backoff is untouched: the job start itself carries the verdict out.
    c.run(["scontrol", "update", "NodeName=node01", "State=RESUME"])
    c.wait_for(lambda: "DRAIN" not in c.node_state("node01"), 30, "node01 resumed")
    second = c.sbatch("-N", "1", "-w", "node01", "--requeue", "--wrap", f"touch {ran}")
    c.wait_for(lambda: "DRAIN" in c.node_state("node01"), 60, "node01 drained by the prolog")
    assert c.node("node01")["Reason"].startswith("rsc_health:now:xid79:gpu3")
    # (the prolog is still settling the guard after its drain landed)
    c.wait_for(lambda: pending(c, "node01") is None, 30, "verdict carried out")
    # The job never ran there: requeued, it waits for the node it asked for.
    c.wait_for(lambda: c.job_state(second) == "PENDING", 30, "job requeued")
    assert not ran.exists()


def test_an_operators_drain_does_not_hold_back_an_automatic_drain(slurm_cluster, tmp_path):
    c = slurm_cluster
    db = f"sqlite:///{tmp_path / 'historian.db'}"
    assert healthctl(c, db, "db", "upgrade").returncode == 0
    # guard_max_share 0.34 of 6 nodes: two automatic drains per window. Two DIMM reseats by
    # an operator first.
    out = healthctl(c, db, "drain", "node01,node02", "--reason", "DIMM reseat", "--now")
    assert out.returncode == 0, out.stdout + out.stderr
    assert all("DRAIN" in c.node_state(n) for n in ("node01", "node02"))
    inject_xid79(c, "node03")
    out = c.sweep("node03")
    assert out.returncode == 0, out.stderr
    assert "GUARD TRIPPED" not in out.stderr
    assert c.node("node03")["Reason"].startswith("rsc_health:now:xid79:gpu3")
    # The guard still counts the automatic drains: two more XIDs, one is held, and status
    # names the held node and why.
    for node in ("node04", "node05"):
        inject_xid79(c, node)
        assert c.sweep(node).returncode == 0
    assert "DRAIN" in c.node_state("node04") and "DRAIN" not in c.node_state("node05")
    assert actions(c, "node05") == ["guard_tripped"]
    flush(c, db, "node05")
    status = healthctl(c, db, "status")
    assert status.returncode == 1
    line = next(ln for ln in status.stdout.splitlines() if ln.lstrip().startswith("node05 "))
    assert "held by the mass-drain guard" in line and "partition gpu" in line, status.stdout


def test_xid79_under_an_operators_healthctl_drain_is_drained_for_once_resumed(
        slurm_cluster, tmp_path):
    """`healthctl drain` carries our prefix, but only a person lifts it: a verdict found under
    it was dropped as 'already drained by us', and `healthctl resume` after the DIMM reseat put
    the GPU that fell off the bus back in service."""
    c = slurm_cluster
    db = f"sqlite:///{tmp_path / 'historian.db'}"
    assert healthctl(c, db, "db", "upgrade").returncode == 0
    out = healthctl(c, db, "drain", "node04", "--reason", "DIMM reseat")
    assert out.returncode == 0, out.stdout + out.stderr
    inject_xid79(c, "node04")
    assert c.sweep("node04").returncode == 0
    assert c.node("node04")["Reason"].startswith("rsc_health:manual:manual:DIMM reseat")
    assert pending(c, "node04")["why"] == "foreign_drain"
    out = healthctl(c, db, "resume", "node04", "--reason", "DIMM reseated")
    assert out.returncode == 0, out.stdout + out.stderr
    backoff_ran_out(c, "node04")
    assert c.sweep("node04").returncode == 0
    assert c.node("node04")["Reason"].startswith("rsc_health:now:xid79:gpu3")
    assert pending(c, "node04") is None
