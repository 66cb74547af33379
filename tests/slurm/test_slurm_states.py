"""Slurm's compound node states on the real Slurm: what a person asked Slurm to do to a node
(a reboot when its job ends) is never undone by our auto-resume."""

from __future__ import annotations

import pytest

from rsc_health.slurm.api import NodeInfo
from rsc_health.slurm.cli_backend import parse_node_line

from .test_cluster_scenarios import remove_mount, wait_running_past_prolog

pytestmark = pytest.mark.slurm


def _node(c, name: str) -> NodeInfo:
    """The node as our backend reads it, from the test cluster's scontrol."""
    return parse_node_line(c.run(["scontrol", "-o", "show", "node", name]).stdout.strip())


def test_a_reboot_asked_of_slurm_is_not_resumed_over_by_our_clean_sweeps(slurm_cluster):
    """Our drain-now (a missing mount) on a node whose job refuses requeue; a person then
    asks Slurm to reboot the node when the job ends, giving no reason, so Slurm keeps ours.
    The mount comes back: the clean sweeps used to resume the node on top of the pending
    reboot. They now leave it to Slurm."""
    c = slurm_cluster
    job = c.sbatch("-w", "node05", "--no-requeue", "--wrap", "sleep 300")
    wait_running_past_prolog(c, job)
    original = remove_mount(c, "node05")
    assert c.sweep("node05").returncode == 0
    ours = c.node("node05")["Reason"]
    assert ours.startswith("rsc_health:now:mount_missing:")
    try:
        c.run(["scontrol", "reboot", "ASAP", "node05"])
        info = _node(c, "node05")
        assert info.in_hand == "REBOOT_REQUESTED", info.state
        assert info.reason and ours.startswith(info.reason), "Slurm replaced our reason"

        (c.root("node05") / "proc/mounts").write_text(original)
        for _ in range(3):  # the site config resumes after 2 clean sweeps
            out = c.sweep("node05")
            assert out.returncode == 0, out.stderr
        info = _node(c, "node05")
        assert info.drain_set and info.in_hand == "REBOOT_REQUESTED", info.state
        assert [r["action"] for r in c.spool("node05") if r["kind"] == "action"] == [
            "drain_now", "requeue_refused"]
    finally:
        c.run(["scontrol", "cancel_reboot", "node05"], check=False)
        c.run(["scancel", job], check=False)


def test_slurms_own_down_on_top_of_our_drain_is_left_to_slurm(slurm_cluster):
    """Our drain (a missing mount), then slurmd dies: Slurm marks the node DOWN and keeps our
    reason. The sweep runs from its systemd timer all the same and the mount comes back: the
    clean sweeps used to RESUME the node, clearing Slurm's DOWN with our DRAIN. Now they wait;
    once slurmd is back (ReturnToService=2 ends the DOWN) our drain is resumed as ever."""
    c = slurm_cluster
    original = remove_mount(c, "node06")
    assert c.sweep("node06").returncode == 0
    assert c.node("node06")["Reason"].startswith("rsc_health:now:mount_missing:")
    slurmd = c.procs.pop("slurmd-node06")
    slurmd.terminate()
    slurmd.wait(15)
    try:
        c.wait_for(lambda: _node(c, "node06").down, 60, "node06 DOWN (SlurmdTimeout=10)")
        (c.root("node06") / "proc/mounts").write_text(original)
        for _ in range(3):  # the site config resumes after 2 clean sweeps
            assert c.sweep("node06").returncode == 0
        info = _node(c, "node06")
        assert info.down and info.drain_set, info.state
        assert info.reason.startswith("rsc_health:now:mount_missing:")
        assert [r["action"] for r in c.spool("node06") if r["kind"] == "action"] == [
            "drain_now"]
    finally:
        c.start_slurmd("node06")
    c.wait_for(lambda: not _node(c, "node06").down, 60, "node06 back from DOWN")
    for _ in range(2):
        assert c.sweep("node06").returncode == 0
    kinds = [r["action"] for r in c.spool("node06") if r["kind"] == "action"]
    assert kinds == ["drain_now", "resume"], kinds
    assert not _node(c, "node06").drain_set
