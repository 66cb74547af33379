"""Issue 12 on the real Slurm: job names cannot steer an action, a person's DOWN is never
touched, and the guard holds at its limit when every node sweeps at the same instant."""

from __future__ import annotations

import os
import threading

import pytest

from .test_cluster_scenarios import drained_nodes, inject_xid79, wait_running_past_prolog

pytestmark = pytest.mark.slurm


def test_a_latin1_named_job_on_a_node_with_xid79_is_requeued_and_nothing_crashes(
        slurm_cluster):
    c = slurm_cluster
    job = c.sbatch("-w", "node01", "--requeue", "-J", "caf\xe9", "--wrap", "sleep 30")
    wait_running_past_prolog(c, job)
    c.run(["scontrol", "update", f"jobid={job}", "name=r\xe9sum\xe9 |x\nKey=Value"],
          check=False)
    inject_xid79(c, "node01")
    out = c.sweep("node01")
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    assert c.node("node01")["Reason"].startswith("rsc_health:now:xid79")
    actions = [(r["action"], r["job_id"]) for r in c.spool("node01") if r["kind"] == "action"]
    assert ("requeue", job) in actions


def test_a_forged_job_list_row_in_a_job_name_requeues_no_other_job(slurm_cluster):
    c = slurm_cluster
    victim = c.sbatch("-w", "node02", "--requeue", "--wrap", "sleep 60")
    wait_running_past_prolog(c, victim)
    forged = f"x\n{victim}|RUNNING|node01|1|root|debug"
    attacker = c.sbatch("-w", "node01", "--requeue", "-J", forged, "--wrap", "sleep 60")

    def state(job):  # squeue: the test's own `scontrol show job` parsing is split by the name
        return c.run(["squeue", "-h", "-j", job, "-o", "%T"]).stdout.strip()

    c.wait_for(lambda: state(attacker) == "RUNNING" and any(
        r["kind"] == "job_start" and r["job_id"] == attacker for r in c.spool("node01")),
        60, "attacker RUNNING past its prolog")
    inject_xid79(c, "node01")
    assert c.sweep("node01").returncode == 0
    requeued = [r["job_id"] for r in c.spool("node01")
                if r["kind"] == "action" and r["action"] == "requeue"]
    assert requeued == [attacker]
    assert state(victim) == "RUNNING" and c.job(victim)["Restarts"] == "0"


def test_a_persons_down_node_is_never_drained_nor_resumed(slurm_cluster):
    c = slurm_cluster
    c.run(["scontrol", "update", "NodeName=node03", "State=DOWN", "Reason=bob: dead PSU, RMA 123"])
    inject_xid79(c, "node03")
    for _ in range(3):
        assert c.sweep("node03").returncode == 0
    node = c.node("node03")
    assert "DOWN" in node["State"] and node["Reason"].startswith("bob: dead PSU, RMA 123")
    # Nothing done in Slurm; the verdict is kept (said once, then tried on the backoff).
    assert [r["action"] for r in c.spool("node03") if r["kind"] == "action"] == [
        "held_under_drain"]
    c.run(["scontrol", "update", "NodeName=node03", "State=RESUME"], check=False)


def test_the_guard_holds_at_its_limit_when_every_node_sweeps_at_the_same_instant(
        slurm_cluster):
    c = slurm_cluster
    for node in c.node_names:
        inject_xid79(c, node)
    barrier = threading.Barrier(len(c.node_names))
    outs = {}

    def sweep(node):
        barrier.wait()
        outs[node] = c.sweep(node)

    threads = [threading.Thread(target=sweep, args=(n,)) for n in c.node_names]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert all(o.returncode == 0 for o in outs.values()), {n: o.stderr for n, o in outs.items()}
    # guard_max_share 0.34 of 6 nodes: at most 2 drained, the others keep their verdict.
    drained = drained_nodes(c)
    assert 1 <= len(drained) <= 2, drained
    held = [n for n in c.node_names if n not in drained]
    for node in held:
        assert (c.root(node) / "var/lib/rsc_health/pending_verdict.json").exists(), node


