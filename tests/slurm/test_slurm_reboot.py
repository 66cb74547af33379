"""A person's `scontrol reboot` colliding with our drain, on the real Slurm (22.05): the node is
rebooted for real as slurmctld sees it (SlurmCluster.reboot_slurmd), so what Slurm does with our
drain and reason when the node comes back is measured, not assumed."""

from __future__ import annotations

import json
import shutil
import time

import pytest

from rsc_health.slurm.api import NodeInfo
from rsc_health.slurm.cli_backend import parse_node_line
from tests.slurm.cluster import HEALTHY

from .test_cluster_scenarios import inject_xid79, remove_mount, wait_running_past_prolog

pytestmark = pytest.mark.slurm


def _node(c, name: str) -> NodeInfo:
    return parse_node_line(c.run(["scontrol", "-o", "show", "node", name]).stdout.strip())


def _reboot_when_issued(c, name: str) -> None:
    """Wait for Slurm to issue the reboot it was asked for, then reboot the node."""
    c.wait_for(lambda: _node(c, name).in_hand == "REBOOT_ISSUED", 30, f"{name} reboot issued")
    # slurmd registers an uptime up to ~2 s past its start (whole seconds): a boot time
    # before the request would keep Slurm waiting for the boot until ResumeTimeout. And a real
    # node's reboot takes minutes (firmware, POST): this one's BootTime must also fall past the
    # 2 s slack after the run that last saw our drain, that jitter included, or it reads as
    # the same boot (under a loaded CI, 3 s was sometimes not enough: an unseen lift missed).
    time.sleep(5)
    # A reboot gives the kernel a new boot id (reboot_slurmd writes one) and an empty ring
    # buffer: the XID of the last boot is not read again.
    shutil.copyfile(HEALTHY / "dev/kmsg", c.root(name) / "dev/kmsg")
    c.reboot_slurmd(name)
    c.wait_for(lambda: not (_node(c, name).in_hand or _node(c, name).down), 60,
               f"{name} back from its reboot")


def _actions(c, name: str) -> list[str]:
    return [r["action"] for r in c.spool(name) if r["kind"] == "action"]


def test_our_xid79_drain_under_a_persons_reboot_nextstate_resume_is_drained_again(
        slurm_cluster):
    """A person asks `scontrol reboot nextstate=RESUME` of a busy node (it reboots when its
    job ends); then the node's GPU falls off the bus and our sweep drains it (XID 79: a
    repair, never auto-resumed). Slurm keeps our reason ("... : reboot issued") and, when the
    node registers again, makes it IDLE with no reason: our drain gone, and the next clean
    sweep took that for a person's resume and forgot the XID 79. Now it drains it again."""
    c = slurm_cluster
    job = c.sbatch("-w", "node04", "--no-requeue", "--wrap", "sleep 300")
    wait_running_past_prolog(c, job)
    try:
        c.run(["scontrol", "reboot", "nextstate=RESUME", "node04"])
        inject_xid79(c, "node04")
        assert c.sweep("node04").returncode == 0
        ours = _node(c, "node04").reason
        assert ours.startswith("rsc_health:now:xid79:")
        c.run(["scancel", job])
        _reboot_when_issued(c, "node04")
        info = _node(c, "node04")
        assert not info.drain_set and not info.reason, info  # what Slurm 22.05 does

        out = c.sweep("node04")
        assert out.returncode == 0, out.stderr
        info = _node(c, "node04")
        assert info.drain_set and info.reason == ours, info
        assert _actions(c, "node04") == ["drain_now", "requeue_refused", "drain_now"]
        for _ in range(3):  # never auto-resumed
            assert c.sweep("node04").returncode == 0
        assert _node(c, "node04").drain_set
    finally:
        c.run(["scontrol", "cancel_reboot", "node04"], check=False)
        c.run(["scancel", job], check=False)


