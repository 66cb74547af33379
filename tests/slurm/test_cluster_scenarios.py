"""Issue 3's seven scenarios on a real Slurm (slurmctld + 6 slurmd + slurmdbd), each asserting
what Slurm itself reports. Faults are injected by editing a node's fixture root; the sweep is
run exactly as HealthCheckProgram runs it, the prolog and epilog are run by slurmd."""

from __future__ import annotations

import json
import signal
import time

import pytest

pytestmark = pytest.mark.slurm

GPU3_PCI = "0000:5d:00"  # gpu3 of the healthy fixture


def inject_xid79(cluster, node: str, seq: int = 1400) -> None:
    with (cluster.root(node) / "dev/kmsg").open("a") as fh:
        fh.write(f"3,{seq},36500000000,-;NVRM: Xid (PCI:{GPU3_PCI}): 79, pid=2814, "
                 "name=python3, GPU has fallen off the bus.\n")


def inject_remap_pending(cluster, node: str) -> None:
    path = cluster.root(node) / "rsc_health/nvml.json"
    doc = json.loads(path.read_text())
    doc["devices"][2]["remapped_rows"].update(pending=True, correctable=1)
    path.write_text(json.dumps(doc))


def remove_mount(cluster, node: str, mountpoint: str = "/checkpoint") -> str:
    path = cluster.root(node) / "proc/mounts"
    original = path.read_text()
    path.write_text("".join(line + "\n" for line in original.splitlines()
                            if f" {mountpoint} " not in line))
    return original


def sinfo_state(cluster, node: str) -> str:
    return cluster.run(["sinfo", "-h", "-N", "-n", node, "-o", "%T"]).stdout.strip()


def drained_nodes(cluster) -> list[str]:
    return [n for n in cluster.node_names if "DRAIN" in cluster.node_state(n)]


def hosts(cluster, nodelist: str) -> list[str]:
    return cluster.run(["scontrol", "show", "hostnames", nodelist]).stdout.split()


def wait_running_past_prolog(cluster, job: str) -> list[str]:
    """RUNNING and every node's prolog done (its job_start is spooled after the checks ran), so
    a fault injected now is found by the sweep, not by a prolog still looking."""
    cluster.wait_for(lambda: cluster.job_state(job) == "RUNNING", 60, "job RUNNING")
    nodes = hosts(cluster, cluster.job(job)["NodeList"])
    cluster.wait_for(
        lambda: all(any(r["kind"] == "job_start" and r["job_id"] == job
                        for r in cluster.spool(n)) for n in nodes),
        30, "prologs done",
    )
    cluster.wait_for(lambda: "CONFIGURING" not in cluster.job(job).get("JobState", "") and
                     cluster.job(job).get("Reason") != "Prolog", 30, "job out of prolog")
    return nodes


def sacct_states(cluster, job_id: str) -> list[tuple[str, str]]:
    return [(row[1].split()[0], row[2]) for row in cluster.sacct(job_id)]


def test_healthy_cluster_runs_a_4_node_job_and_drains_nothing(slurm_cluster):
    c = slurm_cluster
    job = c.sbatch("-N", "4", "--gres=gpu:8", "--wrap", "sleep 1")
    c.wait_for(lambda: c.job_state(job) == "COMPLETED", 60, "job COMPLETED")
    assert drained_nodes(c) == []
    nodes = c.job(job)["NodeList"]
    started = [n for n in c.node_names
               if any(r["kind"] == "job_start" and r["job_id"] == job for r in c.spool(n))]
    ended = [n for n in c.node_names
             if any(r["kind"] == "job_end" and r["job_id"] == job for r in c.spool(n))]
    # The prolog and the epilog ran on every node of the job, and only there.
    assert len(started) == 4 and len(ended) == 4 and set(started) == set(ended)
    assert set(started) == set(hosts(c, nodes))
    c.wait_for(lambda: sacct_states(c, job) == [("COMPLETED", nodes)], 30, "sacct COMPLETED")