def test_a_het_job_component_on_a_draining_node_is_requeued_through_its_leader(
        slurm_cluster, tmp_path):
    """squeue lists a heterogeneous job's second component on its node under its own id, and
    `scontrol requeue` of it says "Job not heterogeneous job leader": the Actor raised on it,
    so the drain was never spooled, and the jobs after it on the node were never requeued.
    The whole het job is requeued through its leader, and the drain is on record."""
    c = slurm_cluster
    script = tmp_path / "het.sh"
    script.write_text("#!/bin/sh\n#SBATCH -N1 -w node01 --requeue\n#SBATCH hetjob\n"
                      "#SBATCH -N1 -w node02 --requeue\nsleep 300\n")
    leader = c.sbatch(str(script))
    component = str(int(leader) + 1)
    other = c.sbatch("-w", "node02", "--requeue", "--wrap", "sleep 300")
    wait_running_past_prolog(c, other)
    c.wait_for(lambda: c.run(["squeue", "-h", "-j", component, "-o", "%T"]).stdout.strip()
               == "RUNNING", 60, "het component RUNNING")
    inject_xid79(c, "node02")
    out = c.sweep("node02")
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    actions = [(r["action"], r["job_id"]) for r in c.spool("node02") if r["kind"] == "action"]
    assert ("drain_now", None) in actions, actions
    assert ("requeue", component) in actions and ("requeue", other) in actions, actions
    def states():
        return set(c.run(["squeue", "-h", "-j", leader, "-o", "%T"]).stdout.split())

    c.wait_for(lambda: states() and states() <= {"PENDING", "COMPLETING"}, 30,
               "the het job requeued, both components")
    assert c.job(leader)["Restarts"] == "1"


def test_a_job_its_user_stopped_on_an_xid79_node_is_requeued_too(slurm_cluster):
    """`scancel -s STOP` (any user, their own job) puts a job in STOPPED: it keeps its
    allocation on the node, and squeue listed only RUNNING, CONFIGURING, COMPLETING and
    SUSPENDED jobs, so a drain-now never requeued it; sent CONT, it ran on at the broken GPU."""
    c = slurm_cluster
    job = c.sbatch("-w", "node04", "--requeue", "--wrap", "sleep 300")
    wait_running_past_prolog(c, job)
    c.run(["scancel", "-s", "STOP", job])
    c.wait_for(lambda: c.job_state(job) == "STOPPED", 30, "job STOPPED")
    inject_xid79(c, "node04")
    out = c.sweep("node04")
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    actions = [(r["action"], r["job_id"]) for r in c.spool("node04") if r["kind"] == "action"]
    assert ("requeue", job) in actions, actions
    c.wait_for(lambda: c.job_state(job) in ("PENDING", "COMPLETING"), 30, "requeued")


def test_an_interactive_allocation_on_an_xid79_node_is_reported_and_the_rest_requeued(
        slurm_cluster):
    """salloc/srun allocations say Requeue=1 in squeue, and `scontrol requeue` answers "Only
    batch jobs are accepted or processed": the Actor raised on it, so the drain was never
    spooled and the batch job beside it never requeued, on every sweep. Now it is that job's
    requeue_refused, reported once, and the batch job is requeued."""
    c = slurm_cluster
    c.run(["salloc", "-w", "node05", "--no-shell"])
    interactive = c.run(["squeue", "-h", "-w", "node05", "-o", "%i"]).stdout.split()[0]
    batch = c.sbatch("-w", "node05", "--requeue", "--oversubscribe", "--wrap", "sleep 300")
    wait_running_past_prolog(c, batch)
    inject_xid79(c, "node05")
    try:
        out = c.sweep("node05")
        assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
        actions = [(r["action"], r["job_id"], r.get("detail", ""))
                   for r in c.spool("node05") if r["kind"] == "action"]
        assert ("drain_now", None) in [a[:2] for a in actions], actions
        assert ("requeue", batch) in [a[:2] for a in actions], actions
        [refused] = [a for a in actions if a[:2] == ("requeue_refused", interactive)]
        assert "Only batch jobs" in refused[2]
        assert c.sweep("node05").returncode == 0  # reported once per drain
        assert len([r for r in c.spool("node05") if r["kind"] == "action"
                    and r["action"] == "requeue_refused"]) == 1
    finally:
        c.run(["scancel", interactive], check=False)