def test_our_transient_drain_survives_a_persons_plain_reboot_and_is_resumed_after(
        slurm_cluster):
    """A person's plain `scontrol reboot` (no nextstate) over our lost-mount drain: Slurm
    keeps the drain and leaves "<ours> : reboot issued" as the reason after the reboot. The
    mount is back: the clean sweeps never resumed it (the reason no longer matched our
    record word for word); now they do, after their count."""
    c = slurm_cluster
    original = remove_mount(c, "node03")
    assert c.sweep("node03").returncode == 0
    ours = _node(c, "node03").reason
    assert ours.startswith("rsc_health:now:mount_missing:")
    c.run(["scontrol", "reboot", "node03"])
    _reboot_when_issued(c, "node03")
    info = _node(c, "node03")
    assert info.drain_set and info.reason == ours + " : reboot issued", info

    (c.root("node03") / "proc/mounts").write_text(original)
    for _ in range(2):  # the site config resumes after 2 clean sweeps
        assert c.sweep("node03").returncode == 0
    assert not _node(c, "node03").drain_set
    assert _actions(c, "node03") == ["drain_now", "resume"]


def test_a_persons_reboot_with_a_reason_over_our_idle_xid79_drain_does_not_resume_it(
        slurm_cluster):
    """Our XID 79 drain on an idle node; a person then asks `scontrol reboot ASAP
    nextstate=RESUME reason="bios update"`: Slurm puts their reason in place of ours, issues
    the reboot at once and lifts the drain when the node is back. The sweep slurmd runs as it
    starts (before it registers) still sees the reboot in hand; the clean sweep after used
    to forget the XID 79. Now it drains the node again with our reason."""
    c = slurm_cluster
    inject_xid79(c, "node02")
    assert c.sweep("node02").returncode == 0
    ours = _node(c, "node02").reason
    assert ours.startswith("rsc_health:now:xid79:")
    try:
        c.run(["scontrol", "reboot", "ASAP", "nextstate=RESUME", "reason=bios update",
               "node02"])
        _reboot_when_issued(c, "node02")
        assert not _node(c, "node02").drain_set
        assert c.sweep("node02").returncode == 0
        info = _node(c, "node02")
        assert info.drain_set and info.reason == ours, info
        assert _actions(c, "node02") == ["drain_now", "drain_now"]
    finally:
        c.run(["scontrol", "cancel_reboot", "node02"], check=False)


def test_a_job_start_after_a_reboot_lifted_our_xid79_drain_is_refused_and_the_node_drained(
        slurm_cluster):
    """Between the reboot that lifted our XID 79 drain (nextstate=RESUME) and the next sweep
    (five minutes on a site), the node is IDLE: a job started there and ran on the fault.
    Now its prolog sees our record's note, drains the node again and fails the start, so
    Slurm starts the job elsewhere."""
    c = slurm_cluster
    inject_xid79(c, "node05")
    assert c.sweep("node05").returncode == 0
    ours = _node(c, "node05").reason
    try:
        c.run(["scontrol", "reboot", "nextstate=RESUME", "node05"])
        _reboot_when_issued(c, "node05")
        assert not _node(c, "node05").drain_set
        # The scheduler takes the first idle node it may: node05.
        job = c.sbatch("-N", "1", "-x", "node0[1-4]", "--requeue", "--wrap", "sleep 300")
        c.wait_for(lambda: c.job(job).get("NodeList") == "node06"
                   and c.job_state(job) == "RUNNING", 90, "the job running on node06")
        assert int(c.job(job)["Restarts"]) >= 1
        assert [r["job_id"] for r in c.spool("node05") if r["kind"] == "job_start"] == [job]
        info = _node(c, "node05")
        assert info.drain_set and info.reason == ours, info
        assert _actions(c, "node05") == ["drain_now", "drain_now"]
    finally:
        c.run(["scontrol", "cancel_reboot", "node05"], check=False)


