"""A state file that is there but cannot be read (empty, cut short, a directory, a FIFO, a
symlink to /dev/zero) is lost state: the run neither hangs on it nor judges again what it
already judged, says so once, and rebuilds it. A FIFO left at a state file's temporary name
never blocks the write either (opening a FIFO to write waits for a reader)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rsc_health import engine, nodepath
from rsc_health.actions import DRAIN_STATE_FILE
from rsc_health.model import Status
from tests.fixtures.nodes.node_copy import NODE_STATE

from .test_nodepath_faults import REPO, XID79, node_env  # noqa: F401 - the fixture
from .test_state_dir_read_only import NODE, node01_slurm

XID = "4,{seq},{usec},-;NVRM: Xid (PCI:0000:1b:00): 79, pid=77, name=python3, GPU has " \
      "fallen off the bus.\n"
OURS = "rsc_health:job:ib_down:mlx5_0 port 1 Down"


def _break(path: Path, how: str) -> None:
    """Put something unreadable at a state file's name."""
    if path.is_symlink() or path.exists():
        path.unlink()
    if how == "empty":
        path.write_text("")
    elif how == "truncated":
        path.write_text('{"boot_id": "0b2c')
    elif how == "directory":
        path.mkdir()
        (path / "something").write_text("a person's file")
    elif how == "fifo":
        os.mkfifo(path)
    elif how == "dev_zero":
        path.symlink_to("/dev/zero")
    elif how == "nested":  # garbled into JSON deeper than the decoder's recursion limit
        path.write_text("[" * 200_000)


BROKEN = ("empty", "truncated", "directory", "fifo", "dev_zero", "nested")


def _cursor_errors(findings) -> list:
    return [f for f in findings if f.status is Status.ERROR and "cursor" in f.reason]


@pytest.mark.parametrize("how", BROKEN)
def test_a_lost_xid_cursor_never_has_an_xid_judged_twice_and_is_rebuilt(node, how):
    node.write("proc/uptime", "7200.00 50000.00\n")  # up two hours
    node.append("dev/kmsg", XID.format(seq=5000, usec=3600 * 10**6))  # an hour ago
    assert any(f.code == "xid79" for f in engine.run(node.config, node.root))
    _break(node.path(f"{NODE_STATE}/xid_cursor.json"), how)

    started = time.monotonic()
    first = engine.run(node.config, node.root)
    assert time.monotonic() - started < 10

    assert not [f for f in first if f.code == "xid79"]  # judged once already
    assert len(_cursor_errors(first)) == 1  # said once ...
    node.append("dev/kmsg", XID.format(seq=5001, usec=7200 * 10**6))
    second = engine.run(node.config, node.root)
    assert not _cursor_errors(second)  # ... and rebuilt
    assert [f.data["count"] for f in second if f.code == "xid79"] == [1]  # later XIDs seen


def test_a_cursor_lost_before_this_boot_still_reads_everything_this_boot_logged(node):
    engine.run(node.config, node.root)
    cursor = node.path(f"{NODE_STATE}/xid_cursor.json")
    cursor.write_text("")  # emptied by a power cut (a disk that lost the unsynced bytes)
    hour_ago = time.time() - 3600
    os.utime(cursor, (hour_ago, hour_ago))
    node.write("proc/sys/kernel/random/boot_id", "99999999-8888-7777-6666-555555555555\n")
    node.write("proc/uptime", "120.50 900.00\n")  # this boot began two minutes ago
    node.write("dev/kmsg", XID.format(seq=12, usec=30 * 10**6))

    findings = engine.run(node.config, node.root)

    assert [f.code for f in findings if f.code == "xid79"] == ["xid79"]
    assert len(_cursor_errors(findings)) == 1


@pytest.mark.parametrize("how", BROKEN)
def test_a_lost_cursor_never_reads_a_kernel_log_file_again_from_its_start(node, how):
    log = node.path("var/log/kern.log")
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("Nov 21 03:14:15 node01 kernel: NVRM: Xid (PCI:0000:1b:00): 79, GPU has "
                   "fallen off the bus.\n")
    cfg = node.config
    cfg.data["xid"] = {**cfg.data.get("xid", {}), "sources": ["/var/log/kern.log"]}
    assert any(f.code == "xid79" for f in engine.run(cfg, node.root))
    _break(node.path(f"{NODE_STATE}/xid_cursor.json"), how)

    first = engine.run(cfg, node.root)

    assert not [f for f in first if f.code == "xid79"]
    with log.open("a") as fh:
        fh.write("Nov 21 04:00:00 node01 kernel: NVRM: Xid (PCI:0000:1b:00): 79, GPU has "
                 "fallen off the bus.\n")
    assert [f.code for f in engine.run(cfg, node.root) if f.code == "xid79"] == ["xid79"]


