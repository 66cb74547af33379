"""`healthctl drain|resume|status` against the real cluster."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slurm


def healthctl(cluster, *args: str, root=None, env=None) -> subprocess.CompletedProcess:
    env = dict(cluster.env, RSC_HEALTH_CONFIG=os.devnull, **(env or {}))
    argv = [sys.executable, "-m", "rsc_health.cli"]
    if root:
        argv += ["--root", str(root)]
    return subprocess.run([*argv, *args], env=env, capture_output=True, text=True, timeout=60)


def test_drain_status_resume_round_trip(slurm_cluster, tmp_path):
    c = slurm_cluster
    out = healthctl(c, "drain", "node[05-06]", "--reason", "PSU swap, ticket 7", root=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[0].startswith("node05: drained")
    for node in ("node05", "node06"):
        assert c.node(node)["Reason"].startswith("rsc_health:manual:manual:PSU swap, ticket 7 by ")

    st = healthctl(c, "status", "--json")
    assert st.returncode == 0  # nothing held, nothing stale
    status = json.loads(st.stdout)
    drained = {d["node"]: d for d in status["drained"]}
    assert set(drained) == {"node05", "node06"}
    assert drained["node05"]["ours"] and drained["node05"]["mode"] == "manual"
    assert 0 <= drained["node05"]["age_s"] < 120
    (guard,) = status["guard"]
    # 2 of 6 drained just now, by a person: the guard counts only automatic drains (the
    # default share, 10%, allows 1), so these leave its budget to a broken node.
    assert guard["partition"] == "gpu" and not guard["tripped"] and guard["limit"] == 1
    assert guard["drained_recently"] == []
    text = healthctl(c, "status").stdout
    assert "guard gpu: ok (0/6" in text and "node05" in text and "node06" in text

    # Bulk resume goes on past a node that is not drained, one line per node.
    out = healthctl(c, "resume", "node[04-06]", "--json", root=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    results = {r["node"]: r["result"] for r in json.loads(out.stdout)}
    assert results == {"node04": "not drained", "node05": "resumed", "node06": "resumed"}
    assert all("DRAIN" not in c.node_state(n) for n in ("node05", "node06"))
    spooled = (tmp_path / "var/lib/rsc_health/spool/pending.jsonl").read_text().splitlines()
    assert [json.loads(x)["action"] for x in spooled] == ["manual_drain"] * 2 + ["resume"] * 2


def test_resume_refuses_a_persons_drain_without_force(slurm_cluster):
    c = slurm_cluster
    c.run(["scontrol", "update", "NodeName=node03", "State=DRAIN", "Reason=cabling"])
    out = healthctl(c, "resume", "node[02-03]")
    assert out.returncode == 1 and "node03: refused (not ours" in out.stdout
    assert "node02: not drained" in out.stdout
    assert "DRAIN" in c.node_state("node03")
    assert healthctl(c, "resume", "node03", "--force").returncode == 0
    assert "DRAIN" not in c.node_state("node03")


def test_drain_keeps_a_persons_reason_without_force_and_now_requeues(slurm_cluster, tmp_path):
    c = slurm_cluster
    c.run(["scontrol", "update", "NodeName=node01", "State=DRAIN", "Reason=alice: reseat HCA"])
    out = healthctl(c, "drain", "node[01-02]", "--reason", "rack work", root=tmp_path)
    assert out.returncode == 1
    assert "node01: refused" in out.stdout and "node02: drained" in out.stdout
    assert c.node("node01")["Reason"].startswith("alice: reseat HCA")
    job = c.sbatch("-w", "node03", "--requeue", "--wrap", "sleep 60")
    c.wait_for(lambda: c.job_state(job) == "RUNNING", 60, "job RUNNING")
    out = healthctl(c, "drain", "node03", "--reason", "bad DIMM", "--now", "--json",
                    root=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert json.loads(out.stdout)[0]["requeued"] == [job]
    c.wait_for(lambda: c.job(job).get("Restarts") == "1", 60, "job requeued")
