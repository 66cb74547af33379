"""The real Slurm cluster shared by every test in tests/slurm (one per session: ~10 s to start).

`slurm_cluster` is an RscHealthCluster (tests/slurm/cluster.py): run(argv), sbatch(...),
wait_for(pred, timeout), node(name), job(id), sacct(id), sweep(node), root(node), spool(node).
Every test gets it reset: no jobs, all nodes IDLE, every node root a fresh `healthy` copy.
"""

from __future__ import annotations

import pytest

from .cluster import RscHealthCluster, slurm_available


@pytest.fixture(scope="session")
def _slurm_cluster_session(tmp_path_factory):
    if not slurm_available():
        pytest.skip("slurmctld is not installed")
    cluster = RscHealthCluster(tmp_path_factory.mktemp("slurm"), nodes=6)
    cluster.start()
    yield cluster
    # The session's end: nothing of the cluster is kept, so a daemon a test left stopped
    # (SIGSTOP) or busy is killed after 3 s, not waited for the 15 s each worker's last test
    # showed as its teardown (an idle cluster stops in half a second).
    cluster.stop(timeout=3)


@pytest.fixture
def slurm_cluster(_slurm_cluster_session):
    cluster = _slurm_cluster_session
    if "slurmctld" not in cluster.procs or cluster.procs["slurmctld"].poll() is not None:
        cluster.start_slurmctld()
    cluster.reset()
    return cluster
