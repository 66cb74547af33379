"""The node path's trust, read again by an adversary (session 32): a /proc read of a process
stuck in the driver, state another user could plant, root's writes through a directory
someone else controls, and words about a pending verdict that were not true."""

from __future__ import annotations

import os
import time

import pytest

from rsc_health import spool
from rsc_health.checks import leftover
from rsc_health.durable import UnsafeDirectory, load_state_json, write_atomic
from rsc_health.model import Finding, Level, Severity, Status, Verdict
from rsc_health.node.store import read_pending, save_pending

ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to hand files to another "
                                                         "uid")
NOBODY = 65534


def test_a_gpu_process_whose_proc_files_hang_is_judged_within_the_budget(node, monkeypatch):
    """NVML names pid 4321 on gpu2, a process stuck in the driver; reading its /proc files
    blocks in the kernel (its memory map's lock held). The read ran in the prolog's own
    process: 25 s past the budget, exit 0, the job ran on the node, and a read that never
    returned left the prolog in D state. Now it is read in a child abandoned at the timeout,
    and the process is judged as one whose owner could not be read."""
    def stuck(*args, **kwargs):
        time.sleep(60)  # in the forked child: the parent stops waiting

    monkeypatch.setattr(leftover, "_process", stuck)
    node.nvml(lambda doc: doc["devices"][2].setdefault("processes", []).append(
        {"pid": 4321, "used_memory": 2 << 30}))
    began = time.monotonic()
    findings, verdict = node.check(only={"gpu", "leftover"}, budget_s=4.0)
    assert time.monotonic() - began < 4.0
    (hit,) = [f for f in findings if f.code == "gpu_process_leftover"]
    assert hit.component == "gpu2" and "did not answer" in hit.reason
    assert hit.severity >= Severity.DRAIN_AFTER_JOB and verdict.level >= Level.DRAIN_AFTER_JOB
    assert any(f.family == "checker" and "/proc" in f.reason for f in findings)


def test_the_healthy_case_reads_no_proc_and_starts_no_child(node, monkeypatch):
    from rsc_health.collect import bounded

    def no_child(*a, **k):
        raise AssertionError("a child for no process")

    monkeypatch.setattr(bounded, "call", no_child)
    findings, _ = node.check(only={"gpu", "leftover"})
    assert any(f.family == "leftover" and f.status is Status.OK for f in findings)


def _verdict() -> Verdict:
    cause = Finding("xid", "gpu3", Status.FAIL, Severity.DRAIN_NOW, "XID 79", "xid79")
    return Verdict(Level.DRAIN_NOW, "XID 79", (cause,))


@ROOT_ONLY
def test_a_pending_verdict_another_user_planted_is_discarded_not_obeyed(tmp_path):
    """A state dir another user could write (owned by them, or 1777 sticky): a planted
    pending_verdict.json failed every job start and drained a healthy node."""
    sdir = tmp_path / "state"
    sdir.mkdir()
    assert save_pending(sdir, _verdict(), why="slurm_unavailable")
    assert read_pending(sdir) is not None  # root's own: read
    os.chown(sdir / "pending_verdict.json", NOBODY, NOBODY)
    with pytest.raises(ValueError, match="owned by uid 65534"):
        read_pending(sdir)
    (sdir / "counters.json").write_text('{"boot_id": "b", "counters": {"x": 1}}')
    os.chown(sdir / "counters.json", NOBODY, NOBODY)
    assert "owned by uid 65534" in load_state_json(sdir / "counters.json")["lost"]


@ROOT_ONLY
def test_root_never_appends_to_a_spool_in_a_directory_another_user_owns(tmp_path):
    """The state dir owned by another user: they swapped spool/ for a link to a directory of
    theirs, seeded with a forged `resume` line; root appended its records after it."""
    sdir = tmp_path / "state"
    theirs = tmp_path / "theirs"
    sdir.mkdir()
    theirs.mkdir()
    os.chown(sdir, NOBODY, NOBODY)
    os.chown(theirs, NOBODY, NOBODY)
    (sdir / "spool").symlink_to(theirs)
    with pytest.raises(UnsafeDirectory, match="owned by uid 65534"):
        spool.append(sdir / "spool", [{"kind": "heartbeat", "node": "n1"}])
    assert list(theirs.iterdir()) == []
    ours = tmp_path / "ours"
    spool.append(ours / "spool", [{"kind": "heartbeat", "node": "n1"}])  # the usual case
    assert (ours / "spool" / spool.PENDING).exists()