def test_xid79_during_a_4_node_job_drains_now_and_the_job_requeues_elsewhere(slurm_cluster):
    c = slurm_cluster
    job = c.sbatch("-N", "4", "--requeue", "--wrap", "sleep 6")
    victim = wait_running_past_prolog(c, job)[1]
    first_nodes = c.job(job)["NodeList"]
    # A second job shares the victim and refuses requeue: it must be reported, not lost.
    stubborn = c.sbatch("-N", "1", "-n", "1", "-w", victim, "--no-requeue", "--wrap", "sleep 60")
    wait_running_past_prolog(c, stubborn)
    inject_xid79(c, victim)

    out = c.sweep(victim)
    assert out.returncode == 0, out.stderr
    node = c.node(victim)
    assert "DRAIN" in node["State"]
    assert node["Reason"].startswith("rsc_health:now:xid79:gpu3")
    actions = [(r["action"], r["job_id"]) for r in c.spool(victim) if r["kind"] == "action"]
    assert actions[0] == ("drain_now", None)
    assert sorted(actions[1:]) == [("requeue", job), ("requeue_refused", stubborn)]
    assert c.job(stubborn)["Restarts"] == "0"
    # The next sweep sees the GPU fail again while the stubborn job still runs on the drained
    # node: it acts, and the refusal, reported once, is not reported again.
    inject_xid79(c, victim, seq=1401)
    again = c.sweep(victim)
    # The requeued job is COMPLETING or PENDING by now: not a Slurm failure, nothing to requeue.
    assert again.returncode == 0 and "Slurm unavailable" not in again.stderr, again.stderr
    assert c.job_state(stubborn) == "RUNNING"
    refused = [r["job_id"] for r in c.spool(victim)
               if r["kind"] == "action" and r["action"] == "requeue_refused"]
    assert refused == [stubborn]

    # Same Job ID, restarted once, completed on nodes that exclude the drained one.
    c.wait_for(lambda: c.job_state(job) == "COMPLETED", 120, "requeued job COMPLETED")
    info = c.job(job)
    assert info["Restarts"] == "1"
    second = hosts(c, info["NodeList"])
    assert victim not in second and len(second) == 4
    c.wait_for(lambda: [s for s, _ in sacct_states(c, job)] == ["REQUEUED", "COMPLETED"], 30,
               "sacct -D: REQUEUED then COMPLETED")
    assert sacct_states(c, job)[0][1] == first_nodes


def test_row_remap_pending_lets_the_job_finish_then_the_node_is_drained(slurm_cluster):
    c = slurm_cluster
    job = c.sbatch("-N", "1", "-w", "node03", "--wrap", "sleep 6")
    wait_running_past_prolog(c, job)
    inject_remap_pending(c, "node03")

    assert c.sweep("node03").returncode == 0
    assert sinfo_state(c, "node03") == "draining"
    assert c.node("node03")["Reason"].startswith("rsc_health:job:remap_pending:gpu2")
    assert c.job_state(job) == "RUNNING"  # drain-after-job never requeues

    c.wait_for(lambda: c.job_state(job) == "COMPLETED", 60, "job COMPLETED")
    c.wait_for(lambda: sinfo_state(c, "node03") == "drained", 30, "node DRAINED")
    assert c.job(job)["Restarts"] == "0"
    c.wait_for(lambda: sacct_states(c, job) == [("COMPLETED", "node03")], 30, "sacct")


def test_prolog_finds_a_missing_mount_and_the_job_starts_elsewhere(slurm_cluster):
    c = slurm_cluster
    remove_mount(c, "node01")
    # With equal weights the scheduler takes the first idle node: node01.
    job = c.sbatch("-N", "1", "--requeue", "--wrap", "sleep 2")
    c.wait_for(lambda: "DRAIN" in c.node_state("node01"), 60, "node01 drained by the prolog")
    assert c.node("node01")["Reason"].startswith("rsc_health:now:mount_missing:/checkpoint")
    starts = [r for r in c.spool("node01") if r["kind"] == "job_start"]
    assert [r["job_id"] for r in starts] == [job]

    c.wait_for(lambda: c.job_state(job) == "COMPLETED", 120, "job COMPLETED elsewhere")
    info = c.job(job)
    assert info["NodeList"] != "node01" and int(info["Restarts"]) >= 1
    assert any(r["kind"] == "job_start" and r["job_id"] == job for r in c.spool(info["NodeList"]))


def test_a_persons_drain_stays_and_a_transient_drain_is_resumed(slurm_cluster):
    c = slurm_cluster
    c.run(["scontrol", "update", "NodeName=node02", "State=DRAIN", "Reason=bad fan ticket 42"])
    for _ in range(3):
        assert c.sweep("node02").returncode == 0
    assert "DRAIN" in c.node_state("node02")
    assert c.node("node02")["Reason"].startswith("bad fan ticket 42 [root@")

    original = remove_mount(c, "node04")
    c.sweep("node04")
    assert c.node("node04")["Reason"].startswith("rsc_health:now:mount_missing:")
    (c.root("node04") / "proc/mounts").write_text(original)  # the mount came back
    c.sweep("node04")
    assert "DRAIN" in c.node_state("node04")  # one clean sweep is not enough (config: 2)
    c.sweep("node04")
    assert "DRAIN" not in c.node_state("node04") and not c.node("node04").get("Reason")
    assert [r["action"] for r in c.spool("node04") if r["kind"] == "action"] == [
        "drain_now", "resume"]