@pytest.mark.parametrize("how", BROKEN)
def test_a_lost_counters_file_is_said_once_and_rebuilt(node, how):
    engine.run(node.config, node.root)
    _break(node.path(f"{NODE_STATE}/counters.json"), how)

    first = engine.run(node.config, node.root)
    second = engine.run(node.config, node.root)

    lost = [f for f in first if f.status is Status.ERROR and "counters" in f.reason]
    assert len(lost) == 1
    assert not [f for f in second if f.status is Status.ERROR]
    assert json.loads(node.path(f"{NODE_STATE}/counters.json").read_text())["counters"]


@pytest.mark.parametrize("how", BROKEN)
def test_a_lost_drain_record_is_said_once_never_resumes_and_is_rebuilt(
        node_env, how, capsys):  # noqa: F811
    sdir = node_env / NODE_STATE
    assert nodepath.run_stage("sweep", slurm_factory=lambda cfg, d: node01_slurm()) == 0
    _break(sdir / DRAIN_STATE_FILE, how)
    capsys.readouterr()
    slurm = node01_slurm()
    slurm.set_state(NODE, "MIXED+DRAIN", OURS, user="root")

    for _ in range(4):  # more clean sweeps than resume_after_clean_sweeps
        assert nodepath.run_stage("sweep", slurm_factory=lambda cfg, d: slurm) == 0

    assert slurm.calls == []  # with no record of what we drained for, a person resumes it
    err = capsys.readouterr().err
    assert err.count(DRAIN_STATE_FILE) == 1, err
    assert not (sdir / DRAIN_STATE_FILE).exists() and not (sdir / DRAIN_STATE_FILE).is_symlink()


@pytest.mark.parametrize("how", BROKEN)
def test_a_pending_verdict_is_kept_whatever_stood_at_its_name(node_env, how):  # noqa: F811
    sdir = node_env / NODE_STATE
    assert nodepath.run_stage("sweep", slurm_factory=lambda cfg, d: node01_slurm()) == 0
    _break(sdir / nodepath.PENDING_VERDICT_FILE, how)
    (node_env / "dev/kmsg").open("a").write(XID79)

    assert _sweep_with_slurm_away(node_env) == 0

    pending = json.loads((sdir / nodepath.PENDING_VERDICT_FILE).read_text())
    assert pending["causes"][0]["code"] == "xid79"


AWAY = ("import sys\nfrom rsc_health import nodepath\n"
        "from rsc_health.slurm.memory import MemorySlurm\n"
        "slurm = MemorySlurm(['node01'])\n"
        "slurm.stop()\n"
        "raise SystemExit(nodepath.run_stage('sweep', slurm_factory=lambda c, d: slurm))\n")


def _sweep_with_slurm_away(root: Path, timeout: float = 20) -> int:
    """A sweep in its own process (its watchdog ends the process it runs in)."""
    done = subprocess.run([sys.executable, "-c", AWAY], cwd=REPO, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True)
    return done.returncode


@pytest.mark.parametrize("name", ["xid_cursor.json.tmp", "counters.json.tmp",
                                  "pending_verdict.json.tmp"])
def test_a_fifo_at_a_state_files_temporary_name_never_holds_the_sweep(
        node_env, name):  # noqa: F811
    sdir = node_env / NODE_STATE
    assert nodepath.run_stage("sweep", slurm_factory=lambda cfg, d: node01_slurm()) == 0
    os.mkfifo(sdir / name)
    (node_env / "dev/kmsg").open("a").write(XID79)

    started = time.monotonic()
    assert _sweep_with_slurm_away(node_env) == 0
    assert time.monotonic() - started < 15  # the sweep's budget is 45 s; it hung to its end

    pending = json.loads((sdir / nodepath.PENDING_VERDICT_FILE).read_text())
    assert pending["causes"][0]["code"] == "xid79"
    assert json.loads((sdir / name.removesuffix(".tmp")).read_text())


def test_a_lost_cursor_judges_what_the_ring_buffer_logged_since_its_last_write(node):
    node.write("proc/uptime", "7200.00 50000.00\n")
    node.append("dev/kmsg", XID.format(seq=5000, usec=3600 * 10**6))
    engine.run(node.config, node.root)
    cursor = node.path(f"{NODE_STATE}/xid_cursor.json")
    cursor.write_text("")
    ten_min_ago = time.time() - 600
    os.utime(cursor, (ten_min_ago, ten_min_ago))  # the last good write, then the damage
    node.append("dev/kmsg", XID.format(seq=5001, usec=(7200 - 300) * 10**6).replace(
        "1b:00", "2a:00"))  # five minutes ago: after that write, never judged

    findings = engine.run(node.config, node.root)

    assert [f.data["pci"] for f in findings if f.code == "xid79"] == ["0000:2a:00"]
