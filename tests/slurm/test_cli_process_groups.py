"""A Slurm command that runs past its timeout is killed with everything it started.

Sites put wrappers around scontrol, squeue and sacct (a shell script that sets the cluster,
logs, retries). Killing only the wrapper at the timeout left its child running: a hung
scontrol, or whatever the wrapper ran, outlived the call on every sweep, still holding the
pipe, and a scontrol that did answer later acted after we had given up on it. Every command
now runs in its own process group and the group is killed at the timeout. A wrapper that
answered and left a child holding its output is not trusted to have said everything: the
call waits for the output to end, within its timeout, as before.

Reproduced with real wrapper scripts in a bin_dir (no Slurm needed)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from rsc_health.slurm import CliSlurm, SlurmUnavailable
from rsc_health.slurm.accounting import Accounting

NODE = ("NodeName=node02 Arch=x86_64 State=IDLE CfgTRES=cpu=2,mem=1000M Partitions=gpu")


def _wrapper(bin_dir: Path, name: str, body: str) -> None:
    script = bin_dir / name
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(0o755)


def _alive(pid: int) -> bool:
    """Running (not gone, not a zombie waiting for init to reap it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _gone_soon(pid: int, within_s: float = 2.0) -> bool:
    end = time.monotonic() + within_s
    while time.monotonic() < end:
        if not _alive(pid):
            return True
        time.sleep(0.02)
    return False


@pytest.fixture
def child_pid(tmp_path):
    pidfile = tmp_path / "child.pid"
    pids: list[int] = []

    def read() -> int:
        for _ in range(100):
            if pidfile.exists() and pidfile.read_text().strip():
                pids.append(int(pidfile.read_text()))
                return pids[-1]
            time.sleep(0.02)
        raise AssertionError("the wrapper never started its child")

    yield pidfile, read
    for pid in pids:  # whatever a failing run left behind
        try:
            os.kill(pid, 9)
        except OSError:
            pass


CALLS = {
    "scontrol": lambda b: CliSlurm(timeout_s=1, bin_dir=str(b)).node("node02"),
    "sacct": lambda b: Accounting(timeout_s=1, bin_dir=str(b)).sacct_json("2026-11-01",
                                                                         "2026-11-02"),
}


@pytest.mark.parametrize("command", sorted(CALLS))
def test_a_wrapper_past_its_timeout_is_killed_with_the_command_it_ran(tmp_path, child_pid,
                                                                     command):
    pidfile, read = child_pid
    # The wrapper waits on a real child that hangs (a scontrol on a dead controller).
    _wrapper(tmp_path, command, f"sleep 1000 &\necho $! > {pidfile}\nwait\n")

    started = time.monotonic()
    with pytest.raises(SlurmUnavailable):
        CALLS[command](tmp_path)
    assert time.monotonic() - started < 3

    assert _gone_soon(read()), "the wrapper's child outlived the call"


@pytest.mark.parametrize("command", sorted(CALLS))
def test_a_child_left_holding_the_output_is_killed_at_the_timeout(tmp_path, child_pid,
                                                                 command):
    pidfile, read = child_pid
    # The wrapper answers and exits, leaving a child that keeps its stdout open: the answer
    # may not be whole, so the call times out as before, and the child goes with it.
    _wrapper(tmp_path, command, f"echo '{NODE}'\nsleep 1000 &\necho $! > {pidfile}\nexit 0\n")

    started = time.monotonic()
    with pytest.raises(SlurmUnavailable):
        CALLS[command](tmp_path)
    assert time.monotonic() - started < 3

    assert _gone_soon(read()), "the child holding the output outlived the call"


def test_a_wrapper_that_answers_and_exits_is_read_whole(tmp_path):
    lines = "".join(f"echo '{NODE.replace('node02', f'node{i:03d}')}'\n" for i in range(2000))
    _wrapper(tmp_path, "scontrol", lines + "exit 0\n")

    nodes = CliSlurm(timeout_s=10, bin_dir=str(tmp_path)).nodes()

    assert len(nodes) == 2000 and nodes[-1].name == "node1999"