def test_guard_stops_a_mass_drain_at_its_limit(slurm_cluster):
    c = slurm_cluster
    victims = c.node_names[:5]
    outputs = {}
    for node in victims:
        inject_xid79(c, node)
        outputs[node] = c.sweep(node)
    drained = drained_nodes(c)
    # guard_max_share 0.34 of 6 nodes: at most 2 drains in the window, the rest refused.
    assert len(drained) == 2
    refused = [n for n in victims if n not in drained]
    for node in refused:
        assert "GUARD TRIPPED" in outputs[node].stderr
        assert [r["action"] for r in c.spool(node) if r["kind"] == "action"] == ["guard_tripped"]
        assert "DRAIN" not in c.node_state(node)


@pytest.mark.parametrize("outage", ["stopped", "frozen"])
def test_sweep_survives_slurmctld_down_within_budget_and_acts_next_time(slurm_cluster, outage):
    # "stopped": connection refused at once. "frozen" (SIGSTOP): the port accepts and nothing
    # answers, as when scontrol hangs; only the per-call timeout gets the sweep out.
    c = slurm_cluster
    inject_xid79(c, "node05")
    ctld = c.procs["slurmctld"]
    if outage == "stopped":
        c.stop_slurmctld()
    else:
        ctld.send_signal(signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        out = c.sweep("node05", timeout=60)
        elapsed = time.monotonic() - t0
    finally:
        if outage == "stopped":
            c.start_slurmctld()
        else:
            ctld.send_signal(signal.SIGCONT)
    assert out.returncode == 0
    assert "Slurm unavailable" in out.stderr
    assert elapsed < 20 + 3  # [slurm] sweep_budget_s in the test site config, plus start-up
    c.wait_for(lambda: c.run(["scontrol", "ping"], check=False).returncode == 0, 30, "ping")
    c.wait_for(lambda: c.node_state("node05") in ("IDLE", "MIXED"), 60, "node05 back")

    out = c.sweep("node05")
    assert out.returncode == 0, out.stderr
    assert c.node("node05")["Reason"].startswith("rsc_health:now:xid79:gpu3")


def test_slurmd_runs_the_sweep_as_its_health_check_program(slurm_cluster):
    # slurmd ran HealthCheckProgram (the real checks/rsc-health-sweep, bare environment plus
    # the site defaults file) once at start-up, before registering, on every node.
    c = slurm_cluster
    for node in c.node_names:
        log = (c.base / "log" / f"sweep-{node}.log").read_text()
        assert f"rsc_health sweep {node}: OK" in log


def test_a_prolog_that_drains_now_requeues_the_job_already_running_on_the_node(
        slurm_cluster, tmp_path):
    """Job A runs on node03 (one GPU of it); an XID 79 is logged; job B's prolog finds it and
    drains node03 now. Slurm requeues B (its prolog failed); A ran on, on the GPU that fell off
    the bus, for good: the prolog requeued no other job, and had consumed the XID, so no sweep
    after it found one (helper-122). The prolog now requeues A; B runs elsewhere."""
    c = slurm_cluster
    a = c.sbatch("-N", "1", "-n", "1", "--gres=gpu:1", "-w", "node03", "--requeue",
                 "--wrap", "sleep 90")
    c.wait_for(lambda: c.job_state(a) == "RUNNING" and any(
        r["kind"] == "job_start" and r["job_id"] == a for r in c.spool("node03")),
        60, "A running")
    inject_xid79(c, "node03")
    ran = tmp_path / "ranB"
    b = c.sbatch("-N", "1", "-n", "1", "--gres=gpu:1", "-w", "node03", "--requeue",
                 "--wrap", f"touch {ran}; sleep 1")
    c.wait_for(lambda: "DRAIN" in c.node_state("node03"), 60, "node03 drained by B's prolog")
    assert c.node("node03")["Reason"].startswith("rsc_health:now:xid79")
    c.wait_for(lambda: c.job(a).get("Restarts") == "1", 30, "A requeued")

    def requeued() -> list[str]:  # spooled as the prolog ends, a moment after the requeue
        return [r.get("job_id") for r in c.spool("node03")
                if r["kind"] == "action" and r["action"] == "requeue"]

    c.wait_for(lambda: requeued(), 30, "the prolog's requeue spooled")
    assert requeued() == [a]  # B is Slurm's to requeue: its prolog failed
    assert not ran.exists()  # B never ran on node03
    c.wait_for(lambda: c.job(b).get("Restarts") == "1", 30, "B requeued by Slurm")
