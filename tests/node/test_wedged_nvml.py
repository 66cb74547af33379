"""A wedged driver is the node's fault once it has stayed wedged (issue 21, class A).

An NVML that never answers (tests/fixtures/fault/wedged_nvml: every call blocks, as ioctls into
a wedged driver do) was a checker error on every sweep for ever: jobs kept starting on GPUs
that need a reset. After [gpu] nvml_hang_sweeps sweeps in a row it drains after the job
(nvml_wedged, a repair); the heartbeat and the textfile say which probe hangs and since when."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.fixtures.nodes.node_copy import NODE_STATE, copy_node

REPO = Path(__file__).resolve().parents[2]
WEDGED = REPO / "tests" / "fixtures" / "fault" / "wedged_nvml"
TEXTFILE = "var/lib/node_exporter/rsc_health.prom"


@pytest.fixture
def gpu_node(tmp_path):
    root = copy_node(tmp_path / "node")
    (root / "site.toml").write_text((root / "config.toml").read_text().replace(
        "[gpu]\n", '[gpu]\nbackend = "nvml"\nnvml_binding = "pynvml"\n'  # its wedged pynvml
        'nvml_timeout_s = 1.0\n')  # nvml_hang_sweeps 3
        + '\n[node]\ntextfile_dir = "/var/lib/node_exporter"\n'
        + '[slurm]\nbin_dir = "/nonexistent-slurm"\nsweep_budget_s = 10\nprolog_budget_s = 10\n')
    return root


def _stage(root: Path, name: str, *, wedged: bool = True) -> subprocess.CompletedProcess:
    env = dict(os.environ, RSC_HEALTH_ROOT=str(root), RSC_HEALTH_CONFIG=str(root / "site.toml"),
               SLURMD_NODENAME="node01",
               PYTHONPATH=f"{WEDGED}:{REPO}" if wedged else str(REPO))
    for key in ("SLURM_JOB_ID", "SLURM_JOBID", "SLURM_JOB_PARTITION", "SLURM_JOB_NODELIST"):
        env.pop(key, None)
    if name == "prolog":
        env["SLURM_JOB_ID"] = "77"
    out = subprocess.run([sys.executable, "-m", "rsc_health.nodepath", name], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode in (0, 1), out.stderr
    return out


def _runs(root: Path) -> list[list[dict]]:
    """The spooled records, one list per run (a run's records share one time)."""
    runs: dict[str, list[dict]] = {}
    for line in (root / NODE_STATE / "spool/pending.jsonl").read_text().splitlines():
        rec = json.loads(line)
        runs.setdefault(rec["time"], []).append(rec)
    return list(runs.values())


def _codes(run: list[dict]) -> set[str]:
    return {r["code"] for r in run if r["kind"] == "check" and r["status"] != "ok"}


def _hangs(root: Path) -> dict:
    return json.loads((root / NODE_STATE / "probe_hangs.json").read_text())["probes"]


def test_nvml_hung_for_three_sweeps_drains_the_node_after_its_job(gpu_node):
    root = gpu_node
    for _ in range(2):
        _stage(root, "sweep")
    _stage(root, "prolog")  # a job start neither counts a sweep nor resets the count
    assert not (root / NODE_STATE / "pending_verdict.json").exists()  # not yet the node's fault
    _stage(root, "sweep")

    runs = _runs(root)
    assert [("nvml_wedged" in _codes(r), "nvml_hung" in _codes(r)) for r in runs] == [
        (False, True), (False, True), (False, True), (True, True)]
    assert _hangs(root)["nvml"]["sweeps"] == 3
    beats = [next(x for x in r if x["kind"] == "heartbeat") for r in runs]
    since = {b["hung"]["nvml"] for b in beats}
    assert len(since) == 1  # since the first hang, on every run
    assert beats[-1]["level"] == "drain_after_job"
    pending = json.loads((root / NODE_STATE / "pending_verdict.json").read_text())  # Slurm away
    assert [c["code"] for c in pending["causes"]] == ["nvml_wedged"]
    assert pending["causes"][0]["repair"] is True
    prom = (root / TEXTFILE).read_text()
    assert 'rsc_health_probe_hung_since_seconds{source="sweep",probe="nvml"}' in prom


def test_an_nvml_that_answers_again_starts_the_count_afresh(gpu_node):
    root = gpu_node
    for _ in range(2):
        _stage(root, "sweep")
    assert _hangs(root)["nvml"]["sweeps"] == 2
    _stage(root, "sweep", wedged=False)  # the real pynvml answers (no driver here: at once)
    assert "nvml" not in _hangs(root)
    assert "probe_hung_since" not in (root / TEXTFILE).read_text()  # no stale line
    _stage(root, "sweep")
    assert _hangs(root)["nvml"]["sweeps"] == 1
    assert "nvml_wedged" not in _codes(_runs(root)[-1])


XID79 = ("4,9000,99000000,-;NVRM: Xid (PCI:0000:1b:00): 79, pid=77, name=python3, GPU has "
         "fallen off the bus.\n")


def _live_children(root: Path) -> list[int]:
    """Live processes of node-path runs under `root` (the wedged stand-in's askers)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if f"RSC_HEALTH_ROOT={root}".encode() in environ and state != "Z":
            out.append(int(entry.name))
    return out


@pytest.fixture
def short_prolog(gpu_node):
    """NVML's default timeout (10 s) and a site that keeps its job starts short (8 s budget:
    the checks get about 4 s of it). The wedged stand-in's askers are killed after."""
    site = (gpu_node / "site.toml").read_text()
    (gpu_node / "site.toml").write_text(site.replace("nvml_timeout_s = 1.0\n", "")
                                        .replace("prolog_budget_s = 10", "prolog_budget_s = 8"))
    yield gpu_node
    for pid in _live_children(gpu_node):
        os.kill(pid, signal.SIGKILL)


