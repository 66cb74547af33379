"""A run the watchdog ends still judges what it read before the hang.

Every probe a deadline can reach (NVML, statvfs, the InfiniBand ports, the leftover scan's
/proc) runs in an abandonable child. What is left in-process (a plain-file kernel-log source
on a disk that stops answering, a collector's bug that loops) hangs the run until the
watchdog ends it at budget + 2 s. The watchdog used to exit 0 from a prolog stuck there, even
when NVML had already called a GPU lost, or a drain verdict from before was pending: the node
took the job, the requeued one after it, and each later one. Now it judges the families whose
every input came in before the hang (engine.InFlight) and a pending drain verdict, spools what
it found, and a drain fails the job start as a whole run's would.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from rsc_health import nodepath
from tests.fixtures.nodes.node_copy import NODE_STATE, copy_node
from tests.node.conftest import FAULT, FIXTURES, Node, _fuse_available, start_fuse

REPO = Path(__file__).resolve().parents[2]
KERNEL_LOG = "var/log/kernel-only.log"
XID79 = "4,9000,99000000,-;NVRM: Xid (PCI:0000:1b:00): 79, pid=77, name=python3, GPU has " \
        "fallen off the bus.\n"


def _env(root: Path, budget: int = 1) -> dict:
    site = root / "site.toml"
    site.write_text((root / "config.toml").read_text()
                    + f'\n[slurm]\nprolog_budget_s = {budget}\nsweep_budget_s = {budget}\n'
                    'bin_dir = "/nonexistent-slurm"\n')
    return dict(os.environ, RSC_HEALTH_ROOT=str(root), RSC_HEALTH_CONFIG=str(site),
                SLURMD_NODENAME="node01", SLURM_JOB_ID="4242", PYTHONPATH=str(REPO))


def _lose_gpu(root: Path, index: int = 3) -> None:
    Node(root).nvml(lambda d: d["devices"].__setitem__(
        index, {"index": index, "error": "NVML_ERROR_GPU_IS_LOST"}))


def _hang_collector(family: str) -> str:
    """A script running the prolog with `family`'s collector stuck for ever (as a read in the
    kernel would be: no exception, no return)."""
    return ("import time, sys\nfrom rsc_health import nodepath\n"
            f"import rsc_health.checks.{family} as fam\n"
            "fam.collect = lambda root, env: time.sleep(600)\n"
            "raise SystemExit(nodepath.run_stage(sys.argv[1]))\n")


def _run(script: str, env: dict, stage: str = "prolog") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", script, stage], capture_output=True,
                          text=True, timeout=60, cwd=REPO, env=env)


def _records(root: Path) -> list[dict]:
    path = root / NODE_STATE / "spool" / "pending.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture
def root(tmp_path) -> Path:
    return copy_node(tmp_path / "node", FIXTURES / "healthy")


def test_a_prolog_stuck_after_nvml_called_a_gpu_lost_fails_the_job_start(root):
    _lose_gpu(root)
    proc = _run(_hang_collector("xid"), _env(root))

    assert proc.returncode == 1, proc.stderr
    assert "still running after 3s during checks" in proc.stderr
    assert "judged what was read before it, not " in proc.stderr and "xid" in proc.stderr
    records = _records(root)
    codes = {r.get("code") for r in records if r["kind"] == "check"}
    assert {"gpu_lost", "checker_timeout"} <= codes
    beat = [r for r in records if r["kind"] == "heartbeat"]
    assert len(beat) == 1 and beat[0]["level"] == "drain_now"
    pending = json.loads((root / NODE_STATE / nodepath.PENDING_VERDICT_FILE).read_text())
    assert pending["why"] == "fault"


def test_the_families_not_read_before_the_hang_are_not_judged(root):
    """A collector that never returned left its family's input unread: judged, it would be
    a missing input (a false drain); it is named as not judged instead. Here the mount
    family hangs on a healthy node: nothing drains, the prolog lets the job run."""
    proc = _run(_hang_collector("mount"), _env(root))

    assert proc.returncode == 0, proc.stderr
    records = _records(root)
    checks = [r for r in records if r["kind"] == "check"]
    timeout = [r for r in checks if r.get("code") == "checker_timeout"]
    assert len(timeout) == 1 and "not judged: " in timeout[0]["reason"]
    unjudged = timeout[0]["reason"].split("not judged: ", 1)[1].split(", ")
    assert "mount" in unjudged and "gpu" not in unjudged
    assert not any(r.get("check") == "mount" for r in checks)
    assert not (root / NODE_STATE / nodepath.PENDING_VERDICT_FILE).exists()
    assert [r["level"] for r in records if r["kind"] == "heartbeat"] == ["checker_error"]


def test_a_pending_drain_verdict_fails_a_prolog_the_watchdog_ends(root):
    """A drain verdict kept from a sweep whose Slurm call failed: a prolog stuck in a
    collector before its verdict step exited 0 and the job ran on the fault. It fails the
    job start now, and the pending file stays as it was (not rewritten as a fault's)."""
    _lose_gpu(root)
    env = _env(root, budget=8)
    first = subprocess.run([sys.executable, "-m", "rsc_health.nodepath", "sweep"],
                           capture_output=True, text=True, timeout=60, cwd=REPO, env=env)
    assert first.returncode == 0, first.stderr
    path = root / NODE_STATE / nodepath.PENDING_VERDICT_FILE
    kept = path.read_text()
    assert json.loads(kept)["why"] == "slurm_unavailable"
    Node(root).write("rsc_health/nvml.json",
                     (FIXTURES / "healthy" / "rsc_health" / "nvml.json").read_text())

    proc = _run(_hang_collector("xid"), _env(root))

    assert proc.returncode == 1, proc.stderr
    assert path.read_text() == kept


def _guard_held(root: Path, causes: list | None = None) -> tuple[Path, dict]:
    """node01 with a lost GPU whose drain verdict the mass-drain guard holds (3 holds, a
    backoff far ahead), as a sweep under a fleet-wide outage leaves it."""
    _lose_gpu(root)
    subprocess.run([sys.executable, "-m", "rsc_health.nodepath", "sweep"], capture_output=True,
                   timeout=60, cwd=REPO, env=_env(root, budget=8))
    path = root / NODE_STATE / nodepath.PENDING_VERDICT_FILE
    doc = json.loads(path.read_text())
    doc.update(why="guard", holds=3, retry_after="2099-01-01T00:00:00+00:00")
    if causes is not None:
        doc["causes"] = causes
    path.write_text(json.dumps(doc))
    return path, doc


def test_a_guard_held_verdict_lets_the_job_run_as_a_whole_prolog_would(root):
    """The guard holds node01's verdict and the GPU is still lost: a whole prolog lets the
    job run (the guard's word); one the watchdog ended failed the job start (slurmd drained
    the node the guard held back) and rewrote the verdict as a fault's, its holds gone."""
    path, _ = _guard_held(root)
    whole = subprocess.run([sys.executable, "-m", "rsc_health.nodepath", "prolog"],
                           capture_output=True, text=True, timeout=60, cwd=REPO,
                           env=_env(root, budget=8))
    assert whole.returncode == 0, whole.stderr

    proc = _run(_hang_collector("xid"), _env(root))

    assert proc.returncode == 0, proc.stderr
    after = json.loads(path.read_text())
    assert after["why"] == "guard" and after["holds"] == 3


def test_the_causes_a_guard_holds_are_kept_beside_what_the_watchdog_found(root):
    """The guard holds an XID 79 (its kernel-log line consumed long ago); a prolog stuck
    after NVML called another GPU lost replaced the pending file with the fresh verdict
    alone: the XID 79 was lost for good."""
    cause = {"family": "xid", "component": "gpu1", "status": "fail", "severity": "drain_now",
             "reason": "gpu1 XID 79 GPU has fallen off the bus", "code": "xid79"}
    path, _ = _guard_held(root, causes=[cause])

    _run(_hang_collector("xid"), _env(root))

    after = json.loads(path.read_text())
    assert {"xid79", "gpu_lost"} <= {c.get("code") for c in after["causes"]}
    assert after["why"] == "guard" and after["holds"] == 3


@pytest.mark.parametrize("stage", ["sweep", "epilog"])
def test_a_sweep_or_epilog_the_watchdog_ends_keeps_the_drain_for_the_next_run(root, stage):
    _lose_gpu(root)
    proc = _run(_hang_collector("xid"), _env(root), stage)

    assert proc.returncode == 0, proc.stderr
    pending = json.loads((root / NODE_STATE / nodepath.PENDING_VERDICT_FILE).read_text())
    assert pending["why"] == "fault"
    assert any(c.get("code") == "gpu_lost" for c in pending["causes"])


def test_the_textfile_shows_the_drain_the_watchdog_judged(root):
    _lose_gpu(root)
    env = _env(root)
    site = Path(env["RSC_HEALTH_CONFIG"])
    site.write_text(site.read_text() + '\n[node]\ntextfile_dir = "/var/lib/node_exporter"\n')
    proc = _run(_hang_collector("xid"), env)

    assert proc.returncode == 1, proc.stderr
    text = (root / "var/lib/node_exporter" / nodepath.TEXTFILE).read_text()
    assert 'rsc_health_verdict_level{source="prolog"} 3' in text
    assert 'rsc_health_family_status{family="gpu"} 3' not in text  # a fail, not an error
    assert 'rsc_health_family_status{family="gpu"} 2' in text


@contextmanager
def _hung_read(tmp_path: Path, under: str, name: str, text: str) -> Iterator[Path]:
    """The healthy node with ROOT/under served by FUSE (tests/fixtures/fault/hung_read_fuse.py)
    from a directory holding `name` (its text), whose read never answers: the reader blocks
    in the kernel, where no deadline reaches the run that made it."""
    if not _fuse_available():
        pytest.skip("FUSE (fusepy and /dev/fuse) is not available here")
    root = copy_node(tmp_path / "node", FIXTURES / "healthy")
    source = tmp_path / f"{Path(under).name}-source"
    source.mkdir()
    os.chmod(source, 0o755)
    (source / name).write_text(text)
    point = root / under
    point.mkdir(parents=True, exist_ok=True)
    proc = start_fuse(point, FAULT / "hung_read_fuse.py", str(source), str(point), name)
    try:
        yield root
    finally:
        proc.kill()  # the kernel then fails the waiting read; then unmount
        proc.wait(10)
        subprocess.run(["fusermount", "-u", "-z", str(point)], capture_output=True)
        shutil.rmtree(source, ignore_errors=True)


@pytest.fixture
def hung_kernel_log(tmp_path):
    """A plain-file kernel-log source on a /var/log that stopped answering (a local disk or
    NFS)."""
    with _hung_read(tmp_path, "var/log", "kernel-only.log",
                    "2026-11-29T01:00:00.000000+00:00 node01 kernel: [ 10.0] NVRM: "
                    "loading\n") as root:
        yield root


def _with_file_source(env: dict) -> None:
    site = Path(env["RSC_HEALTH_CONFIG"])
    text = site.read_text()
    line = f'sources = ["/dev/kmsg", "/{KERNEL_LOG}"]\n'
    site.write_text(text.replace("[xid]\n", "[xid]\n" + line, 1) if "[xid]\n" in text
                    else text + "\n[xid]\n" + line)


def test_a_kernel_log_file_that_never_answers_is_abandoned_and_the_ring_still_read(
        hung_kernel_log):
    """The read in the run's own process held the prolog until its watchdog, and its exit
    after that (a thread in a FUSE read does not die): slurmd never heard back. Now the
    files are read from a child, abandoned at half the time left; the ring buffer is read
    alone, an XID 79 there still fails the job, a GPU NVML calls lost too, and the hang is
    recorded so the next run does not leave a second child behind it."""
    root = hung_kernel_log
    _lose_gpu(root)
    (root / "dev/kmsg").open("a").write(XID79)
    env = _env(root, budget=8)
    _with_file_source(env)
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "rsc_health.nodepath", "prolog"],
                          capture_output=True, text=True, timeout=60, cwd=REPO, env=env)
    took = time.monotonic() - started

    assert proc.returncode == 1, proc.stderr
    assert took < 8, (took, proc.stderr)  # not the watchdog at budget + 2 s
    assert "still running after" not in proc.stderr
    checks = [r for r in _records(root) if r["kind"] == "check"]
    codes = {r.get("code") for r in checks}
    assert {"gpu_lost", "xid79"} <= codes
    said = " ".join(r["reason"] for r in checks if r["status"] == "error")
    assert f"/{KERNEL_LOG}: the kernel log read did not answer within" in said
    record = json.loads((root / "run/rsc-health/probe_hangs.json").read_text()) \
        if (root / "run/rsc-health/probe_hangs.json").exists() else None
    hung = json.loads((root / NODE_STATE / "probe_hangs.json").read_text())["probes"]
    assert "kernel_log xid" in hung and isinstance(hung["kernel_log xid"]["pid"], int)
    assert record is None or "kernel_log xid" in record["probes"]

    again = subprocess.run([sys.executable, "-m", "rsc_health.nodepath", "sweep"],
                           capture_output=True, text=True, timeout=60, cwd=REPO, env=env)
    assert again.returncode == 0, again.stderr
    later = [r for r in _records(root) if r["kind"] == "check" and r["status"] == "error"]
    assert any("still waiting in the kernel; not read again" in r["reason"] for r in later)
    hung_after = json.loads((root / NODE_STATE / "probe_hangs.json").read_text())["probes"]
    assert hung_after["kernel_log xid"]["pid"] == hung["kernel_log xid"]["pid"]


