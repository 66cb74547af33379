"""The node path's log lines go to stderr (and the sweep's line to stdout) before syslog. A
stream whose reader is gone (journald restarted under the sweep's timer, a cron mail pipe
closed early, a wrapper's log pipe) answers every write with EPIPE. Before, the first log
line raised BrokenPipeError out of the run: a drain verdict was never carried out (the
sweep's drain call came after a log line), and the prolog died with Python's own exit code
120, which the shipped wrapper reads as "could not run" and lets the job start on an XID 79.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from rsc_health import nodepath
from tests.fixtures.nodes.node_copy import NODE_STATE

from .test_nodepath_faults import XID79, _records, node_env  # noqa: F401 - the fixture
from .test_state_dir_read_only import slurm_away
from .test_wrappers import PROLOG, env  # noqa: F401 - the fixture


def _broken_pipe() -> int:
    """The write end of a pipe whose read end is closed: every write is EPIPE."""
    r, w = os.pipe()
    os.close(r)
    return w


def test_a_prolog_whose_stderr_reader_is_gone_still_fails_the_job_on_an_xid79(env):  # noqa: F811
    with open(os.path.join(env["RSC_HEALTH_ROOT"], "dev/kmsg"), "a") as fh:
        fh.write(XID79)
    w = _broken_pipe()
    try:
        out = subprocess.run([str(PROLOG)], env=env, stdout=w, stderr=w, timeout=120)
    finally:
        os.close(w)
    assert out.returncode == 1  # the drain verdict: slurmd drains, the job goes elsewhere


@pytest.mark.parametrize("entry", ["prolog", "epilog", "sweep"])
def test_a_run_whose_log_streams_are_broken_keeps_its_drain_verdict(entry, node_env,  # noqa: F811
                                                                    monkeypatch):
    """Slurm away: the verdict is kept for the next run, and said (the log line that broke)."""
    (node_env / "dev/kmsg").open("a").write(XID79)
    broken = os.fdopen(_broken_pipe(), "w")
    monkeypatch.setattr(sys, "stderr", broken)
    monkeypatch.setattr(sys, "stdout", broken)
    try:
        code = nodepath.run_stage(entry, slurm_factory=lambda c, d: slurm_away())
    finally:
        monkeypatch.undo()
        try:
            broken.close()
        except OSError:
            pass
    assert code == (1 if entry == "prolog" else 0)
    codes = [r.get("code") for r in _records(node_env)]
    assert "xid79" in codes and "checker_fault" not in codes
    assert nodepath.load_pending(node_env / NODE_STATE).why == "slurm_unavailable"


@pytest.mark.parametrize("script", ["prolog", "epilog"])
def test_a_wrapper_that_cannot_start_python_and_cannot_say_so_still_lets_the_job_run(
        script, env, tmp_path):  # noqa: F811
    """Its message to a stderr whose reader is gone killed the shell with SIGPIPE before:
    slurmd reads a prolog or epilog killed by a signal as failed and drains a healthy node."""
    from .test_wrappers import EPILOG

    env["RSC_HEALTH_PYTHON"] = str(tmp_path / "no-such-python")
    w = _broken_pipe()
    try:
        out = subprocess.run([str(PROLOG if script == "prolog" else EPILOG)], env=env,
                             stdout=w, stderr=w, timeout=120)
    finally:
        os.close(w)
    assert out.returncode == 0