def test_a_prolog_budget_shorter_than_nvml_timeout_abandons_and_records_the_nvml_child(
        short_prolog):
    # NVML's wait was not capped by the run's deadline: the watchdog ended each job start
    # with the child still asking, neither killed nor recorded, one more per job start.
    root = short_prolog
    for _ in range(3):
        out = _stage(root, "prolog")
        assert "still running after" not in out.stderr  # not the watchdog: NVML's own wait
    time.sleep(0.5)
    assert len(_live_children(root)) <= 1
    assert "nvml_hung" in _codes(_runs(root)[-1])
    assert "nvml" in _hangs(root)


def test_an_xid79_fails_the_job_start_while_nvml_hangs_past_a_short_prolog_budget(short_prolog):
    root = short_prolog
    with (root / "dev/kmsg").open("a") as fh:
        fh.write(XID79)
    out = _stage(root, "prolog")
    assert out.returncode == 1, out.stderr  # the XID read after NVML is judged


def test_the_hang_record_keeps_what_a_run_did_not_ask_and_forgets_a_reboot():
    from datetime import UTC, datetime

    from rsc_health.collect import hangs

    t0, t1 = datetime(2026, 11, 1, tzinfo=UTC), datetime(2026, 11, 1, 0, 5, tzinfo=UTC)
    first = hangs.update({}, "boot-a", {"nvml", "statvfs"},
                         {"nvml": None, "statvfs /home": None}, t0, sweep=True)
    assert first == {"nvml": {"since": t0.isoformat(), "sweeps": 1},
                     "statvfs /home": {"since": t0.isoformat(), "sweeps": 1}}
    saved = {"boot_id": "boot-a", "probes": first}
    # An epilog asks NVML only (it hangs again) and no mount: /home's record stays as it was.
    assert hangs.update(saved, "boot-a", {"nvml"}, {"nvml": None}, t1, sweep=False) == first
    # A sweep whose statvfs answered drops it; NVML counts on from its first hang.
    assert hangs.update(saved, "boot-a", {"nvml", "statvfs"}, {"nvml": None}, t1,
                        sweep=True) == {
        "nvml": {"since": t0.isoformat(), "sweeps": 2}}
    # A new boot (the cure for a wedged driver) starts the count afresh.
    assert hangs.update(saved, "boot-b", {"nvml"}, {"nvml": None}, t1, sweep=True) == {
        "nvml": {"since": t1.isoformat(), "sweeps": 1}}


@pytest.fixture
def locked_gpu_node(gpu_node):
    """The gpu node with its node.lock held by another process for the whole test (a run
    stuck in the kernel, in D state, on the same wedged driver)."""
    from .test_hung_probe_lock import HOLDER

    site = gpu_node / "site.toml"
    site.write_text(site.read_text() + "lock_timeout_s = 1\n")
    sdir = gpu_node / NODE_STATE
    sdir.mkdir(parents=True, exist_ok=True)
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(sdir / "node.lock")],
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    yield gpu_node
    holder.kill()
    holder.wait(10)


def test_nvml_hung_for_three_sweeps_drains_the_node_though_its_lock_is_held_for_good(
        locked_gpu_node):
    """Runs that found the lock held judged read-only and kept no hang record: NVML
    unanswered on every sweep stayed `nvml_hung` with "1 sweep(s) in a row" for ever, a
    checker error, and the node kept taking jobs on GPUs that answer nothing. The record of
    the probes consumes no event: it is kept without the lock, and the count runs on."""
    root = locked_gpu_node
    for _ in range(2):
        assert "judging without it" in _stage(root, "sweep").stderr
    _stage(root, "prolog")  # a job start neither counts a sweep nor resets the count
    assert not (root / NODE_STATE / "pending_verdict.json").exists()  # not yet the node's
    _stage(root, "sweep")

    runs = _runs(root)
    assert [("nvml_wedged" in _codes(r), "lock_held" in _codes(r)) for r in runs] == [
        (False, True), (False, True), (False, True), (True, True)]
    hung = [next(x["reason"] for x in r if x["kind"] == "check" and x["code"] == "nvml_hung")
            for r in runs]
    assert [re.search(r"\((\d+) sweep\(s\) in a row\)", h).group(1) for h in hung] == [
        "1", "2", "2", "3"], hung
    beats = [next(x for x in r if x["kind"] == "heartbeat") for r in runs]
    assert len({b["hung"]["nvml"] for b in beats}) == 1  # since the first hang, on every run
    pending = json.loads((root / NODE_STATE / "pending_verdict.json").read_text())  # Slurm away
    assert [c["code"] for c in pending["causes"]] == ["nvml_wedged"]
    assert pending["causes"][0]["repair"] is True
    # Still read-only: no cursor or baseline was moved without the lock.
    assert not (root / NODE_STATE / "xid_cursor.json").exists()
    assert not (root / NODE_STATE / "counters.json").exists()
