"""The qualification flow run by the timer's user (rsc-health, AdminLevel=Administrator), not
root. Slurm 22.05 refuses a batch job into a reservation whose Users= does not name the job's
user, whatever its admin level ("Access denied to requested reservation": measured in
tests/slurm/test_operator_rights.py). The flow made its reservation for root alone, so every
qualification `rsc-health-qualify.timer` started was refused at sbatch, proved nothing and
drained the node again: no repaired node ever came back by itself. The reservation now names
the user the flow's Slurm calls run as (root when a person runs it as root)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from rsc_health.qualify.flow import Flow
from rsc_health.qualify.judge import PASS
from rsc_health.slurm.api import SlurmCommandError
from rsc_health.slurm.memory import MemorySlurm

XID79 = "rsc_health:now:xid79:gpu3 fell off the bus"


class History:
    def __init__(self):
        self.actions: list = []

    def strikes(self, node):
        return 0

    def now(self):  # the historian's clock
        return datetime.now(UTC)

    def result(self, node, job_id, since=None):
        return PASS, ""

    def action(self, node, kind, reason):
        self.actions.append((node, kind, reason))

    def repair_ticket(self, node, reason):
        raise AssertionError("a pass opens no ticket")


def test_memoryslurm_refuses_a_job_into_a_reservation_not_naming_its_user():
    slurm = MemorySlurm(["gpu001"], user="rsc-health")
    slurm.create_reservation("r1", "gpu001", users="root")
    with pytest.raises(SlurmCommandError, match="Access denied to requested reservation"):
        slurm.submit(["--reservation=r1"], ["true"])
    slurm.create_reservation("r2", "gpu001", users="rsc-health")
    assert slurm.submit(["--reservation=r2"], ["true"])


@pytest.mark.parametrize("user", ["rsc-health", "root"])
def test_the_timers_user_qualifies_a_repaired_node_and_releases_it(user):
    slurm = MemorySlurm(["gpu001", "gpu002"], user=user)
    slurm.add_node("gpu001", "IDLE+DRAIN", XID79)
    hist = History()
    result = Flow(slurm, hist, command=["healthctl"], tier="lite", timeout_s=5,
                  poll_s=0.01).run("gpu001")
    assert result.result == PASS, result
    assert "DRAIN" not in slurm.info["gpu001"].state
    assert slurm.reservations() == {}
    [made] = [c for c in slurm.calls if c[0] == "create_reservation"]
    assert made[3] == user