def test_a_transient_drain_whose_reason_was_clipped_after_a_space_is_auto_resumed(
        slurm_cluster, tmp_path, monkeypatch):
    """A reason clipped to 120 characters just after a space kept the space: Slurm stores
    it, scontrol prints it before " [user@time]" and the reason read back has none, so the
    drain record ("...there ") never matched Slurm's ("...there") and a transient drain
    (a lost mount) was never auto-resumed."""
    from rsc_health.actions import Actor
    from rsc_health.config import load_config
    from rsc_health.model import Finding, Severity, Status
    from rsc_health.policy import decide
    from rsc_health.slurm.cli_backend import CliSlurm

    c = slurm_cluster
    monkeypatch.setenv("SLURM_CONF", c.env["SLURM_CONF"])
    lost = Finding("mount", "/lustre/scratch", Status.FAIL, Severity.DRAIN_NOW,
                   "x" * 74 + " is not mounted there where it should be", "mount_missing",
                   False)
    actor = Actor(CliSlurm(timeout_s=20), load_config(os.devnull), "node06", tmp_path,
                  log=lambda m: None)
    assert [a.action for a in actor.apply(decide([lost]))] == ["drain_now"]
    assert "DRAIN" in c.node_state("node06")
    for _ in range(3):  # [actions] resume_after_clean_sweeps
        done = actor.apply(decide([]), clean_sweep=True)
    assert [a.action for a in done] == ["resume"]
    assert "DRAIN" not in c.node_state("node06")


def test_a_dead_gpu_drains_while_another_nodes_features_read_like_a_state(slurm_cluster,
                                                                            tmp_path):
    """node03's Features were set to "a State=IDLE" (Slurm takes it). The fleet listing, which a
    node's first drain reads for the guard, raised on node03's record: node04's fallen GPU was
    never drained while that text stood, on every sweep. Now node03 alone is refused (named by
    healthctl status) and node04 drains."""
    c = slurm_cluster
    c.run(["scontrol", "update", "NodeName=node03", "AvailableFeatures=a State=IDLE",
           "ActiveFeatures=a State=IDLE"])
    try:
        inject_xid79(c, "node04")
        out = c.sweep("node04")
        assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
        assert "node04" in drained_nodes(c), c.node("node04")
        assert "DRAIN" not in c.node_state("node03")
        from .test_healthctl_slurm import healthctl

        status = healthctl(c, "status", root=tmp_path)
        assert status.returncode == 1 and "refused: 1 node(s)" in status.stdout, status.stdout
        assert "node03" in status.stdout and "Traceback" not in status.stderr
    finally:
        c.run(["scontrol", "update", "NodeName=node03", "AvailableFeatures=",
               "ActiveFeatures="], check=False)


def _xid79_actor(c, node, tmp_path, slurm=None):
    """The Actor a sweep on `node` builds, on the real cluster (no settle wait)."""
    from rsc_health.actions import Actor
    from rsc_health.config import load_config
    from rsc_health.slurm.cli_backend import CliSlurm

    actor = Actor(slurm or CliSlurm(timeout_s=20), load_config(os.devnull), node, tmp_path,
                  log=lambda m: None)
    actor.sleep = lambda s: None
    return actor


def _xid79_verdict():
    from rsc_health.model import Finding, Severity, Status
    from rsc_health.policy import decide

    return decide([Finding("gpu", "gpu3", Status.FAIL, Severity.DRAIN_NOW,
                           "fell off the bus", "xid79", True)])


