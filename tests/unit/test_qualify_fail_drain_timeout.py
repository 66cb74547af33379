"""A qualification FAIL whose drain times out after slurmctld applied it: the flow stops with
the reservation kept (as designed) but no repair ticket; `qualify cleanup` then writes
rsc_health:qualify:interrupted over the fail drain. The fail (a repair) becomes a retry code:
`qualify auto` re-runs the node and a flaky pass puts it back in service, with no ticket."""
from __future__ import annotations

import pytest

from rsc_health.policy import parse_reason
from rsc_health.qualify.flow import RETRY_CODES, Flow, cleanup
from rsc_health.qualify.judge import FAIL
from rsc_health.slurm.api import SlurmError
from rsc_health.slurm.memory import MemorySlurm
from tests.unit.test_qualify_triggers import History

XID79 = "rsc_health:now:xid79:gpu3 fell off the bus"


def test_a_fail_whose_drain_answer_was_lost_is_not_turned_into_a_retry(tmp_path):
    slurm = MemorySlurm()
    slurm.add_node("gpu042", "IDLE+DRAIN", XID79)
    hist = History(result=(FAIL, "gpu_burn: gflops[3] 40% under the peers' median"))

    def job_runs():
        for jid, job in list(slurm._jobs.items()):
            if job.state == "PENDING":
                slurm.start_job("gpu042", jid)
                slurm.end_job(jid)

    slurm.after("submit", job_runs)
    # The fail's drain lands, and its answer is lost (scontrol timed out after applying).
    orig_drain = slurm.drain

    def drain_then_timeout(node, reason):
        slurm.stop_after("drain", answered=False)
        return orig_drain(node, reason)

    slurm.drain = drain_then_timeout
    flow = Flow(slurm, hist, command=["healthctl"], tier="full", timeout_s=5, poll_s=0.01)
    with pytest.raises(SlurmError):
        flow.run("gpu042")
    slurm.drain = orig_drain
    slurm.start()
    assert parse_reason(slurm.info["gpu042"].reason)["code"] == "gpu_burn"  # the fail landed
    cleanup(slurm, hist)
    code = parse_reason(slurm.info["gpu042"].reason)["code"]
    assert code not in RETRY_CODES and hist.tickets, (
        f"the qualification FAIL became {code!r} (a retry) with tickets={hist.tickets}")