def test_a_lost_cursor_stays_lost_for_the_files_a_hung_read_left(tmp_path, monkeypatch):
    """An XID cursor cut by a power loss, then a kernel-log file whose read hung: the cursor
    saved had neither the file's entry nor the loss, so the next read took the file from its
    start and judged an XID 79 logged 30 days before (a repaired node drained again)."""
    from rsc_health.checks.env import CollectEnv
    from rsc_health.checks.state import NodeState
    from rsc_health.collect import klog, kmsg
    from rsc_health.config import load_config

    root = copy_node(tmp_path / "node", FIXTURES / "healthy")
    log = "var/log/kern.log"
    site = root / "site.toml"
    site.write_text((root / "config.toml").read_text()
                    + f'\n[xid]\nsources = ["/dev/kmsg", "/{log}"]\n')
    (root / "var/log").mkdir(parents=True)
    old = time.time() - 30 * 86400

    def iso(t):
        return time.strftime("%Y-%m-%dT%H:%M:%S.000000+00:00", time.gmtime(t))

    (root / log).write_text(
        f"{iso(old)} node01 kernel: [ 10.0] NVRM: Xid (PCI:0000:1b:00): 79, pid=77, "
        "name=python3, GPU has fallen off the bus.\n"
        + "".join(f"{iso(old + i)} node01 kernel: [ 11.0] line {i}\n" for i in range(5)))
    cfg = load_config(site)
    saved = tmp_path / "xid_cursor.json"
    saved.write_text("")  # cut short
    os.utime(saved, (time.time() - 3600, time.time() - 3600))

    def read(cursor, deadline=None):
        state = NodeState(boot_id=kmsg.boot_id(root))
        return klog.read(root, CollectEnv(cfg, deadline, state, {"xid": cursor}, {}, 2.0),
                         "xid"), state

    real = kmsg._read_log_file
    monkeypatch.setattr(kmsg, "_read_log_file", lambda *a, **k: time.sleep(30))
    hung, state = read(kmsg.load_cursor(saved), deadline=time.monotonic() + 1.0)
    assert "kernel_log xid" in state.hung_probes
    monkeypatch.setattr(kmsg, "_read_log_file", real)
    kmsg.save_json(saved, hung.cursor)
    again, _ = read(kmsg.load_cursor(saved))
    assert not [e for e in again.events if e.xid == 79]


