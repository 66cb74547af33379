"""A state dir that turns read-only (the filesystem under /var remounted ro after disk errors,
a full or frozen disk): the node path can neither keep its cursor nor spool, but it can still
look and still act. It must not go blind: the lock is taken on a read-only fd, the checks run,
a drain verdict drains (and, in the sweep, requeues) with its own reason, and the operator is
told the state dir refuses writes. The events stay unconsumed for a run that can record them.

Reproduced for real: a read-only bind mount over the state dir (EROFS even for root)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from rsc_health import nodepath
from rsc_health.slurm.memory import MemorySlurm
from tests.fixtures.nodes.node_copy import NODE_STATE

from .test_nodepath_faults import XID79, node_env  # noqa: F401 - the fixture

NODE = "node01"


def node01_slurm() -> MemorySlurm:
    """node01 running job 777 (MIXED), on the node path's own clock (a test that moves
    nodepath.utcnow moves the time Slurm stamps on a drain)."""
    slurm = MemorySlurm([NODE], now=lambda: nodepath.utcnow())
    slurm.start_job(NODE, "777", whole_node=False)
    return slurm


def slurm_away() -> MemorySlurm:
    slurm = node01_slurm()
    slurm.stop()  # slurmctld not answering
    return slurm


@pytest.fixture
def read_only_state(node_env):  # noqa: F811 - pytest fixture by name
    sdir = node_env / NODE_STATE
    slurm = node01_slurm()
    # A first, healthy sweep: the state dir, its lock file, cursor and baselines exist.
    assert nodepath.run_stage("sweep", slurm_factory=lambda cfg, d: slurm) == 0
    assert (sdir / nodepath.LOCK_FILE).exists()
    for argv in (["mount", "--bind", str(sdir), str(sdir)],
                 ["mount", "-o", "remount,ro,bind", str(sdir)]):
        done = subprocess.run(argv, capture_output=True)
        if done.returncode != 0:
            subprocess.run(["umount", "-l", str(sdir)], capture_output=True)
            pytest.skip(f"cannot make a read-only bind mount here: {done.stderr.decode()[:200]}")
    try:
        (sdir / "probe").write_text("x")
    except OSError:
        pass
    else:
        subprocess.run(["umount", "-l", str(sdir)], capture_output=True)
        pytest.skip("the bind mount is not read-only here")
    yield node_env, sdir
    subprocess.run(["umount", "-l", str(sdir)], capture_output=True)


# Job 777 is another job on the node (the run's own is 4242): the prolog requeues it too.
@pytest.mark.parametrize(("entry", "code", "requeued"), [("prolog", 1, True),
                                                         ("sweep", 0, True)])
def test_a_read_only_state_dir_still_drains_a_lost_gpu(read_only_state, capsys, entry, code,
                                                       requeued):
    root, sdir = read_only_state
    (root / "dev/kmsg").open("a").write(XID79)
    slurm = node01_slurm()

    assert nodepath.run_stage(entry, slurm_factory=lambda cfg, d: slurm) == code

    drains = [c for c in slurm.calls if c[0] == "drain"]
    assert len(drains) == 1 and drains[0][2].startswith("rsc_health:now:xid79:")
    assert (("requeue", "777") in slurm.calls) is requeued
    err = capsys.readouterr().err
    assert "cannot write the spool" in err and "Read-only file system" in err
    # Nothing was consumed: a run that can record the XID will still see it.
    assert not (Path(sdir) / "probe").exists()


def test_a_read_only_state_dir_with_nothing_wrong_lets_the_job_run(read_only_state, capsys):
    slurm = node01_slurm()
    assert nodepath.run_stage("prolog", slurm_factory=lambda cfg, d: slurm) == 0
    assert slurm.calls == []
    assert "Read-only file system" in capsys.readouterr().err
