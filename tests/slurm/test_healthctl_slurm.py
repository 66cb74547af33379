"""`healthctl drain|resume|status` against the real cluster."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slurm


def healthctl(cluster, *args: str, root=None) -> subprocess.CompletedProcess:
    env = dict(cluster.env, RSC_HEALTH_CONFIG=os.devnull)
    argv = [sys.executable, "-m", "rsc_health.cli"]
    if root:
        argv += ["--root", str(root)]
    return subprocess.run([*argv, *args], env=env, capture_output=True, text=True, timeout=60)


def test_drain_status_resume_round_trip(slurm_cluster, tmp_path):
    c = slurm_cluster
    out = healthctl(c, "drain", "node[05-06]", "--reason", "PSU swap, ticket 7", root=tmp_path)
    assert out.returncode == 0, out.stderr
    for node in ("node05", "node06"):
        assert c.node(node)["Reason"].startswith("rsc_health:manual:manual:PSU swap, ticket 7")

    status = json.loads(healthctl(c, "status", "--json").stdout)
    drained = {d["node"]: d for d in status["drained"]}
    assert set(drained) == {"node05", "node06"}
    assert drained["node05"]["ours"] and drained["node05"]["mode"] == "manual"
    assert 0 <= drained["node05"]["age_s"] < 120
    (guard,) = status["guard"]
    # 2 of 6 drained by rsc_health just now; the default share (10%) allows 1: tripped.
    assert guard["partition"] == "gpu" and guard["tripped"] and guard["limit"] == 1
    assert "guard gpu: TRIPPED" in healthctl(c, "status").stdout

    assert healthctl(c, "resume", "node[05-06]", root=tmp_path).returncode == 0
    assert all("DRAIN" not in c.node_state(n) for n in ("node05", "node06"))
    spooled = (tmp_path / "var/lib/rsc_health/spool/pending.jsonl").read_text().splitlines()
    assert [json.loads(x)["action"] for x in spooled] == ["drain_after_job"] * 2 + ["resume"] * 2


def test_resume_refuses_a_persons_drain_without_force(slurm_cluster):
    c = slurm_cluster
    c.run(["scontrol", "update", "NodeName=node03", "State=DRAIN", "Reason=cabling"])
    out = healthctl(c, "resume", "node03")
    assert out.returncode == 1 and "not ours" in out.stderr
    assert "DRAIN" in c.node_state("node03")
    assert healthctl(c, "resume", "node03", "--force").returncode == 0
    assert "DRAIN" not in c.node_state("node03")
