"""The NVLink fabric on NVSwitch systems: Fabric Manager asked through a bounded systemctl
only where NVSwitches are (found in sysfs, or said by config), and NVML's GPU fabric state
judged per GPU; a PCIe GPU without a fabric (the real H200 capture: nvidia-smi -q shows
Fabric State N/A) is nothing to judge."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from rsc_health.checks import _program
from rsc_health.model import Level, Severity, Status

REAL_SMI = (Path(__file__).resolve().parents[1] / "fixtures" / "real" / "h200-vm-2026-11-26"
            / "nvidia-smi-q.txt")


def _systemctl(node, body: str, mode: int = 0o755) -> None:
    node.write("usr/bin/systemctl", "#!/bin/sh\n" + body + "\n")
    node.path("usr/bin/systemctl").chmod(mode)


def _nvswitch(node, addr="0000:c2:00.0") -> None:
    # An HGX H100 NVSwitch as sysfs shows it: NVIDIA, class 0x068000 (bridge, other).
    dev = f"sys/bus/pci/devices/{addr}"
    node.write(f"{dev}/vendor", "0x10de\n")
    node.write(f"{dev}/class", "0x068000\n")
    node.write(f"{dev}/device", "0x22a3\n")


def _fabric(node, **answer) -> None:
    doc = {"state": 3, "status": 0, "clique_id": 1, "cluster_uuid": "00" * 16,
           "health_mask": 0, **answer}
    node.nvml(lambda d: [g.update(fabric=dict(doc)) for g in d["devices"]])


def _judge(node, **fabric_cfg):
    from rsc_health.engine import run
    from rsc_health.policy import decide

    cfg = node.config
    cfg.data["fabric"].update(fabric_cfg)
    findings = run(cfg, node.root, only={"fabric"})
    return [f for f in findings if f.status is not Status.OK], decide(findings)


def test_the_real_pcie_h200_has_no_fabric_and_nothing_is_asked(node, monkeypatch):
    assert "Fabric\n        State                                          : N/A" in \
        REAL_SMI.read_text()
    node.nvml(lambda d: [g.update(fabric={"error": "NVML_ERROR_NOT_SUPPORTED"})
                         for g in d["devices"]])
    monkeypatch.setattr(_program, "run", lambda *a, **k: pytest.fail("ran systemctl"))
    bad, verdict = _judge(node)
    assert bad == [] and verdict.level is Level.OK


def test_an_nvswitch_found_in_sysfs_makes_fabric_manager_required(node):
    _nvswitch(node)
    _fabric(node)
    _systemctl(node, 'echo failed\nexit 3')
    bad, verdict = _judge(node)
    assert [(f.component, f.code, f.severity) for f in bad] == [
        ("nvidia-fabricmanager", "fabric_manager_down", Severity.DRAIN_AFTER_JOB)]
    assert not bad[0].repair  # a restarted FM is seen by the next sweep
    _systemctl(node, "echo active")
    bad, verdict = _judge(node)
    assert bad == [] and verdict.level is Level.OK
    _systemctl(node, "echo activating\nexit 3")
    assert [f.code for f in _judge(node)[0]] == ["fabric_manager_starting"]


@pytest.mark.parametrize(("answer", "code", "level"), [
    ({"state": 1}, "fabric_not_started", Level.DRAIN_AFTER_JOB),
    ({"state": 2}, "fabric_in_progress", Level.WARN),
    ({"status": 15}, "fabric_failed", Level.DRAIN_AFTER_JOB),
    ({"health_mask": 1 << 4}, "fabric_unhealthy", Level.DRAIN_AFTER_JOB),
    ({"health_mask": 1}, "fabric_degraded", Level.WARN),
    ({"health_mask": 2 | 2 << 2 | 2 << 4 | 2 << 6}, None, Level.OK),  # every field "false"
])
def test_each_gpu_fabric_state_is_judged(node, answer, code, level):
    _fabric(node, **answer)
    bad, verdict = _judge(node, nvswitch="no")
    assert {f.code for f in bad} == ({code} if code else set())
    assert verdict.level is level
    if code == "fabric_failed":
        assert "NVML_ERROR_GPU_IS_LOST" in bad[0].reason


def test_garbage_fabric_answers_are_checker_errors_never_drains(node):
    node.nvml(lambda d: (d["devices"][0].update(fabric={"state": "3"}),
                         d["devices"][1].update(fabric={"state": 3, "status": None}),
                         d["devices"][2].update(fabric=[1, 2]),
                         d["devices"][3].update(fabric={"state": 3, "status": 0,
                                                        "health_mask": -5})))
    bad, verdict = _judge(node, nvswitch="no")
    assert {(f.family, f.component) for f in bad} == {("checker", "gpu0"), ("checker", "gpu1"),
                                                      ("checker", "gpu2")}
    assert verdict.level is Level.CHECKER_ERROR


def test_a_hung_systemctl_is_killed_at_its_timeout_and_is_the_checkers(node):
    _systemctl(node, "sleep 30")
    started = time.monotonic()
    bad, verdict = _judge(node, nvswitch="yes", timeout_s=0.5)
    assert time.monotonic() - started < 5
    assert [(f.family, f.code) for f in bad] == [("checker", "fabric_unreadable")]
    assert "did not answer in time" in bad[0].reason


def test_a_systemctl_others_could_write_is_never_run(node, tmp_path):
    marker = tmp_path / "ran"
    _systemctl(node, f"touch {marker}\necho active", mode=0o777)
    bad, _ = _judge(node, nvswitch="yes")
    assert not marker.exists()
    assert [f.code for f in bad] == ["fabric_unreadable"] and "refused" in bad[0].reason


def test_hostile_systemctl_output_is_made_printable_and_a_flood_is_not_judged(node):
    _systemctl(node, r"printf '\033[31mfailed\033[0m%s\n' $(head -c 500 /dev/zero | tr '\0' x)"
               "\nexit 3")
    bad, _ = _judge(node, nvswitch="yes")
    assert [f.code for f in bad] == ["fabric_manager_down"]
    assert "\x1b" not in bad[0].reason and len(bad[0].data["answer"]) <= 32
    _systemctl(node, "head -c 100000 /dev/zero\nexit 3")  # more than 4 kB: not an answer
    bad, _ = _judge(node, nvswitch="yes")
    assert [(f.family, f.code) for f in bad] == [("checker", "fabric_unreadable")]