def test_an_array_task_on_an_xid79_node_is_requeued_alone_never_its_whole_array(
        slurm_cluster, tmp_path, monkeypatch):
    """squeue's JobID is an array task's own job id, and an array's last task holds the
    array's own id: `scontrol requeue` of that id requeues every task of the array. A dead
    GPU under that one task sent the whole array back to the queue, the tasks on healthy
    nodes too. Now the task is named as Slurm names it (<array>_<task>) and goes alone."""
    c = slurm_cluster
    monkeypatch.setenv("SLURM_CONF", c.env["SLURM_CONF"])
    array = c.sbatch("-a", "1-2", "--exclusive", "--requeue", "--wrap", "sleep 300")

    def tasks():  # {task: (its own job id, state, node)}
        out = c.run(["squeue", "-h", "-j", array, "-o", "%K|%A|%T|%N"]).stdout
        return {t: (jid, state, node) for t, jid, state, node in
                (line.split("|") for line in out.splitlines() if line)}

    c.wait_for(lambda: {s for _, s, _ in tasks().values()} == {"RUNNING"} and len(tasks()) == 2,
               60, "both tasks RUNNING")
    [(last, (_, _, bad))] = [(t, v) for t, v in tasks().items() if v[0] == array]
    [(other, (other_id, _, healthy))] = [(t, v) for t, v in tasks().items() if t != last]
    assert bad != healthy
    actions = _xid79_actor(c, bad, tmp_path).apply(_xid79_verdict())
    assert [a.action for a in actions] == ["drain_now", "requeue"], actions
    assert actions[1].job_id == array  # reported under the id its job_start carries
    c.wait_for(lambda: tasks()[last][1] in ("PENDING", "COMPLETING"), 30, "task requeued")
    assert tasks()[other][1:] == ("RUNNING", healthy)
    assert c.job(other_id)["Restarts"] == "0"


def test_a_job_that_ended_after_the_listing_is_never_requeued_to_run_again(
        slurm_cluster, tmp_path, monkeypatch):
    """Slurm requeues a finished job too: one its user cancelled (or that completed) between
    squeue's listing and `scontrol requeue` went back to the queue and ran again. Now the
    requeue asks for jobs not yet finished only (`scontrol requeue Incomplete`)."""
    from rsc_health.slurm.cli_backend import CliSlurm

    c = slurm_cluster
    monkeypatch.setenv("SLURM_CONF", c.env["SLURM_CONF"])
    job = c.sbatch("-w", "node03", "--requeue", "--wrap", "sleep 300")
    wait_running_past_prolog(c, job)

    class TheUserCancelsMeanwhile(CliSlurm):
        def jobs_on_node(self, node):
            listed = super().jobs_on_node(node)
            c.run(["scancel", job])
            c.wait_for(lambda: c.job_state(job) == "CANCELLED"
                       and "COMPLETING" not in c.node_state("node03"), 30, "job cancelled")
            return listed

    actor = _xid79_actor(c, "node03", tmp_path, TheUserCancelsMeanwhile(timeout_s=20))
    assert [a.action for a in actor.apply(_xid79_verdict())] == ["drain_now"]
    assert "DRAIN" in c.node_state("node03")
    record = c.job(job)
    assert (record["JobState"], record["Restarts"]) == ("CANCELLED", "0"), record


def test_a_slurm_conf_that_makes_every_command_say_error_still_drains_and_requeues(
        slurm_cluster, tmp_path, monkeypatch):
    """A node line whose CPUs match no Sockets*Cores*Threads (common, and harmless: Slurm
    resets it) makes every client print "error: NodeNames=... Resetting CPUs." and exit 0,
    reads and changes alike. A change that said "error" on exit 0 counted as refused: the
    drain that had landed raised (the verdict kept pending, the job left running on the dead
    GPU until the next run) and the requeue that was done was reported as refused. An error
    line a read printed too is the config's, not the change's."""
    import subprocess

    c = slurm_cluster
    conf = tmp_path / "slurm.conf"  # the clients' copy: slurmctld keeps its own
    conf.write_text("".join(
        line.replace("CPUs=2 ", "CPUs=3 Sockets=1 CoresPerSocket=2 ThreadsPerCore=1 ")
        if line.startswith("NodeName=node06 ") else line
        for line in c.conf.read_text().splitlines(keepends=True)))
    monkeypatch.setenv("SLURM_CONF", str(conf))
    read = subprocess.run(["scontrol", "show", "node", "node01"], capture_output=True,
                          text=True, check=True)
    assert "error: NodeNames=node06 CPUs=3 match no Sockets" in read.stderr, read.stderr
    job = c.sbatch("-w", "node02", "--requeue", "--wrap", "sleep 300")
    wait_running_past_prolog(c, job)
    actions = _xid79_actor(c, "node02", tmp_path / "state").apply(_xid79_verdict())
    assert [(a.action, a.job_id) for a in actions] == [("drain_now", None), ("requeue", job)]
    assert "DRAIN" in c.node_state("node02")
    c.wait_for(lambda: c.job_state(job) in ("PENDING", "COMPLETING"), 30, "job requeued")


