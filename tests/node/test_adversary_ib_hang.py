"""An InfiniBand counter read that blocks in the kernel never blinds the node.

A wedged mlx5 firmware command holds a sysfs counter read (each counter file is a MAD to the
HCA's firmware) in the kernel, where the stage deadline cannot interrupt it. Before, the read
was the run's own: the prolog hung there until its watchdog killed it, every family after it
unjudged (a lost GPU took the job), and every later run hung the same way. Now the ports are
read in an abandonable child (rsc_health.collect.ibports, like NVML and statvfs): the hang is
said (`ib_hung`), recorded (collect.hangs: `ib`, since, sweeps, pid/start), the stuck child is
not asked again while it waits, and after [infiniband] hang_sweeps sweeps in a row the node
drains after its job (`ib_wedged`).

Faked with a real FUSE mount over /sys/class/infiniband whose read of one counter file never
answers (tests/fixtures/fault/hung_read_fuse.py): the reader is left in the kernel as a reader
of a wedged HCA is."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rsc_health import engine
from rsc_health.collect import hangs
from rsc_health.config import state_dir
from rsc_health.model import Level, Severity, Status
from rsc_health.policy import decide
from tests.fixtures.nodes.node_copy import NODE_STATE, copy_node
from tests.node.conftest import FAULT, FIXTURES, Node, _fuse_available, start_fuse

HUNG_FILE = "mlx5_3/ports/1/counters/symbol_error"
REPO = Path(__file__).resolve().parents[2]
DRAINS = (Severity.DRAIN_NOW, Severity.DRAIN_AFTER_JOB)


@pytest.fixture
def hung_ib(tmp_path):
    """The healthy node with its /sys/class/infiniband served by FUSE, mlx5_3 port 1's
    symbol_error read never answering."""
    if not _fuse_available():
        pytest.skip("FUSE (fusepy and /dev/fuse) is not available here")
    root = copy_node(tmp_path / "node", FIXTURES / "healthy")
    point = root / "sys/class/infiniband"
    source = tmp_path / "ib-source"
    shutil.move(str(point), str(source))
    point.mkdir()
    proc = start_fuse(point, FAULT / "hung_read_fuse.py", str(source), str(point), HUNG_FILE)
    node = Node(root)
    node.fuse = proc  # type: ignore[attr-defined]
    try:
        yield node
    finally:
        proc.kill()  # the kernel then fails the waiting read; then unmount
        proc.wait(10)
        subprocess.run(["fusermount", "-u", "-z", str(point)], capture_output=True)
        _kill_left_children(root)


def _kill_left_children(root: Path) -> None:
    rec = hangs.load(root / NODE_STATE / engine.HANGS_FILE)["probes"].get(hangs.IB) or {}
    if type(rec.get("pid")) is int:
        try:
            os.kill(rec["pid"], signal.SIGKILL)
        except ProcessLookupError:
            pass


def _lose_gpu(node: Node, index: int) -> None:
    node.nvml(lambda d: d["devices"].__setitem__(
        index, {"index": index, "error": "NVML_ERROR_GPU_IS_LOST"}))


def _config(node: Node, **infiniband):
    cfg = node.config
    cfg.data["infiniband"].update(read_timeout_s=1.0, **infiniband)
    return cfg


def test_a_lost_gpu_drains_at_job_start_while_an_ib_counter_read_hangs(hung_ib):
    """The prolog as slurmd runs it: a GPU is lost and an IB counter read blocks in the kernel.
    Before: the prolog hung in the read until its watchdog ended it (exit 0: the job ran on
    the lost GPU). Now the GPU is judged, the node drains, the hang is said, within budget."""
    root = hung_ib.root
    budget = 12
    (root / "site.toml").write_text((root / "config.toml").read_text().replace(
        "[infiniband]\n", "[infiniband]\nread_timeout_s = 1.0\n") + f"""
