"""The heartbeat carries the driver and each GPU's VBIOS and InfoROM versions, as NVML says
them (qualification's driver/firmware-change trigger): read live through pynvml, judged on the
healthy fixture node, and never a checker error when NVML will not say."""

from __future__ import annotations

import pynvml

from rsc_health.collect.gpu import NvmlBackend, parse_answers, versions
from rsc_health.model import Level
from rsc_health.node.sinks import _versions
from tests.node.test_nvml_backend import FakeNvml


def test_the_live_read_asks_nvml_for_each_boards_vbios_and_inforom(monkeypatch):
    FakeNvml().install(monkeypatch)
    report = parse_answers(NvmlBackend().read())
    assert [versions(report, g) for g in report.gpus] == [
        {"driver": "535.129.03", "vbios": "96.00.74.00.1C", "inforom": "G520.0200.00.05"}] * 2
    assert all(not g.field_errors for g in report.gpus)


def test_a_binding_or_driver_that_will_not_say_its_firmware_is_no_checker_error(monkeypatch):
    fake = FakeNvml(fail={"nvmlDeviceGetVbiosVersion": pynvml.NVML_ERROR_NO_PERMISSION})
    fake.install(monkeypatch)
    monkeypatch.delattr(pynvml, "nvmlDeviceGetInforomImageVersion")
    report = parse_answers(NvmlBackend().read())
    assert [versions(report, g) for g in report.gpus] == [{"driver": "535.129.03"}] * 2
    assert all(not g.field_errors for g in report.gpus)


def _firmware(vbios):
    def edit(doc):
        for i, dev in enumerate(doc["devices"]):
            dev["firmware"] = {"vbios": vbios[i % len(vbios)],
                               "inforom": {"error": "NVML_ERROR_NOT_SUPPORTED"}}
    return edit


def test_the_sweeps_findings_give_the_heartbeat_the_driver_and_each_gpus_vbios(node):
    node.nvml(_firmware(["96.00.AF.00.01", "96.00.AF.00.02"]))
    findings, verdict = node.check()
    assert verdict.level is Level.OK
    beat = _versions(findings)
    assert isinstance(beat["driver"], str) and beat["driver"]
    assert beat["vbios"] == ["96.00.AF.00.01", "96.00.AF.00.02"]  # the distinct values
    assert "inforom" not in beat


def test_hostile_version_strings_are_cut_and_a_garbled_answer_is_left_out(node):
    node.nvml(_firmware(["x" * 5000, 12345]))
    findings, verdict = node.check()
    assert verdict.level is Level.OK
    beat = _versions(findings)
    assert beat["vbios"] == ["x" * 64]  # the boards that said a string, cut

