"""The management host's Slurm rights (docs/deployment.md, "Deploy from nothing", step 4), on a
real Slurm with accounting: which `sacctmgr ... adminlevel=` lets a user that is not root make
the MAINT reservations of `qualify start`, read every user's jobs, and drain and resume nodes
(lemons --apply, qualify). `nobody` stands in for rsc-health (no user is added to the
machine)."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from .cluster import SlurmCluster, slurm_available

pytestmark = [
    pytest.mark.slurm,
    pytest.mark.skipif(not slurm_available(), reason="slurmctld is not installed"),
    pytest.mark.skipif(shutil.which("mariadb") is None, reason="no MariaDB for slurmdbd"),
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user"),
]

USER = "nobody"


@pytest.fixture(scope="module")
def cluster():
    # Its own small cluster under a directory the other user can reach (pytest's is 0700),
    # with its munge socket open to it as a real node's is.
    base = Path(tempfile.mkdtemp(prefix="rsc-operator-", dir="/tmp"))
    base.chmod(0o755)
    c = SlurmCluster(base, nodes=2)
    try:
        c.start()
        (base / "munge").chmod(0o755)
        yield c
    finally:
        c.stop()
        shutil.rmtree(base, ignore_errors=True)


def _as_user(c: SlurmCluster, argv: list[str]) -> subprocess.CompletedProcess:
    pw = pwd.getpwnam(USER)

    def drop() -> None:
        os.setgroups([])
        os.setgid(pw.pw_gid)
        os.setuid(pw.pw_uid)

    return subprocess.run(argv, env=dict(c.env, HOME="/"), capture_output=True, text=True,
                          timeout=30, preexec_fn=drop, cwd="/")


def test_operator_reserves_but_only_administrator_drains_and_resumes(cluster):
    """Slurm 22.05: AdminLevel=Operator may create and delete reservations and read every
    user's jobs, but a node update (drain, resume) needs Administrator ("Security violation,
    UPDATE_NODE RPC" in slurmctld's log otherwise); the management host's lemon and qualify
    drains need the latter (docs/deployment.md, step 4)."""
    c = cluster
    drain = ["scontrol", "update", "nodename=node01", "state=drain",
             "reason=rsc_health:lemon:test"]
    reserve = ["scontrol", "create", "reservation", "reservationname=rsc_q_test",
               "starttime=now", "duration=10", "nodes=node02", "users=root",
               "flags=maint,ignore_jobs"]
    unreserve = ["scontrol", "delete", "reservationname=rsc_q_test"]
    assert _as_user(c, drain).returncode != 0
    assert "Invalid user id" in _as_user(c, reserve).stderr

    c.run(["sacctmgr", "-i", "add", "user", USER, "account=root", "adminlevel=operator"])
    # slurmdbd pushes the change to slurmctld within a moment.
    c.wait_for(lambda: _as_user(c, reserve).returncode == 0, 20, "the operator's reservation")
    assert _as_user(c, unreserve).returncode == 0
    every_job = _as_user(c, ["sacct", "-a", "-X", "-n", "-S", "2020-01-01"])
    assert every_job.returncode == 0, every_job.stderr
    refused = _as_user(c, drain)
    assert refused.returncode != 0 and "Invalid user id" in refused.stderr
    assert "DRAIN" not in c.node_state("node01")

    c.run(["sacctmgr", "-i", "modify", "user", USER, "set", "adminlevel=admin"])
    c.wait_for(lambda: _as_user(c, drain).returncode == 0, 20, "the administrator's drain")
    assert "DRAIN" in c.node_state("node01")
    resumed = _as_user(c, ["scontrol", "update", "nodename=node01", "state=resume"])
    assert resumed.returncode == 0, resumed.stderr
    c.wait_for(lambda: "DRAIN" not in c.node_state("node01"), 20, "node01 resumed")


def test_a_reservation_admits_only_the_jobs_of_the_users_it_names_whatever_their_level(
        cluster):
    """Slurm 22.05: an Administrator's batch job into a reservation for root alone is refused
    ("Access denied to requested reservation"); into one naming the Administrator, it runs.
    So the qualification flow run by the rsc-health timer must name rsc-health in its
    reservation (MemorySlurm models this refusal: tests/unit/test_qualify_as_the_timers_user.py)."""
    c = cluster
    if c.run(["sacctmgr", "-i", "add", "user", USER, "account=root", "adminlevel=admin"],
             check=False).returncode != 0:
        c.run(["sacctmgr", "-i", "modify", "user", USER, "set", "adminlevel=admin"])
    for users in ("root", USER):
        name = f"rsc_q_{users}"
        reserve = ["scontrol", "create", "reservation", f"reservationname={name}",
                   "starttime=now", "duration=infinite", "nodes=node02", f"users={users}",
                   "flags=maint,ignore_jobs"]
        c.wait_for(lambda reserve=reserve: _as_user(c, reserve).returncode == 0, 20,
                   f"the administrator's reservation for {users}")
        job = _as_user(c, ["sbatch", "--parsable", f"--reservation={name}", "-w", "node02",
                           "--exclusive", "--output=/dev/null", "--wrap", "true"])
        if users == "root":
            assert job.returncode != 0
            assert "Access denied to requested reservation" in job.stderr
        else:
            assert job.returncode == 0, job.stderr
            job_id = job.stdout.strip()
            c.wait_for(lambda job_id=job_id: c.job_state(job_id) == "COMPLETED", 30,
                       "the job in the reservation naming its user")
        assert _as_user(c, ["scontrol", "delete", f"reservationname={name}"]).returncode == 0
