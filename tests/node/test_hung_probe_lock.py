"""A hung mount or a wedged driver never blinds the node (issue 21, class A).

The statvfs/NVML probe child was forked while the node lock was held; stuck in the kernel (a
real FUSE mount whose statfs never returns: the request is in the daemon's hands, so SIGKILL
cannot end the wait) it kept the inherited flock after the run abandoned it, and every later
prolog waited lock_timeout_s and let the job run without looking, every sweep skipped."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.fixtures.nodes.node_copy import NODE_STATE, copy_node

REPO = Path(__file__).resolve().parents[2]
XID79 = "4,9000,99000000,-;NVRM: Xid (PCI:0000:1b:00): 79, pid=77, name=python3, GPU has " \
        "fallen off the bus.\n"


def _env(root: Path, **extra) -> dict:
    env = dict(os.environ, RSC_HEALTH_ROOT=str(root), RSC_HEALTH_CONFIG=str(root / "site.toml"),
               SLURMD_NODENAME="node01", PYTHONPATH=str(REPO))
    env.update(extra)
    for name in ("SLURM_JOB_ID", "SLURM_JOBID", "SLURM_JOB_PARTITION", "SLURM_JOB_NODELIST"):
        if name not in extra:
            env.pop(name, None)
    return env


def _stage(root: Path, name: str, **env) -> tuple[subprocess.CompletedProcess, float]:
    started = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "rsc_health.nodepath", name],
                         env=_env(root, **env), capture_output=True, text=True, timeout=120)
    return out, time.monotonic() - started


def _records(root: Path) -> list[dict]:
    path = root / NODE_STATE / "spool" / "pending.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def _probes_left_behind(root: Path) -> list[int]:
    """Live processes of a node-path run under `root` (the abandoned probe children). A killed
    prober whose thread is stuck in statvfs has a zombie main thread: its environment is read
    through the thread still in the kernel."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        for task in _tasks(entry):
            try:
                environ = (task / "environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if f"RSC_HEALTH_ROOT={root}".encode() in environ:
                pids.append(int(entry.name))
                break
    return pids


def _tasks(entry: Path) -> list[Path]:
    try:
        return list((entry / "task").iterdir())
    except OSError:
        return []


def _lock_is_free(sdir: Path) -> bool:
    fd = os.open(sdir / "node.lock", os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def test_a_probe_stuck_on_a_hung_mount_leaves_the_lock_and_the_next_prolog_sees_xid79(
        hung_mount):
    root = hung_mount
    budget = 12
    (root / "site.toml").write_text((root / "config.toml").read_text() + f"""
[slurm]
bin_dir = "/nonexistent-slurm"
sweep_budget_s = {budget}
prolog_budget_s = {budget}
prolog_families = ["gpu", "xid", "ecc", "remap"]
""")
    sdir = root / NODE_STATE
    sweep, _ = _stage(root, "sweep")
    assert sweep.returncode == 0, sweep.stderr
    assert ("mount", "mount_hung") in {(r.get("check"), r.get("code")) for r in _records(root)}
    beat = next(r for r in _records(root) if r["kind"] == "heartbeat")
    assert set(beat["hung"]) == {"statvfs /checkpoint"}  # which probe, and since when
    # The sweep is gone; its statvfs child is still stuck in the kernel on /checkpoint.
    assert _probes_left_behind(root), "the hung probe child should still be waiting"
    assert _lock_is_free(sdir), "the abandoned probe child still holds node.lock"

    # Slurm was away, so the sweep kept its mount_hung verdict; an operator has dealt with it.
    (sdir / "pending_verdict.json").unlink()
    with (root / "dev/kmsg").open("a") as fh:
        fh.write(XID79)
    prolog, took = _stage(root, "prolog", SLURM_JOB_ID="77")
    assert took < budget, (took, prolog.stderr)
    assert prolog.returncode == 1, prolog.stderr  # slurmd drains the node, requeues the job
    seen = {(r["source"], r["code"]) for r in _records(root) if r["kind"] == "check"}
    assert ("prolog", "xid79") in seen, prolog.stderr


def test_a_mount_that_keeps_hanging_leaves_one_stuck_probe_not_one_per_run(hung_mount):
    """Each run forked a new statvfs child that joined the ones before it in the kernel: one
    more stuck process (with the memory of the run it was forked from) per sweep and per job
    start, for as long as the mount hung. The child left behind is the probe: while it is
    still waiting the mount is hung, and no new one is started."""
    root = hung_mount
    (root / "site.toml").write_text((root / "config.toml").read_text()
                                    + '\n[slurm]\nbin_dir = "/nonexistent-slurm"\n')
    for _ in range(3):
        sweep, _ = _stage(root, "sweep")
        assert sweep.returncode == 0, sweep.stderr
    runs = [r for r in _records(root) if r["kind"] == "check" and r["code"] == "mount_hung"]
    assert len(runs) == 3  # every sweep still says so
    assert len(_probes_left_behind(root)) == 1
    record = json.loads((root / NODE_STATE / "probe_hangs.json").read_text())["probes"]
    assert record["statvfs /checkpoint"]["sweeps"] == 3
    assert record["statvfs /checkpoint"]["pid"] in _probes_left_behind(root)


def test_a_probe_child_holds_none_of_the_parents_descriptors(tmp_path):
    """The child closes what it inherited before it runs the probe: the node lock's descriptor
    (or any other) is not open in it, so a child that never returns holds nothing."""
    from rsc_health.collect import bounded
    from rsc_health.nodepath import node_lock

    with node_lock(tmp_path, 1):
        held = [int(fd) for fd in os.listdir("/proc/self/fd")
                if os.path.realpath(f"/proc/self/fd/{fd}") == str(tmp_path / "node.lock")]
        assert held
        in_child = bounded.call(lambda: sorted(os.listdir("/proc/self/fd")), 5)
    assert not set(map(str, held)) & set(in_child)
    assert len(in_child) <= 5  # 0-2, the answer pipe, the fd listing /proc/self/fd


HOLDER = ("import fcntl, os, sys, time\n"
          "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)\n"
          "fcntl.flock(fd, fcntl.LOCK_EX)\n"
          "print('held', flush=True)\n"
          "time.sleep(600)\n")


@pytest.fixture
def locked_node(tmp_path):
    """A node whose node.lock another process holds for the whole test (a run stuck in the
    kernel, a probe of an older release), with Slurm away."""
    root = copy_node(tmp_path / "node")
    (root / "site.toml").write_text((root / "config.toml").read_text() + """
[slurm]
bin_dir = "/nonexistent-slurm"
lock_timeout_s = 1
prolog_budget_s = 10
sweep_budget_s = 10
""")
    sdir = root / NODE_STATE
    sdir.mkdir(parents=True)
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(sdir / "node.lock")],
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    yield root
    holder.kill()
    holder.wait(10)


def test_a_prolog_that_finds_the_lock_held_still_fails_the_job_for_an_xid79(locked_node):
    root, sdir = locked_node, locked_node / NODE_STATE
    with (root / "dev/kmsg").open("a") as fh:
        fh.write(XID79)
    prolog, took = _stage(root, "prolog", SLURM_JOB_ID="77")
    assert took < 10, (took, prolog.stderr)
    assert prolog.returncode == 1, prolog.stderr
    assert "judging without it" in prolog.stderr
    checks = {(r["check"], r["code"]) for r in _records(root) if r["kind"] == "check"}
    assert {("xid", "xid79"), ("checker", "lock_held")} <= checks
    # Read-only: the XID is still new for whoever holds the lock (or the next locked run).
    assert not (sdir / "xid_cursor.json").exists()
    assert not (sdir / "counters.json").exists()


def test_a_sweep_that_finds_the_lock_held_keeps_the_xid79_verdict_pending(locked_node):
    root, sdir = locked_node, locked_node / NODE_STATE
    with (root / "dev/kmsg").open("a") as fh:
        fh.write(XID79)
    sweep, _ = _stage(root, "sweep")
    assert sweep.returncode == 0, sweep.stderr
    pending = json.loads((sdir / "pending_verdict.json").read_text())  # Slurm is away
    assert [c["code"] for c in pending["causes"]] == ["xid79"]


def test_a_pending_drain_verdict_fails_the_job_though_the_lock_is_held(locked_node):
    from rsc_health import nodepath
    from rsc_health.model import Finding, Severity, Status
    from rsc_health.policy import decide

    cause = Finding("xid", "gpu3", Status.FAIL, Severity.DRAIN_NOW, "Xid 79: fell off the bus",
                    "xid79", True)
    nodepath.save_pending(locked_node / NODE_STATE, decide([cause]), why="slurm_unavailable")
    prolog, _ = _stage(locked_node, "prolog", SLURM_JOB_ID="77")
    assert prolog.returncode == 1, prolog.stderr


def test_a_healthy_node_with_its_lock_held_runs_the_job_and_says_so(locked_node):
    prolog, _ = _stage(locked_node, "prolog", SLURM_JOB_ID="77")
    assert prolog.returncode == 0, prolog.stderr
    records = _records(locked_node)
    beat = next(r for r in records if r["kind"] == "heartbeat")
    assert beat["level"] == "checker_error" and beat["checker_errors"] == 1
    (held,) = [r for r in records if r["kind"] == "check" and r["status"] == "error"]
    assert held["code"] == "lock_held" and "node.lock held for 1s" in held["reason"]
    # Nothing hangs: the hang record a run without the lock keeps is not written either.
    assert not (locked_node / NODE_STATE / "probe_hangs.json").exists()
    assert not (locked_node / "run/rsc-health/probe_hangs.json").exists()


def test_everything_hung_and_the_lock_held_the_prolog_still_refuses_the_job_in_budget(
        hung_mount):
    """The worst case at once: node.lock held by another process, /checkpoint hung (real
    FUSE), NVML wedged, an XID 79 logged. The prolog waits a third of its budget for the
    lock, judges without it, and exits with the drain code within its budget (or, if the
    probes ate the rest, the watchdog's safe exit, which is the drain code too)."""
    root, sdir = hung_mount, hung_mount / NODE_STATE
    budget = 12
    (root / "site.toml").write_text((root / "config.toml").read_text().replace(
        "[gpu]\n", '[gpu]\nbackend = "nvml"\nnvml_binding = "pynvml"\n'
        'nvml_timeout_s = 2.0\n') + f"""
[slurm]
bin_dir = "/nonexistent-slurm"
prolog_budget_s = {budget}
""")
    sdir.mkdir(parents=True)
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(sdir / "node.lock")],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with (root / "dev/kmsg").open("a") as fh:
            fh.write(XID79)
        wedged = REPO / "tests" / "fixtures" / "fault" / "wedged_nvml"
        prolog, took = _stage(root, "prolog", SLURM_JOB_ID="77",
                              PYTHONPATH=f"{wedged}:{REPO}")
    finally:
        holder.kill()
        holder.wait(10)
    assert took < budget + 3, (took, prolog.stderr)
    assert prolog.returncode == 1, prolog.stderr
    checks = {r["code"] for r in _records(root) if r["kind"] == "check"}
    assert {"xid79", "mount_hung", "nvml_hung", "lock_held"} <= checks


