"""A node that stops answering Slurm mid-qualification (a hang under the burn): Slurm ends the
qualification job NODE_FAIL. The flow submitted without --no-requeue, so with JobRequeue=1
Slurm started the job again in the reservation that still stood, and the second attempt's pass,
stored under the same job id, released the node that had just died under the stress. Now the
job cannot be requeued, a NODE_FAIL is a finding (a fail: drained, a repair ticket) whatever
the run's surviving process stored, and `qualify run` never stores a pass for an attempt Slurm
restarted (tests/slurm/test_qualify_flow.py proves the NODE_FAIL on the real Slurm)."""

from __future__ import annotations

import pytest

from rsc_health.policy import parse_reason
from rsc_health.qualify.flow import RETRY_CODES
from rsc_health.qualify.judge import FAIL, INCONCLUSIVE, PASS
from rsc_health.slurm.api import RequeueRefused
from rsc_health.slurm.memory import MemorySlurm
from tests.unit.test_qualify_parallel import XID79, History, flow
from tests.unit.test_qualify_run import Node, _setup


def test_a_drain_now_cannot_requeue_the_qualification_job_into_a_second_attempt():
    slurm = MemorySlurm()
    slurm.add_node("gpu001", "IDLE+DRAIN", XID79)
    refused = []

    def node_path_drains_now():
        jid = max(slurm._jobs)
        slurm.start_job("gpu001", jid, user="root")
        try:
            slurm.requeue(jid)  # what the node path's drain-now does to every job there
        except RequeueRefused as exc:
            refused.append(exc)

    slurm.after("submit", node_path_drains_now)
    r = flow(slurm, History(slurm, {"gpu001": PASS}, after=0.0)).run("gpu001")
    assert refused, "the qualification job was requeued: a second attempt could pass it"
    assert r.result == PASS


@pytest.mark.parametrize("stored", [None, PASS, INCONCLUSIVE])
def test_a_qualification_job_that_ends_node_fail_is_a_fail_with_a_ticket(stored):
    """Whatever the run's own process stored (it may outlive slurmd: a pass, a timeout's
    inconclusive) or nothing, the job's NODE_FAIL is the node's: drained, not with a retry
    code, and a repair ticket."""
    slurm = MemorySlurm()
    slurm.add_node("gpu001", "IDLE+DRAIN", XID79)

    class Died(History):
        def result(self, node, job_id, since=None):
            job = slurm.job(job_id)
            if stored is None or job is None or job.state != "NODE_FAIL":
                return None
            return stored, ""

    def node_dies():
        jid = max(slurm._jobs)
        slurm.start_job("gpu001", jid, user="root")
        slurm.set_state("gpu001", "DOWN*", "Not responding", user="slurm")
        slurm.end_job(jid, "NODE_FAIL", listed=True)

    slurm.after("submit", node_dies)
    hist = Died(slurm, {})
    r = flow(slurm, hist).run("gpu001")
    assert r.result == FAIL and "NODE_FAIL" in r.detail, r
    info = slurm.info["gpu001"]
    code = parse_reason(info.reason)["code"]
    assert info.drain_set and code == "node_fail" and code not in RETRY_CODES, info
    assert [n for n, _why in hist.tickets] == ["gpu001"]
    assert not slurm.reservations()


def test_qualify_run_of_a_job_slurm_restarted_stores_no_pass(tmp_path, hostengine_standin,
                                                              monkeypatch):
    cfg, db = _setup(tmp_path)
    for i, bw in enumerate((231.0, 230.2, 231.6, 229.9)):
        Node(tmp_path, f"peer{i}", busbw=bw).run(cfg, db)
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    res = Node(tmp_path, "gpu042").run(cfg, db)
    doc = res.output
    assert res.exit_code != 0, doc
    from sqlalchemy import create_engine, text

    with create_engine(db).connect() as conn:
        [(verdict, reason, job)] = conn.execute(text(
            "SELECT verdict, reason, job_id FROM qualify_runs WHERE node = 'gpu042'")).all()
    assert verdict == INCONCLUSIVE and job == "4242", (verdict, reason)
    assert "restarted 1 time" in reason


@pytest.mark.parametrize(("state", "result"), [("BOOT_FAIL", FAIL), ("DEADLINE", INCONCLUSIVE),
                                               ("REVOKED", INCONCLUSIVE)])
def test_a_job_in_any_other_end_state_ends_the_wait_at_once(state, result):
    """`squeue -t all` lists an ended job in its end state for MinJobAge. The flow knew seven
    ends: one that ended BOOT_FAIL or DEADLINE kept it polling for its whole timeout (70 min by
    default), holding the node in its reservation, then cancelled a job long over (helper-124).
    Any state that is not pending or running is an end; BOOT_FAIL (the node failed to boot or
    launch the job) is the node's, as NODE_FAIL is."""
    import time

    slurm = MemorySlurm()
    slurm.add_node("gpu001", "IDLE+DRAIN", XID79)

    def ends():
        jid = max(slurm._jobs)
        slurm.start_job("gpu001", jid, user="root")
        slurm.end_job(jid, state, listed=True)

    slurm.after("submit", ends)
    started = time.monotonic()
    r = flow(slurm, History(slurm, {})).run("gpu001")  # its timeout: 20 s
    assert time.monotonic() - started < 10, r
    assert r.result == result and state in r.detail, r