def test_a_persons_down_set_between_our_read_and_our_resume_is_kept(slurm_cluster, tmp_path,
                                                                     monkeypatch):
    """Our transient drain, clean sweeps counted: the resume follows a read of the node. A
    person who set it DOWN ("bob: PSU smoking", slurmd already stopped) in between had it put
    back in service: RESUME lifts a DOWN too. Our resume now lifts our drain alone (UNDRAIN):
    their DOWN and reason stay. (slurmd is stopped so that ReturnToService=2 cannot end the
    DOWN at its next ping: that would be Slurm's doing, not ours.)"""
    from rsc_health.model import Finding, Severity, Status
    from rsc_health.policy import decide
    from rsc_health.slurm.cli_backend import CliSlurm

    c = slurm_cluster
    monkeypatch.setenv("SLURM_CONF", c.env["SLURM_CONF"])

    class APersonDownsItMeanwhile(CliSlurm):
        def _run(self, argv, timeout_s=None):
            if argv[:2] == ["scontrol", "update"] and argv[-1] in ("State=RESUME",
                                                                   "State=UNDRAIN"):
                c.run(["scontrol", "update", "NodeName=node05", "State=DOWN",
                       "Reason=bob: PSU smoking"])
            return super()._run(argv, timeout_s)

    actor = _xid79_actor(c, "node05", tmp_path, APersonDownsItMeanwhile(timeout_s=20))
    lost = Finding("mount", "/lustre", Status.FAIL, Severity.DRAIN_AFTER_JOB, "not mounted",
                   "mount_missing", False)
    assert [a.action for a in actor.apply(decide([lost]))] == ["drain_after_job"]
    for _ in range(2):  # [actions] resume_after_clean_sweeps: 3
        assert actor.apply(decide([]), clean_sweep=True) == []
    slurmd = c.procs.pop("slurmd-node05")  # reset() starts it again
    slurmd.terminate()
    slurmd.wait(15)
    done = actor.apply(decide([]), clean_sweep=True)
    assert [a.action for a in done] == ["resume"]
    node = c.node("node05")
    assert "DOWN" in node["State"] and node["Reason"].startswith("bob: PSU smoking"), node


def test_qualification_redrains_stamped_by_slurm_leave_the_guard_room_for_a_dead_gpu(
        slurm_cluster):
    """Two nodes qualification re-drained a moment ago (inconclusive, a fail the guard held),
    as the flow drains them: slurmctld stamps a fresh reason time on each. guard_max_share
    0.34 of 6 nodes is 2: before, those two filled it and node03's fallen GPU was held."""
    c = slurm_cluster
    for node, code in (("node01", "inconclusive"), ("node02", "guard_held")):
        c.run(["scontrol", "update", f"NodeName={node}", "State=DRAIN",
               f"Reason=rsc_health:qualify:{code}:job 7 ended (FAILED) with no stored result"])
    inject_xid79(c, "node03")
    out = c.sweep("node03")
    assert out.returncode == 0, out.stderr
    assert c.node("node03")["Reason"].startswith("rsc_health:now:xid79"), c.node("node03")
    assert "guard_tripped" not in [r["action"] for r in c.spool("node03")
                                   if r["kind"] == "action"]
