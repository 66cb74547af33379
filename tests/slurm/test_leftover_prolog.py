"""At job start on a real cluster: a process left on gpu5 by a job that no longer runs fails
the real prolog (default prolog_families, default [leftover] action), node01 drains with a
reason naming it, and the job starts elsewhere; the running job's own step sockets in the
real SlurmdSpoolDir are what the family reads."""

from __future__ import annotations

import json


def inject_leftover(cluster, node: str, pid: int = 4321, job: int = 77) -> None:
    root = cluster.root(node)
    path = root / "rsc_health/nvml.json"
    doc = json.loads(path.read_text())
    doc["devices"][5]["processes"] = [{"pid": pid, "used_memory": 30 << 30}]
    path.write_text(json.dumps(doc))
    proc = root / "proc" / str(pid)
    proc.mkdir(parents=True, exist_ok=True)
    (proc / "cgroup").write_text(f"0::/system.slice/slurmstepd.scope/job_{job}/step_0/user/"
                                 "task_0\n")
    (proc / "comm").write_text("python3\n")
    (proc / "status").write_text("Name:\tpython3\nUid:\t0\t0\t0\t0\n")
    spool = root / "var/spool/slurmd"
    spool.parent.mkdir(parents=True, exist_ok=True)
    if not spool.exists():
        spool.symlink_to(cluster.base / "spool" / node)  # the node's real SlurmdSpoolDir


def test_a_leftover_fails_the_prolog_and_the_job_starts_elsewhere(slurm_cluster):
    c = slurm_cluster
    inject_leftover(c, "node01")
    # With equal weights the scheduler takes the first idle node: node01.
    job = c.sbatch("-N", "1", "--requeue", "--wrap", "sleep 2")
    c.wait_for(lambda: "DRAIN" in c.node_state("node01"), 60, "node01 drained by the prolog")
    reason = c.node("node01")["Reason"]
    assert reason.startswith("rsc_health:now:gpu_process_leftover:gpu5 pid 4321 (python3"), \
        reason
    records = [r for r in c.spool("node01") if r.get("check") == "leftover"
               and r.get("code") == "gpu_process_leftover"]
    # What it is reaches the historian in the record's reason (the spool keeps no data); no
    # /etc/passwd in the node's root: the user is its uid.
    assert records and records[0]["reason"] == ("gpu5 pid 4321 (python3, uid 0, 30720 MiB) left "
                                                "by job 77, which no longer runs here")
    assert records[0]["severity"] == "drain_now" and records[0]["job_id"] == job
    c.wait_for(lambda: c.job_state(job) == "COMPLETED", 120, "job COMPLETED elsewhere")
    info = c.job(job)
    assert info["NodeList"] != "node01" and int(info["Restarts"]) >= 1
