"""`healthctl drain|resume|status|node` against a slurmctld that freezes (SIGSTOP) mid-command
or is gone: every command ends in bounded time with one line per node and no traceback, and a
drain Slurm may still apply is never left unrecorded."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from .test_healthctl_slurm import healthctl

pytestmark = pytest.mark.slurm


def _wrap_scontrol(tmp_path: Path, pid: int, when: str) -> dict:
    """A scontrol on PATH that freezes slurmctld just before (`when`=before) or just after
    (after) an `scontrol update` reaches it: the freeze lands between our calls."""
    real = "/usr/bin/scontrol"
    bindir = tmp_path / "bin"
    bindir.mkdir()
    stop = f'[ "$1" = update ] && kill -STOP {pid}'
    body = (f"{stop}\nexec {real} \"$@\"\n" if when == "before" else
            f"{real} \"$@\"; rc=$?\n{stop}\nexit $rc\n")
    (bindir / "scontrol").write_text("#!/bin/sh\n" + body)
    (bindir / "scontrol").chmod(0o755)
    return {"PATH": f"{bindir}:{os.environ['PATH']}"}


def _spooled(root: Path) -> list[dict]:
    path = root / "var/lib/rsc_health/spool/pending.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.parametrize("when", ["before", "after"])
def test_a_drain_whose_controller_freezes_mid_command_is_recorded_and_says_so(
        slurm_cluster, tmp_path, when):
    c = slurm_cluster
    pid = c.procs["slurmctld"].pid
    env = _wrap_scontrol(tmp_path, pid, when)
    root = tmp_path / "root"
    try:
        t0 = time.monotonic()
        out = healthctl(c, "drain", "node05", "--reason", "PSU", root=root, env=env)
        took = time.monotonic() - t0
    finally:
        os.kill(pid, signal.SIGCONT)
    assert took < 40 and "Traceback" not in out.stderr, out.stderr
    assert len(out.stdout.splitlines()) == 1, out.stdout
    # slurmctld takes the RPC once it runs again: the node is drained by us...
    c.wait_for(lambda: "DRAIN" in c.node_state("node05"), 30, "the drain landed")
    # ...and the record of who drained it and why is not lost.
    assert [r["action"] for r in _spooled(root)] == ["manual_drain"], out.stdout


def test_bulk_drain_against_a_frozen_controller_ends_after_one_timeout(slurm_cluster, tmp_path):
    c = slurm_cluster
    pid = c.procs["slurmctld"].pid
    os.kill(pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        out = healthctl(c, "drain", "node[01-06]", "--reason", "rack", root=tmp_path)
        took = time.monotonic() - t0
        st = healthctl(c, "status")
    finally:
        os.kill(pid, signal.SIGCONT)
    assert out.returncode == 1 and "Traceback" not in out.stderr + st.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == 6 and all(ln.startswith("node0") for ln in lines), lines
    assert took < 25, f"{took:.0f} s for six nodes: one timeout per node"
    assert st.returncode == 1 and len(st.stderr.strip().splitlines()) == 1, st.stderr


def test_commands_against_a_vanished_controller_say_so_in_one_line(slurm_cluster, tmp_path):
    c = slurm_cluster
    c.stop_slurmctld()
    try:
        for argv in (["drain", "node01", "--reason", "x"], ["resume", "node01"], ["status"],
                     ["node", "node01"]):
            t0 = time.monotonic()
            out = healthctl(c, *argv, root=tmp_path)
            assert time.monotonic() - t0 < 40, argv
            assert "Traceback" not in out.stderr, (argv, out.stderr)
            assert len((out.stdout + out.stderr).strip().splitlines()) <= 3, (argv, out)
    finally:
        c.start_slurmctld()