def test_healthctl_check_on_a_hung_mount_leaves_one_stuck_probe_not_one_per_check(hung_mount):
    """`healthctl check` (operators, monitoring every minute) kept no hang record: each check
    forked one more statvfs child that stayed stuck in the kernel with the mount. Now a check
    keeps its own record (never the sweep's cursors, baselines or hang counts) and does not
    ask again while its child waits; every check still says the mount hangs."""
    root = hung_mount
    (root / "site.toml").write_text((root / "config.toml").read_text().replace(
        "probe_timeout_s = 2.0", "probe_timeout_s = 0.5")
        + '\n[slurm]\nbin_dir = "/nonexistent-slurm"\n')
    sdir = root / NODE_STATE
    sdir.mkdir(parents=True, exist_ok=True)
    before = {p.name: p.read_bytes() for p in sdir.iterdir() if p.is_file()}
    for _ in range(3):
        out = subprocess.run([sys.executable, "-m", "rsc_health.cli", "check", "--json",
                              "--only", "mount"], env=_env(root), capture_output=True,
                             text=True, timeout=60)
        doc = json.loads(out.stdout)
        codes = {f["code"] for f in doc["findings"]}
        assert "mount_hung" in codes, out.stdout
    assert len(_probes_left_behind(root)) == 1
    # The sweep's own state is untouched: a check counts no sweep and moves no baseline.
    assert {n: b for n, b in ((p.name, p.read_bytes()) for p in sdir.iterdir() if p.is_file())
            if n in before} == before
    assert not (sdir / "probe_hangs.json").exists()