[slurm]
bin_dir = "/nonexistent-slurm"
sweep_budget_s = {budget}
prolog_budget_s = {budget}
""")
    _lose_gpu(hung_ib, 2)
    env = dict(os.environ, RSC_HEALTH_ROOT=str(root), RSC_HEALTH_CONFIG=str(root / "site.toml"),
               SLURMD_NODENAME="node01", PYTHONPATH=str(REPO), SLURM_JOB_ID="77")
    started = time.monotonic()
    prolog = subprocess.Popen([sys.executable, "-m", "rsc_health.nodepath", "prolog"], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _, stderr = prolog.communicate(timeout=budget + 10)
    except subprocess.TimeoutExpired:
        # Stuck in the kernel past its own watchdog (SIGKILL does not end it): let the read
        # fail by ending the "firmware", then say so.
        hung_ib.fuse.kill()
        _, stderr = prolog.communicate(timeout=30)
        pytest.fail(f"the prolog was still in the IB read after {budget + 10}s: {stderr[-500:]}")
    took = time.monotonic() - started
    assert took < budget, (took, stderr)
    assert prolog.returncode == 1, stderr  # slurmd drains the node and requeues the job
    out = subprocess.CompletedProcess(prolog.args, prolog.returncode, "", stderr)
    spool = root / NODE_STATE / "spool" / "pending.jsonl"
    seen = {(r.get("check"), r.get("component"), r.get("code"))
            for r in map(json.loads, spool.read_text().splitlines()) if r["kind"] == "check"}
    assert ("gpu", "gpu2", "gpu_lost") in seen, out.stderr
    assert ("checker", hangs.IB, "ib_hung") in seen, out.stderr


def test_the_hang_is_said_recorded_and_the_rest_still_judged(hung_ib):
    cfg = _config(hung_ib)
    _lose_gpu(hung_ib, 5)
    started = time.monotonic()
    findings = engine.run(cfg, hung_ib.root, budget_s=10, sweep=True)
    assert time.monotonic() - started < 5
    assert ("gpu", "gpu5", "gpu_lost") in {(f.family, f.component, f.code) for f in findings}
    assert decide(findings).level is Level.DRAIN_NOW
    hung = [f for f in findings if f.code == "ib_hung"]
    assert len(hung) == 1 and hung[0].severity is Severity.NONE
    assert hung[0].data["probe"] == hangs.IB and hung[0].data["sweeps"] == 1
    # The ports answered before the hang are judged; the one whose read hung and those after
    # it are checker errors, never drains (the IB family drains nothing here).
    ib = {f.component: f for f in findings if f.family == "infiniband"}
    assert ib["mlx5_0/1"].status is Status.OK and ib["mlx5_2/1"].status is Status.OK
    assert not [f for f in findings if f.family == "infiniband" and f.severity in DRAINS]
    record = hangs.load(Path(state_dir(cfg, hung_ib.root)) / engine.HANGS_FILE)["probes"][hangs.IB]
    assert record["sweeps"] == 1 and hangs.still_waiting(record)
    # The telemetry family keeps its sample (the ports read before the hang among it).
    sample = next(f for f in findings if f.family == "telemetry" and f.component == "node")
    assert {p["port"] for p in sample.data["ports"]} >= {"mlx5_0/1", "mlx5_2/1"}


def test_the_stuck_child_is_not_asked_again_and_after_n_sweeps_the_node_drains(hung_ib):
    cfg = _config(hung_ib, hang_sweeps=3)
    sdir = Path(state_dir(cfg, hung_ib.root))
    first = engine.run(cfg, hung_ib.root, sweep=True)
    assert "ib_wedged" not in {f.code for f in first}
    stuck = hangs.load(sdir / engine.HANGS_FILE)["probes"][hangs.IB]
    for n in (2, 3):
        started = time.monotonic()
        again = engine.run(cfg, hung_ib.root, sweep=True)
        assert time.monotonic() - started < 1.0  # no wait: the stuck child is the answer
        hung = next(f for f in again if f.code == "ib_hung")
        assert "not asked again" in hung.reason and hung.data["sweeps"] == n
        record = hangs.load(sdir / engine.HANGS_FILE)["probes"][hangs.IB]
        assert record["pid"] == stuck["pid"]  # one child stuck, not one per run
        # No port judged without its read: no "HCA missing" drain for a read that hung.
        assert not [f for f in again if f.family == "infiniband" and f.severity in DRAINS
                    and f.code != "ib_wedged"]
    wedged = [f for f in again if f.code == "ib_wedged"]
    assert len(wedged) == 1 and wedged[0].severity is Severity.DRAIN_AFTER_JOB
    assert wedged[0].repair is True
    assert decide(again).level is Level.DRAIN_AFTER_JOB


def test_a_prolog_run_says_the_hang_but_does_not_count_a_sweep(hung_ib):
    cfg = _config(hung_ib, hang_sweeps=1)
    engine.run(cfg, hung_ib.root)  # not a sweep
    findings = engine.run(cfg, hung_ib.root)
    hung = next(f for f in findings if f.code == "ib_hung")
    assert hung.data["sweeps"] == 0
    assert "ib_wedged" not in {f.code for f in findings}


def test_a_child_asked_after_its_deadline_passed_still_gives_what_it_answered():
    """The ports' child is forked before NVML is asked and waited for after: when NVML took
    longer than read_timeout_s, the deadline has passed by the time the child is asked. Before,
    nothing it wrote was read then, and a child that had answered long before counted as hung
    (ib_hung for a healthy HCA). Now what it wrote is read; only no wait is made."""
    from rsc_health.collect import bounded

    pid, fd = bounded.start(lambda: 42)
    time.sleep(0.3)  # the child answered and exited meanwhile
    assert bounded.collect({"x": (pid, fd)}, time.monotonic() - 1.0)["x"] == {"ok": 42}
    pid, fd = bounded.start(lambda: time.sleep(30))
    started = time.monotonic()
    assert bounded.collect({"x": (pid, fd)}, started - 1.0)["x"] is None  # no wait for it
    assert time.monotonic() - started < 0.5


def test_the_hang_names_where_the_read_stopped(hung_ib):
    findings = engine.run(_config(hung_ib), hung_ib.root, save_state=False)
    hung = next(f for f in findings if f.code == "ib_hung")
    assert "a read of mlx5_3/1 counters hung" in hung.reason, hung.reason


def _unlistable_ports(node: Node, hca: str) -> None:
    """The HCA's ports/ directory cannot be listed (a regular file where sysfs has a
    directory: ENOTDIR; an EIO or EACCES from a broken sysfs reads the same)."""
    ports = node.root / "sys/class/infiniband" / hca / "ports"
    shutil.rmtree(ports)
    ports.write_text("")


def test_an_hca_whose_ports_cannot_be_listed_is_a_checker_error_not_a_missing_hca(node):
    """Before, an HCA whose ports/ could not be listed was skipped as if absent: with [infiniband]
    hcas configured, `mlx5_5 HCA not present`, a drain now that needs a repair (never resumed
    by itself), for what the checker could not read. Now it is a checker error; the other
    HCAs are judged as before."""
    _unlistable_ports(node, "mlx5_5")
    findings, verdict = node.check(only={"infiniband"}, save_state=False)
    assert not [f for f in findings if f.severity in DRAINS], [
        (f.component, f.code) for f in findings if f.severity in DRAINS]
    assert any(f.status is Status.ERROR and "mlx5_5" in f.reason for f in findings)
    assert {f.component for f in findings if f.family == "infiniband"
            and f.status is Status.OK} == {f"mlx5_{i}/1" for i in range(8) if i != 5}


def test_an_unlistable_hca_is_not_a_port_gone_from_this_boot(node):
    """Without hcas configured, the ports seen earlier in this boot stand in: a port whose HCA
    could not be listed is not one gone (ib_missing), as one whose HCA vanished is."""
    cfg = node.config
    cfg.data["infiniband"]["hcas"] = []
    engine.run(cfg, node.root)  # this boot has seen 8 ports
    _unlistable_ports(node, "mlx5_5")
    findings = engine.run(cfg, node.root, save_state=False, only={"infiniband"})
    assert "ib_missing" not in {f.code for f in findings}
    shutil.rmtree(node.root / "sys/class/infiniband/mlx5_6")  # this one is gone
    findings = engine.run(cfg, node.root, save_state=False, only={"infiniband"})
    missing = [f for f in findings if f.code == "ib_missing"]
    assert len(missing) == 1 and missing[0].data["gone"] == ["mlx5_6/1"]


def _snapshot_in_child(node: Node, timeout: float, cfg=None) -> dict | None:
    """`healthctl snapshot`'s document, taken in a forked child so a snapshot stuck in the
    kernel does not take the test with it (None: it did not finish within `timeout`)."""
    from rsc_health.collect import bounded
    from rsc_health.commands.node import take_snapshot

    cfg = cfg or node.config
    try:
        return bounded.call(lambda: take_snapshot(cfg, node.root, "node01"), timeout)
    except bounded.Abandoned:
        return None


def test_a_snapshot_of_a_node_whose_ib_read_hangs_finishes(hung_ib):
    """`healthctl snapshot` is what an operator runs on a sick node. Before, it read every IB
    counter in its own process: stuck in the kernel on the wedged one, for good (not even
    ^C ends it). Now the ports come from the same abandonable child as the checks'."""
    cfg = hung_ib.config
    cfg.data["infiniband"]["read_timeout_s"] = 1.0
    doc = _snapshot_in_child(hung_ib, 20, cfg)
    assert doc is not None, "the snapshot was still reading the hung IB counter after 20 s"
    files = doc["files"]
    assert "sys/class/infiniband/mlx5_0/ports/1/counters/symbol_error" in files
    assert HUNG_FILE not in {k.removeprefix("sys/class/infiniband/") for k in files}


