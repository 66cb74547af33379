"""The same story told to the real Slurm (CliSlurm on the test cluster) and to MemorySlurm
gives the same answers: node states, reasons and who set them, features and weights, jobs
requeued, refused and cancelled, reservations, the typed errors, and a controller gone."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from rsc_health.slurm import CliSlurm, SlurmError, SlurmUnavailable
from rsc_health.slurm.memory import MemorySlurm

pytestmark = pytest.mark.slurm
ENDED = ("COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL")


def _outcome(call):
    """What a call returned, or the name of the typed error it raised."""
    try:
        return call()
    except SlurmError as exc:
        return type(exc).__name__


def _node(slurm, name):
    n = slurm.node(name)
    return (n.state, n.reason, n.reason_user if n.reason else "", n.features, n.weight)


def _job(slurm, job_id):
    job = slurm.job(job_id)
    if job is None or job.state in ENDED:
        return "gone"
    return (job.state, job.nodes, job.requeue)


def story(slurm, run_job, settle) -> list:
    """Every step's answer. run_job(node, requeue) starts a whole-node job there and returns
    its id once it runs; settle(node) waits until the node has no job completing and answers
    slurmctld's ping (a resumed node reads IDLE+NOT_RESPONDING for a moment)."""
    seen = []
    say = seen.append
    say(_outcome(lambda: slurm.drain("node02", "rsc_health:now:xid79:gpu3 fell off the bus")))
    say(_node(slurm, "node02"))
    say(_outcome(lambda: slurm.drain("node02", "")))
    say(_outcome(lambda: slurm.resume("node03")))  # neither drained nor down
    say(_outcome(lambda: slurm.resume("node02")))
    settle("node02")
    say(_node(slurm, "node02"))
    say(_outcome(lambda: slurm.node("nosuchnode")))
    say(_outcome(lambda: slurm.drain("node[02-03]", "x")))

    job = run_job("node04", True)
    say(_node(slurm, "node04"))
    say([(j.state, j.nodes, j.requeue) for j in slurm.jobs_on_node("node04")])
    say(_outcome(lambda: slurm.drain("node04", "rsc_health:now:xid79:gpu0 fell off the bus")))
    say(_node(slurm, "node04")[0])
    say(_outcome(lambda: slurm.requeue(job)))
    settle("node04")
    say(_node(slurm, "node04")[0])
    say(_job(slurm, job))  # pending: -w node04, which is drained
    say(_outcome(lambda: slurm.requeue(job)))
    say(_outcome(lambda: slurm.cancel(job)))

    stuck = run_job("node05", False)
    say(_outcome(lambda: slurm.requeue(stuck)))
    say(_outcome(lambda: slurm.cancel(stuck)))
    settle("node05")
    say(_job(slurm, stuck))
    say(_node(slurm, "node05")[0])
    say(_outcome(lambda: slurm.cancel("999999")))

    say(_outcome(lambda: slurm.create_reservation("twin_res", "node06")))
    say(_outcome(lambda: slurm.create_reservation("twin_res", "node06")))
    nodes, start = slurm.reservations().get("twin_res", ("", None))
    say(nodes)
    say(start is not None and abs((start - datetime.now(UTC)).total_seconds()) < 120)
    say(_outcome(lambda: slurm.delete_reservation("twin_res")))
    say(_outcome(lambda: slurm.delete_reservation("twin_res")))
    say("twin_res" in slurm.reservations())

    say(_outcome(lambda: slurm.update_node("node03", features=["h200", "ib"], weight=50)))
    say(_node(slurm, "node03"))
    say(_outcome(lambda: slurm.update_node("node03", features=[])))
    say(_node(slurm, "node03"))
    say(_outcome(lambda: slurm.update_node("node03", weight=1)))
    say(_node(slurm, "node03"))
    return seen


def test_memoryslurm_answers_the_story_as_the_real_slurm_does(slurm_cluster, monkeypatch):
    c = slurm_cluster
    monkeypatch.setenv("SLURM_CONF", c.env["SLURM_CONF"])
    real = CliSlurm(timeout_s=20)

    def run_real(node, requeue):
        job = c.sbatch("-w", node, "--exclusive", "--requeue" if requeue else "--no-requeue",
                       "--wrap", "sleep 300")
        c.wait_for(lambda: c.job_state(job) == "RUNNING", 30, f"job {job} running")
        return job

    def settle(node):
        c.wait_for(lambda: not {"COMPLETING", "NOT_RESPONDING"} & set(
            c.node_state(node).split("+")) and not real.jobs_on_node(node), 30, f"{node} settled")

    try:
        on_real = story(real, run_real, settle)
    finally:
        c.run(["scontrol", "delete", "ReservationName=twin_res"], check=False)
        c.run(["scontrol", "update", "NodeName=node03", "AvailableFeatures=",
               "ActiveFeatures=", "Weight=1"], check=False)

    memory = MemorySlurm(c.node_names)
    on_memory = story(memory, lambda node, requeue: memory.start_job(node, requeue=requeue),
                      lambda node: None)
    differ = [(k, m, r) for k, (m, r) in enumerate(zip(on_memory, on_real, strict=True))
              if m != r]
    assert differ == [], "step, memory, real:\n" + "\n".join(map(repr, differ))

    c.stop_slurmctld()
    try:
        with pytest.raises(SlurmUnavailable):
            CliSlurm(timeout_s=10).node("node01")
    finally:
        c.start_slurmctld()
    memory.stop()
    with pytest.raises(SlurmUnavailable):
        memory.node("node01")
