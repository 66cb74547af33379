"""A prolog that has carried out a drain verdict (the node drained, its exit code chosen) and
then hangs or faults in what follows (the textfile on a directory whose server went away,
remembering the config on a stalled disk) must still leave with the verdict's code. Before,
the watchdog or the fault handler saw the verdict as acted on and chose the "let the job run"
exit: the job started on the node that had an XID 79."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.fixtures.nodes.node_copy import copy_node

from .conftest import FAULT, _fuse_available, start_fuse
from .test_nodepath_faults import REPO, XID79, node_env  # noqa: F401 - the fixture

SCRIPT = """
import sys
from rsc_health import nodepath
from tests.node.test_state_dir_read_only import node01_slurm
slurm = node01_slurm()
code = nodepath.run_stage(sys.argv[1], slurm_factory=lambda cfg, deadline: slurm)
print("calls", [c[0] for c in slurm.calls], file=sys.stderr)
raise SystemExit(code)
"""


@pytest.fixture
def hung_textfile_dir(tmp_path):
    if not _fuse_available():
        pytest.skip("FUSE (fusepy and /dev/fuse) is not available here")
    root = copy_node(tmp_path / "node")
    point = root / "var/lib/node_exporter"
    point.mkdir(parents=True)
    (root / "site.toml").write_text(
        (root / "config.toml").read_text()
        + '\n[node]\ntextfile_dir = "/var/lib/node_exporter"\n'
        + "\n[slurm]\nprolog_budget_s = 4\n")
    proc = start_fuse(point, FAULT / "hung_lookup_fuse.py", str(point))
    # The one thread serving the mount is taken by this lookup; the run's own wait queued.
    holder = subprocess.Popen(["stat", str(point / "holder" / "held")], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    time.sleep(0.5)
    yield root
    proc.kill()  # the kernel fails every waiter (the holder too)
    proc.wait(10)
    holder.wait(10)
    subprocess.run(["fusermount", "-u", "-z", str(point)], capture_output=True)


def _env(root: Path) -> dict:
    return {**os.environ, "PYTHONPATH": str(REPO), "RSC_HEALTH_ROOT": str(root),
            "RSC_HEALTH_CONFIG": str(root / "site.toml"), "SLURMD_NODENAME": "node01",
            "SLURM_JOB_ID": "4242"}


def test_a_prolog_that_drained_then_hung_on_its_textfile_still_fails_the_job(
        hung_textfile_dir):
    root = hung_textfile_dir
    with open(root / "dev/kmsg", "a") as fh:
        fh.write(XID79)
    out = subprocess.run([sys.executable, "-c", SCRIPT, "prolog"], capture_output=True,
                         text=True, timeout=60, cwd=REPO, env=_env(root))
    assert "still running after" in out.stderr and "during textfile" in out.stderr, out.stderr
    assert out.returncode == 1, out.stderr  # the verdict's code: the job goes elsewhere


def test_a_fault_after_the_prolog_drained_still_fails_the_job(node_env, monkeypatch):  # noqa: F811
    """Not a hang: a bug past acting (here remembering the config) ends in the fault handler,
    which chose 'let the job run' for a verdict it saw as carried out."""
    from rsc_health import nodepath

    from .test_state_dir_read_only import node01_slurm

    def broken(*args, **kwargs):
        raise RuntimeError("bug after acting")

    monkeypatch.setattr(nodepath, "remember_config", broken)
    (node_env / "dev/kmsg").open("a").write(XID79)
    slurm = node01_slurm()
    assert nodepath.run_stage("prolog", slurm_factory=lambda c, d: slurm) == 1
    # job 777 is another job on the node: a prolog's drain now requeues it
    assert [c[0] for c in slurm.calls] == ["drain", "requeue"]