@pytest.fixture
def hung_state_dir(tmp_path):
    """node01 whose state dir is a FUSE mount where reading pending_verdict.json never
    answers (a state dir on NFS or a failing disk)."""
    with _hung_read(tmp_path, str(NODE_STATE), nodepath.PENDING_VERDICT_FILE, json.dumps({
            "level": 3, "why": "slurm_unavailable", "time": "2026-11-29T00:00:00+00:00",
            "causes": [{"family": "gpu", "component": "gpu3", "status": "fail",
                        "severity": "drain_now", "reason": "gpu3 lost",
                        "code": "gpu_lost"}]})) as root:
        yield root


def test_the_watchdog_says_it_fired_before_it_reads_the_state_dir(hung_state_dir, tmp_path):
    """The run hangs reading the pending verdict; the watchdog's own judging read it again,
    hung there too, and the backstop left without a word: the line naming the hang came
    after. It comes first now, and the verdict step's read is not repeated."""
    env = _env(hung_state_dir)
    err = tmp_path / "stderr"
    with err.open("w") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "rsc_health.nodepath", "prolog"],
                                stdout=subprocess.DEVNULL, stderr=fh, cwd=REPO, env=env)
    try:
        deadline = time.monotonic() + 15
        while "exiting" not in err.read_text() and time.monotonic() < deadline:
            time.sleep(0.2)
        said = err.read_text()
    finally:
        proc.kill()  # stuck in the FUSE read: it dies once the fixture kills the daemon
    assert "still running after 3s during verdict" in said, said
    assert "exiting" in said, said