@ROOT_ONLY
def test_root_never_writes_through_a_link_planted_in_a_directory_it_does_not_keep(tmp_path):
    """Debian's /var/lib/prometheus belongs to prometheus: its owner renamed node-exporter/
    away and put a link to a root-only directory in its place; root wrote rsc_health.prom
    there. A link in a directory root keeps still leads where it says; one owned by another
    user in a sticky directory (/tmp) does not."""
    prom = tmp_path / "prometheus"
    victim = tmp_path / "root-only"
    prom.mkdir()
    victim.mkdir(mode=0o700)
    os.chown(prom, NOBODY, NOBODY)
    (prom / "node-exporter").symlink_to(victim)
    with pytest.raises(UnsafeDirectory):
        write_atomic(prom / "node-exporter" / "rsc_health.prom", "x 1\n")
    assert list(victim.iterdir()) == []
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "textfile").symlink_to(victim)  # an operator's own link: followed
    write_atomic(kept / "textfile" / "rsc_health.prom", "x 1\n")
    assert (victim / "rsc_health.prom").read_text() == "x 1\n"
    sticky = tmp_path / "tmp"
    sticky.mkdir()
    os.chmod(sticky, 0o1777)
    (sticky / "textfile").symlink_to(victim)
    os.lchown(sticky / "textfile", NOBODY, NOBODY)
    with pytest.raises(UnsafeDirectory, match="symlink owned by uid 65534"):
        write_atomic(sticky / "textfile" / "other.prom", "x 1\n")


def test_a_pending_verdict_that_could_not_be_saved_is_not_said_to_be_kept(tmp_path, capsys):
    sdir = tmp_path / "state"
    sdir.mkdir()
    os.chmod(sdir, 0o777)  # breaks the directory rule: write_atomic refuses it
    assert save_pending(sdir, _verdict(), why="slurm_unavailable") is False
    assert "cannot save the pending verdict" in capsys.readouterr().err
    os.chmod(sdir, 0o755)
    assert save_pending(sdir, _verdict(), why="slurm_unavailable") is True


def test_shadow_mode_says_a_verdict_held_from_before_is_still_pending(node):
    """An XID 79 while slurmctld was away left a pending verdict; the operator then turned
    shadow mode on. Every run said "would drain" while the gauge said nothing was pending,
    and the verdict would act the day actions came back on, weeks later, after a repair."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    xid = "4,1201,10000000,-;NVRM: Xid (PCI:0000:1b:00): 79, pid=0, GPU has fallen off the bus.\n"
    node.append("dev/kmsg", xid)
    site = node.root / "site.toml"
    base = (node.root / "config.toml").read_text()
    site.write_text(base + '\n[slurm]\nbin_dir = "/nonexistent-slurm"\n'
                    '\n[node]\ntextfile_dir = "/var/lib/node_exporter"\n')
    env = dict(os.environ, RSC_HEALTH_ROOT=str(node.root), RSC_HEALTH_CONFIG=str(site),
               SLURMD_NODENAME="node01", PYTHONPATH=str(repo))
    for k in ("SLURM_JOB_ID", "SLURM_JOBID"):
        env.pop(k, None)

    def sweep() -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "rsc_health.nodepath", "sweep"], env=env,
                              capture_output=True, text=True, timeout=120)

    sweep()
    state = node.root / "var/lib/rsc_health"
    pending = state / "pending_verdict.json"
    assert json.loads(pending.read_text())["why"] == "slurm_unavailable"
    site.write_text(site.read_text() + "\n[actions]\nenabled = false\n")
    out = sweep()
    assert pending.exists()
    assert "stays pending; it acts when [actions] enabled is true again" in out.stderr
    prom = (node.root / "var/lib/node_exporter/rsc_health.prom").read_text()
    assert "rsc_health_pending_drain 1" in prom
