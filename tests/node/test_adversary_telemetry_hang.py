"""A warn-only telemetry call that hangs must not blind the health checks: NVML's health answers
(ECC, lost GPUs, remapped rows, links) for every GPU are read before any GPU's telemetry, so a
driver that blocks for ever in a telemetry field (nvmlDeviceGetFieldValues for NVLink
throughput over every link, the row-remapper histogram) still leaves every GPU's health judged.
Faked at the pynvml boundary as tests/node/test_nvml_backend.py does."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pynvml

from rsc_health import engine
from rsc_health.collect.gpu import TELEMETRY_KEY, NvmlBackend
from rsc_health.model import Level, Severity
from rsc_health.policy import decide
from tests.node.conftest import Node
from tests.node.test_nvml_backend import FakeNvml


def _wedge_field_values_on(monkeypatch, handle: str) -> None:
    real = pynvml.nvmlDeviceGetFieldValues

    def wedged(h, ids):
        if h == handle:
            time.sleep(3600)  # in the forked child, abandoned at the deadline
        return real(h, ids)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetFieldValues", wedged)


def test_a_telemetry_field_that_hangs_on_gpu0_still_lets_a_lost_gpu3_drain(monkeypatch, node):
    """GPU 3 is lost (GPU_IS_LOST on every call); NVML then blocks for ever in GPU 0's telemetry
    field read. Before: GPU 0's health answers, read in the same pass as its telemetry, went
    with the hang and every GPU was unanswered: a checker error, and jobs started on a node
    with a lost GPU. Now every GPU's health is read first: the lost GPU drains, the hang is
    said, nothing about the hang itself drains."""
    fake = FakeNvml(lost=3)
    fake.install(monkeypatch)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetCount", lambda: 4)
    _wedge_field_values_on(monkeypatch, "h0")
    cfg = node.config
    cfg.data["gpu"].update(backend="nvml", nvml_binding="pynvml", count=4, nvml_timeout_s=1.0)

    started = time.monotonic()
    findings = engine.run(cfg, node.root, only={"gpu", "telemetry"}, save_state=False)
    assert time.monotonic() - started < 5
    hung = [f.reason for f in findings if f.code == "nvml_hung"]
    assert hung and "in the telemetry pass" in hung[0]
    drains = [(f.component, f.code) for f in findings if f.severity is Severity.DRAIN_NOW]
    assert drains == [("gpu3", "gpu_lost")]
    assert decide(findings).level is Level.DRAIN_NOW
    # GPUs 0-2 were answered: no "unanswered" checker error for them.
    errors = {f.component for f in findings if f.status.value == "error"}
    assert not {"gpu0", "gpu1", "gpu2"} & errors


def test_the_partial_read_has_every_gpus_health_and_marks_telemetry_not_reached(monkeypatch):
    """What the child streams before a telemetry hang: all devices with their health answers,
    the telemetry of GPUs not reached marked with NVML's own timeout (absent to the telemetry
    family, never a checker error of the GPU family)."""
    from rsc_health.collect.gpu import parse_answers

    FakeNvml().install(monkeypatch)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetCount", lambda: 3)

    class Hang(Exception):
        pass

    def wedged(h, ids):
        raise Hang  # stands for the call that never returns: the read stops here

    monkeypatch.setattr(pynvml, "nvmlDeviceGetFieldValues", wedged)
    seen: list = []
    try:
        # A copy at each report, as the streaming child's JSON line is.
        NvmlBackend(telemetry=True).read(
            progress=lambda doc: seen.append(json.loads(json.dumps(doc, default=str))))
    except Hang:
        pass
    last = seen[-1]
    assert len(last["devices"]) == 3
    assert all("ecc" in d and "remapped_rows" in d for d in last["devices"])
    assert all(d[TELEMETRY_KEY] == {"error": "NVML_ERROR_TIMEOUT"} for d in last["devices"])
    report = parse_answers(last)
    assert [g.error for g in report.gpus] == [None, None, None]
    assert all(not g.field_errors for g in report.gpus)


def test_without_telemetry_the_read_is_unchanged(monkeypatch):
    FakeNvml().install(monkeypatch)
    doc = NvmlBackend(telemetry=False).read()
    assert len(doc["devices"]) == 2
    assert all(TELEMETRY_KEY not in d for d in doc["devices"])
    both = NvmlBackend(telemetry=True).read()
    assert all(isinstance(d[TELEMETRY_KEY].get("nvlink_kib"), dict) for d in both["devices"])


def _kill_left_children(sdir) -> None:
    import os
    import signal

    from rsc_health.collect import hangs
    rec = hangs.load(sdir / engine.HANGS_FILE)["probes"].get(hangs.NVML) or {}
    if type(rec.get("pid")) is int:
        try:
            os.kill(rec["pid"], signal.SIGKILL)
        except ProcessLookupError:
            pass


def _in_the_kernel(root) -> None:
    """Block as a wedged driver does: in the kernel, where SIGKILL does not end the wait (a
    statfs on a FUSE mount whose daemon never answers)."""
    import os
    os.statvfs(str(root / "checkpoint"))


def test_a_gpu_lost_while_a_telemetry_child_is_still_stuck_drains_at_the_next_job_start(
        monkeypatch, hung_mount):
    """The sweep's telemetry read hangs on GPU 0 after every GPU's health answered; its child
    stays stuck in the driver. GPU 3 is then lost. Before: while that child waited, no run asked
    NVML at all (a checker error), so the next jobs started on the lost GPU until
    nvml_hang_sweeps sweeps drained the node after them. Now the health calls are asked again
    from a new child (telemetry is not): the lost GPU drains at the next job start, the stuck
    child is still said, and only the stuck child is on record (no child left per run)."""
    from rsc_health.collect import hangs
    from rsc_health.engine import state_dir

    fake = FakeNvml()
    fake.install(monkeypatch)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetCount", lambda: 4)
    real = pynvml.nvmlDeviceGetFieldValues
    monkeypatch.setattr(pynvml, "nvmlDeviceGetFieldValues", lambda h, ids: (
        _in_the_kernel(hung_mount) if h == "h0" else None) or real(h, ids))
    node = Node(hung_mount)
    cfg = node.config
    cfg.data["gpu"].update(backend="nvml", nvml_binding="pynvml", count=4, nvml_timeout_s=1.0)
    sdir = Path(state_dir(cfg, node.root))
    try:
        first = engine.run(cfg, node.root, only={"gpu", "telemetry"}, sweep=True)
        assert decide(first).level is not Level.DRAIN_NOW
        stuck = hangs.load(sdir / engine.HANGS_FILE)["probes"][hangs.NVML]
        assert stuck["after_health"] is True and hangs.still_waiting(stuck)

        FakeNvml(lost=3).install(monkeypatch)
        monkeypatch.setattr(pynvml, "nvmlDeviceGetCount", lambda: 4)
        second = engine.run(cfg, node.root, only={"gpu"})
        drains = [(f.component, f.code) for f in second if f.severity is Severity.DRAIN_NOW]
        assert drains == [("gpu3", "gpu_lost")]
        hung = [f.reason for f in second if f.code == "nvml_hung"]
        assert hung and "health asked again without telemetry" in hung[0]
        after = hangs.load(sdir / engine.HANGS_FILE)["probes"][hangs.NVML]
        assert after["pid"] == stuck["pid"] and after["after_health"] is True
    finally:
        _kill_left_children(sdir)


def test_a_child_stuck_in_the_health_calls_is_not_asked_again(monkeypatch, hung_mount):
    """A child that hung before every GPU's health answered is the driver's: nothing is asked
    while it waits (asking would leave one more process stuck per run), as before."""
    from rsc_health.collect import hangs
    from rsc_health.engine import state_dir

    FakeNvml().install(monkeypatch)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetCount", lambda: 4)
    real = pynvml.nvmlDeviceGetHandleByIndex

    def wedged(i):
        if i == 2:
            _in_the_kernel(hung_mount)
        return real(i)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetHandleByIndex", wedged)
    node = Node(hung_mount)
    cfg = node.config
    cfg.data["gpu"].update(backend="nvml", nvml_binding="pynvml", count=4, nvml_timeout_s=1.0)
    sdir = Path(state_dir(cfg, node.root))
    try:
        engine.run(cfg, node.root, only={"gpu"}, sweep=True)
        stuck = hangs.load(sdir / engine.HANGS_FILE)["probes"][hangs.NVML]
        assert "after_health" not in stuck and hangs.still_waiting(stuck)
        second = engine.run(cfg, node.root, only={"gpu"})
        hung = [f.reason for f in second if f.code == "nvml_hung"]
        assert hung and "not asked again" in hung[0]
        assert hangs.load(sdir / engine.HANGS_FILE)["probes"][hangs.NVML]["pid"] == stuck["pid"]
    finally:
        _kill_left_children(sdir)