def test_a_fifo_where_a_snapshot_reads_a_file_does_not_block_it(node):
    rate = node.root / "sys/class/infiniband/mlx5_1/ports/1/rate"
    rate.unlink()
    os.mkfifo(rate)
    doc = _snapshot_in_child(node, 20)
    assert doc is not None, "the snapshot blocked opening a FIFO"
    assert "sys/class/infiniband/mlx5_1/ports/1/rate" not in doc["files"]
    assert "sys/class/infiniband/mlx5_1/ports/1/state" in doc["files"]


def test_a_snapshot_of_a_node_whose_nvml_never_answers_finishes(node, monkeypatch):
    """Before, the snapshot asked live NVML in its own process: a wedged driver held it in the
    kernel for good. Now from an abandonable child at [gpu] nvml_timeout_s, as the checks do;
    what it answered before the hang is carried (a GPU lost before it still replays lost)."""
    import pynvml

    from tests.node.test_nvml_backend import FakeNvml

    FakeNvml(lost=1).install(monkeypatch)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetCount", lambda: 4)
    real = pynvml.nvmlDeviceGetHandleByIndex

    def wedged(i):
        if i == 3:
            time.sleep(3600)  # in the NVML child, abandoned at its deadline
        return real(i)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetHandleByIndex", wedged)
    cfg = node.config
    cfg.data["gpu"].update(backend="nvml", nvml_timeout_s=1.0)
    doc = _snapshot_in_child(node, 20, cfg)
    assert doc is not None, "the snapshot was still waiting on NVML after 20 s"
    devices = doc["nvml"]["devices"]
    assert len(devices) == 4 and devices[1]["uuid"] == {"error": "NVML_ERROR_GPU_IS_LOST"}
    assert devices[3].get("error") == "NVML_ERROR_TIMEOUT"


