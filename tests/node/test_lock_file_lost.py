"""The node lock is a state file too: whatever stands at node.lock (a directory a person made,
a symlink, a socket) must not blind the node. Before, opening it (O_NOFOLLOW, for writing)
raised ELOOP or EISDIR, a checker fault at the lock step on every run for good: each prolog
exited 0, and a job started on the XID 79. The state dir itself is locked instead, said as
a checker error, and the run judges and moves its cursors as ever."""

from __future__ import annotations

import socket

import pytest

from rsc_health import nodepath
from tests.fixtures.nodes.node_copy import NODE_STATE

from .test_nodepath_faults import XID79, _records, node_env  # noqa: F401 - the fixture
from .test_state_dir_read_only import node01_slurm


def _stand(path, how: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if how == "directory":
        path.mkdir()
    elif how == "symlink":
        path.symlink_to("/etc/passwd")
    elif how == "dangling_symlink":
        path.symlink_to(path.parent / "nowhere")
    elif how == "socket":
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(path))
        sock.close()


@pytest.mark.parametrize("how", ["directory", "symlink", "dangling_symlink", "socket"])
def test_something_not_a_file_at_node_lock_never_blinds_the_node(node_env, how):  # noqa: F811
    sdir = node_env / NODE_STATE
    _stand(sdir / nodepath.LOCK_FILE, how)
    (node_env / "dev/kmsg").open("a").write(XID79)
    slurm = node01_slurm()
    assert nodepath.run_stage("prolog", slurm_factory=lambda c, d: slurm) == 1
    # job 777 is another job on the node: a prolog's drain now requeues it
    assert [c[0] for c in slurm.calls] == ["drain", "requeue"]
    codes = [r.get("code") for r in _records(node_env)]
    assert "checker_fault" not in codes and "lock_file" in codes
    # Judged under the lock: the XID was consumed, the next run does not judge it again.
    slurm = node01_slurm()
    nodepath.run_stage("sweep", slurm_factory=lambda c, d: slurm)
    assert codes.count("xid79") == [r.get("code") for r in _records(node_env)].count("xid79")