def test_a_reboot_no_sweep_saw_pending_still_leaves_our_xid79_drain_in_place(slurm_cluster):
    """A site that runs the sweep from the systemd timer, not HealthCheckProgram: slurmd
    runs no sweep as it starts. Our XID 79 drain on an idle node; a person asks `scontrol
    reboot nextstate=RESUME`, Slurm issues it at once, the node is back within one timer
    period: no run ever saw the reboot pending (item 4 of the Slurm attack notes). The next
    sweep forgot the XID 79 as if a person had resumed the node; now Slurm's BootTime, later
    than the one the drain was last seen in place on, has it drained again."""
    c = slurm_cluster
    inject_xid79(c, "node03")
    assert c.sweep("node03").returncode == 0
    ours = _node(c, "node03").reason
    assert ours.startswith("rsc_health:now:xid79:")
    startup = c.base / "hooks" / "sweep"
    kept = startup.read_text()
    try:
        startup.write_text("#!/bin/sh\nexit 0\n")  # no HealthCheckProgram run at slurmd start
        c.run(["scontrol", "reboot", "nextstate=RESUME", "node03"])
        _reboot_when_issued(c, "node03")
        assert not _node(c, "node03").drain_set
        assert c.sweep("node03").returncode == 0
        info = _node(c, "node03")
        assert info.drain_set and info.reason == ours, info
        # drained again on the new kernel boot: the record notes that boot's id
        root = c.root("node03")
        record = json.loads((root / "var/lib/rsc_health/slurm_drain.json").read_text())
        assert record["boot_id"] == (root / "proc/sys/kernel/random/boot_id").read_text().strip()
    finally:
        startup.write_text(kept)
        c.run(["scontrol", "cancel_reboot", "node03"], check=False)



def test_restarts_and_a_not_responding_spell_are_no_reboot_and_a_reboot_after_them_is(
        slurm_cluster):
    """None of these is a reboot, though each has slurmd register again and Slurm stamp
    BootTime anew from a whole-second uptime: slurmd restarted, `scontrol reconfigure`,
    slurmd gone long enough for Slurm to set the node DOWN (not responding) and back
    (ReturnToService=2), slurmctld restarted (it shows BootTime=None until slurmd registers:
    here slurmd is stopped across it, so the sweep sees None). Our XID 79 drain stays through
    all of them, BootTime within the 2 s slack. Then a reboot nextstate=RESUME no run saw
    lifts it: drained again (a sighting with BootTime=None used to erase the boot noted, and
    this lift was forgotten); a person's resume after that stands."""
    c = slurm_cluster
    node = "node01"
    inject_xid79(c, node)
    assert c.sweep(node).returncode == 0
    ours = _node(c, node).reason
    assert ours.startswith("rsc_health:now:xid79:")
    boots = [_node(c, node).boot_time]

    def seen_in_place() -> None:
        assert c.sweep(node).returncode == 0
        info = _node(c, node)
        assert info.drain_set and info.reason == ours, info
        boots.append(info.boot_time)

    def back() -> None:
        c.wait_for(lambda: not _node(c, node).down and _node(c, node).boot_time is not None,
                   60, f"{node} registered")

    c._stop_proc(f"slurmd-{node}")
    c.start_slurmd(node)
    back()
    seen_in_place()
    c.run(["scontrol", "reconfigure"])
    back()
    seen_in_place()
    c._stop_proc(f"slurmd-{node}")
    c.wait_for(lambda: _node(c, node).down, 60, f"{node} DOWN, not responding")
    c.start_slurmd(node)
    back()
    seen_in_place()
    c._stop_proc(f"slurmd-{node}")
    c.stop_slurmctld()
    c.start_slurmctld()
    seen_in_place()
    assert boots[-1] is None
    c.start_slurmd(node)
    back()
    boots[-1] = _node(c, node).boot_time
    assert all(abs((b - boots[0]).total_seconds()) <= 2 for b in boots), boots

    startup = c.base / "hooks" / "sweep"
    kept = startup.read_text()
    try:
        startup.write_text("#!/bin/sh\nexit 0\n")  # no HealthCheckProgram run at slurmd start
        c.run(["scontrol", "reboot", "nextstate=RESUME", node])
        _reboot_when_issued(c, node)
        assert not _node(c, node).drain_set
    finally:
        startup.write_text(kept)
        c.run(["scontrol", "cancel_reboot", node], check=False)
    assert c.sweep(node).returncode == 0
    info = _node(c, node)
    assert info.drain_set and info.reason == ours, info
    c.run(["scontrol", "update", f"NodeName={node}", "State=RESUME"])
    assert c.sweep(node).returncode == 0
    assert not _node(c, node).drain_set
    assert _actions(c, node) == ["drain_now", "drain_now"]