def _after_a_hang_of(node: Node, cfg, sweeps: int) -> None:
    """The node's state as a run finds it once the IB read answers again: a hang on record for
    `sweeps` sweeps in a row, its child gone (the firmware command finally failed)."""
    sdir = Path(state_dir(cfg, node.root))
    boot = (node.root / "proc/sys/kernel/random/boot_id").read_text().strip()
    hangs.save(sdir / engine.HANGS_FILE, {hangs.IB: {
        "since": "2026-11-27T01:00:00+00:00", "sweeps": sweeps, "pid": 2**22 + 7,
        "start": 1}}, boot)


def test_errors_counted_over_a_hang_are_judged_against_the_sweeps_it_spanned(node):
    """No port was read for the 5 sweeps the IB read hung: the counters' rise since their last
    read is 6 sweeps' worth. Before, it was judged against one sweep's limit: symbol errors at
    7 a sweep (limit 10) drained the node after its job, for repair, as a bad cable. Now the
    limit spans the sweeps the hang covered; a burst past that still drains."""
    cfg = node.config
    engine.run(cfg, node.root, sweep=True)  # the baselines
    _after_a_hang_of(node, cfg, sweeps=5)
    counter = node.root / "sys/class/infiniband/mlx5_2/ports/1/counters/symbol_error"
    counter.write_text(f"{int(counter.read_text()) + 42}\n")
    findings = engine.run(cfg, node.root, sweep=True, save_state=False)
    assert "ib_symbol_errors" not in {f.code for f in findings}
    counter.write_text(f"{int(counter.read_text()) + 30}\n")  # 72 in 6 sweeps: past 60
    findings = engine.run(cfg, node.root, sweep=True, save_state=False)
    drained = [f for f in findings if f.code == "ib_symbol_errors"]
    assert len(drained) == 1 and "6 sweeps" in drained[0].reason, drained


def test_no_ib_rate_is_taken_over_a_hang(node):
    """The telemetry rates divide a counter's rise by the interval since the last run; the IB
    counters were not read during the hang, so their rise spans it all. Before, the first
    sample after a 5-sweep hang showed six times the port's real rate (a false fail-slow
    signal); now no IB rate is taken on that run, and the next run's is the real one."""
    import json

    cfg = node.config
    engine.run(cfg, node.root, sweep=True)
    saved = node.root / "var/lib/rsc_health/counters.json"
    doc = json.loads(saved.read_text())
    doc["counters"]["tm/time_ms"] -= 300_000
    saved.write_text(json.dumps(doc))
    _after_a_hang_of(node, cfg, sweeps=5)
    wait = node.root / "sys/class/infiniband/mlx5_1/ports/1/counters/port_xmit_wait"
    wait.write_text(f"{int(wait.read_text()) + 6_000_000}\n")
    findings = engine.run(cfg, node.root, sweep=True, save_state=False)
    sample = next(f for f in findings if f.family == "telemetry" and f.component == "node")
    assert "ib_xmit_wait_rate" not in sample.data["metrics"]
    assert all("port_xmit_wait_rate" not in p for p in sample.data["ports"])
