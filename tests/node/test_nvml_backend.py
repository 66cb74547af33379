"""The live NVML backend, driven through pynvml's real function names with NVML answers
faked at the pynvml boundary (no GPU here): errors become data, never exceptions."""

from __future__ import annotations

from types import SimpleNamespace

import pynvml
import pytest

from rsc_health.collect.gpu import NvmlBackend, parse_answers


class FakeNvml:
    """Answers for a 2-GPU node; `fail` maps a pynvml function name to an NVML error code."""

    def __init__(self, fail: dict[str, int] | None = None, lost: int | None = None,
                 fabric: dict | None = None, processes: list | None = None):
        # Off NVSwitch systems (the H100 PCIe, the H200 of tests/fixtures/real) the fabric
        # calls answer NOT_SUPPORTED.
        self.fail = {"nvmlDeviceGetGpuFabricInfoV": pynvml.NVML_ERROR_NOT_SUPPORTED,
                     "nvmlDeviceGetGpuFabricInfo": pynvml.NVML_ERROR_NOT_SUPPORTED}
        if fabric is not None:
            self.fail = {}
        self.fail.update(fail or {})
        self.lost = lost
        self.fabric = fabric or {}
        self.processes = processes or []
        # Telemetry, as a loaded H100 SXM answers it: cumulative ns per violation policy
        # (nvmlPerfPolicyType_t) and per clock-event field id, both only ever growing.
        self.violation_ns = {0: 32_201_738_944, 1: 0, 2: 0, 3: 0, 5: 0}
        self.event_ns = {pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP: 32_201_738_944}
        # NVLink data KiB over all links (scopeId UINT_MAX), cumulative; per link (a link
        # index as scopeId) NVML answers that link's alone.
        self.nvlink_kib = {pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX: 7_340_032_000,
                           pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX: 7_340_031_000}
        self.unsupported_fields: set[int] = set()
        # Banks by remap availability left, as the real H200 (tests/fixtures/real) answers.
        self.histogram = {"max": 3072, "high": 0, "partial": 0, "low": 0, "none": 0}

    def install(self, monkeypatch):
        def fn(name, result):
            def call(*args):
                if name in self.fail:
                    raise pynvml.NVMLError(self.fail[name])
                if self.lost is not None and args and args[0] == f"h{self.lost}":
                    raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
                return result(*args) if callable(result) else result
            monkeypatch.setattr(pynvml, name, call)

        class Pci:
            busId = b"00000000:18:00.0"

        fn("nvmlInit", None)
        fn("nvmlShutdown", None)
        fn("nvmlSystemGetDriverVersion", "535.129.03")
        fn("nvmlDeviceGetCount", 2)
        fn("nvmlDeviceGetHandleByIndex", lambda i: f"h{i}")
        fn("nvmlDeviceGetUUID", lambda h: f"GPU-{h}")
        fn("nvmlDeviceGetPciInfo", Pci())
        fn("nvmlDeviceGetName", "NVIDIA H100 80GB HBM3")
        fn("nvmlDeviceGetEccMode", [1, 1])
        fn("nvmlDeviceGetTotalEccErrors", lambda h, e, c: 3 if e == 1 and c == 0 else 0)
        fn("nvmlDeviceGetRetiredPages", [])
        fn("nvmlDeviceGetRetiredPagesPendingStatus", 0)
        fn("nvmlDeviceGetRemappedRows", (0, 1, 1, 0))
        fn("nvmlDeviceGetVbiosVersion", "96.00.74.00.1C")
        fn("nvmlDeviceGetInforomImageVersion", "G520.0200.00.05")

        def link_state(h, link):
            if link >= 18:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            return 1

        fn("nvmlDeviceGetNvLinkState", link_state)
        fn("nvmlDeviceGetNvLinkErrorCounter", 0)
        fn("nvmlDeviceGetCurrPcieLinkGeneration", 5)
        fn("nvmlDeviceGetMaxPcieLinkGeneration", 5)
        fn("nvmlDeviceGetCurrPcieLinkWidth", 16)
        fn("nvmlDeviceGetMaxPcieLinkWidth", 16)
        fn("nvmlDeviceGetPcieReplayCounter", 0)
        fn("nvmlDeviceGetTemperature", 40)
        fn("nvmlDeviceGetCurrentClocksThrottleReasons", 1)
        fn("nvmlDeviceGetCurrentClocksEventReasons", 4)  # SW power cap, under load
        fn("nvmlDeviceGetClockInfo", lambda h, clock: {1: 1395, 2: 2619}[clock])
        fn("nvmlDeviceGetMaxClockInfo", lambda h, clock: {1: 1980, 2: 2619}[clock])
        fn("nvmlDeviceGetPowerUsage", 699_000)
        fn("nvmlDeviceGetEnforcedPowerLimit", 700_000)
        fn("nvmlDeviceGetUtilizationRates", pynvml.c_nvmlUtilization_t(gpu=100, memory=38))

        def violation(h, policy):
            if policy not in self.violation_ns:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
            return pynvml.c_nvmlViolationTime_t(referenceTime=1795699448612669,
                                                violationTime=self.violation_ns[policy])

        def field_values(h, ids):
            # NVML answers each field in its own slot: nvmlReturn per field, the call succeeds.
            values = (pynvml.c_nvmlFieldValue_t * len(ids))()
            for slot, wanted in zip(values, ids, strict=True):
                # pynvml takes a field id or a (field id, scope id) pair.
                fid, scope = wanted if isinstance(wanted, tuple) else (wanted, 0)
                slot.fieldId, slot.scopeId = fid, scope
                if fid in self.unsupported_fields:
                    slot.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
                    continue
                slot.valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
                if fid in self.nvlink_kib:
                    total = self.nvlink_kib[fid]
                    slot.value.ullVal = total if scope == 0xFFFFFFFF else total // 18
                else:
                    slot.value.ullVal = self.event_ns.get(fid, 0)
            return values

        fn("nvmlDeviceGetViolationStatus", violation)
        fn("nvmlDeviceGetFieldValues", field_values)
        fn("nvmlDeviceGetRowRemapperHistogram",
           lambda h: pynvml.c_nvmlRowRemapperHistogramValues(**self.histogram))

        def fabric_info(handle, ref):  # NVML fills the caller's struct through the pointer
            for key, value in self.fabric.items():
                setattr(ref._obj, key, value)
            return pynvml.NVML_SUCCESS

        fn("nvmlDeviceGetGpuFabricInfoV", fabric_info)
        fn("nvmlDeviceGetGpuFabricInfo", fabric_info)

        def processes(handle):
            # pynvml hands back friendly objects (nvmlStructToFriendlyObject), usedGpuMemory
            # None where NVML said NVML_VALUE_NOT_AVAILABLE.
            return [SimpleNamespace(pid=pid, usedGpuMemory=used, gpuInstanceId=0xFFFFFFFF,
                                    computeInstanceId=0xFFFFFFFF)
                    for pid, used in self.processes]

        fn("nvmlDeviceGetComputeRunningProcesses", processes)


def test_live_backend_reads_every_field_through_pynvml(monkeypatch):
    FakeNvml().install(monkeypatch)
    doc = NvmlBackend(max_links=36).read()
    dev = doc["devices"][0]
    assert dev["pci_bus_id"] == "00000000:18:00.0"
    assert dev["ecc"]["volatile"]["uncorrected"] == 3
    assert dev["remapped_rows"] == {"correctable": 0, "uncorrectable": 1, "pending": 1,
                                    "failure": 0}
    assert len(dev["nvlink"]) == 18  # stops at the first link NVML says does not exist
    assert dev["retired_pages"] == {"sbe": 0, "dbe": 0, "pending": 0}
    report = parse_answers(doc)
    assert report.error is None and [g.index for g in report.gpus] == [0, 1]


def test_fabric_state_and_compute_processes_are_read_as_nvml_answers_them(monkeypatch):
    FakeNvml(fabric={"state": pynvml.NVML_GPU_FABRIC_STATE_COMPLETED, "status": 0,
                     "cliqueId": 7, "healthMask": 0x2A},
             processes=[(4242, 20 * 2**30), (77, None)]).install(monkeypatch)
    dev = NvmlBackend().read()["devices"][0]
    assert dev["fabric"] == {"state": 3, "status": 0, "clique_id": 7,
                             "cluster_uuid": "00" * 16, "health_mask": 0x2A}
    assert dev["processes"] == [{"pid": 4242, "used_memory": 20 * 2**30},
                                {"pid": 77, "used_memory": None}]


def test_a_driver_without_the_versioned_fabric_call_falls_back_and_unsupported_is_absent(
        monkeypatch):
    FakeNvml(fabric={"state": pynvml.NVML_GPU_FABRIC_STATE_NOT_STARTED, "status": 0},
             fail={"nvmlDeviceGetGpuFabricInfoV": pynvml.NVML_ERROR_FUNCTION_NOT_FOUND}
             ).install(monkeypatch)
    dev = NvmlBackend().read()["devices"][0]
    assert dev["fabric"]["state"] == 1 and "health_mask" not in dev["fabric"]
    FakeNvml().install(monkeypatch)
    doc = NvmlBackend().read()
    assert doc["devices"][0]["fabric"] == {"error": "NVML_ERROR_NOT_SUPPORTED"}
    assert parse_answers(doc).gpus[0].field_errors == {}  # absent, not a checker error


@pytest.mark.parametrize(("code", "name"), [
    (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, "NVML_ERROR_LIBRARY_NOT_FOUND"),
    (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "NVML_ERROR_DRIVER_NOT_LOADED"),
])
def test_nvml_init_failure_is_data(monkeypatch, code, name):
    FakeNvml(fail={"nvmlInit": code}).install(monkeypatch)
    assert NvmlBackend().read() == {"error": name}


def test_lost_gpu_and_unsupported_fields_are_data(monkeypatch):
    FakeNvml(lost=1, fail={"nvmlDeviceGetRetiredPages": pynvml.NVML_ERROR_NOT_SUPPORTED,
                           "nvmlDeviceGetTemperature": pynvml.NVML_ERROR_NO_PERMISSION}
             ).install(monkeypatch)
    doc = NvmlBackend().read()
    assert doc["devices"][1]["uuid"] == {"error": "NVML_ERROR_GPU_IS_LOST"}
    assert doc["devices"][0]["retired_pages"]["sbe"] == {"error": "NVML_ERROR_NOT_SUPPORTED"}
    report = parse_answers(doc)
    # Not supported is absent; no permission is something the checker must say out loud.
    assert report.gpus[0].field_errors == {"temperature": "NVML_ERROR_NO_PERMISSION"}
    assert report.gpus[1].error == "NVML_ERROR_GPU_IS_LOST"


def test_no_permission_is_a_checker_error_not_a_drain(node):
    node.nvml(lambda d: d["devices"][0].update(temperature={"error": "NVML_ERROR_NO_PERMISSION"}))
    from rsc_health.model import Level

    findings, verdict = node.check()
    errors = [f for f in findings if f.status.value == "error"]
    assert [(f.family, f.component, f.code) for f in errors] == [
        ("checker", "gpu0", "gpu_unreadable")]
    assert verdict.level is Level.CHECKER_ERROR


@pytest.mark.parametrize("code", [pynvml.NVML_ERROR_TIMEOUT, pynvml.NVML_ERROR_UNKNOWN])
def test_a_link_whose_state_nvml_could_not_read_is_a_checker_error_not_a_down_link(
        monkeypatch, node, code):
    """nvmlDeviceGetNvLinkState timing out (or UNKNOWN) for one link says nothing about the
    link: the checker could not look. It was counted as not active, so the node drained now
    for 'nvlink_down' (a repair code, never auto-resumed)."""
    from rsc_health.model import Level

    fake = FakeNvml()
    fake.install(monkeypatch)
    real_state = pynvml.nvmlDeviceGetNvLinkState

    def flaky(handle, link):
        if link == 5:
            raise pynvml.NVMLError(code)
        return real_state(handle, link)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetNvLinkState", flaky)
    answer = NvmlBackend().read()["devices"][0]["nvlink"][5]["state"]
    node.nvml(lambda d: d["devices"][0]["nvlink"][5].update(state=answer))

    findings, verdict = node.check()
    assert not [f for f in findings if f.code == "nvlink_down"]
    assert verdict.level is Level.CHECKER_ERROR
    # A link that is really down next to the unreadable one still drains now.
    node.nvml(lambda d: d["devices"][0]["nvlink"][6].update(state=0))
    findings, verdict = node.check()
    assert [f.code for f in findings if f.code == "nvlink_down"] == ["nvlink_down"]
    assert verdict.level is Level.DRAIN_NOW


def test_a_gpu_lost_before_nvml_hangs_on_another_still_drains_within_the_budget(
        monkeypatch, node):
    """GPU 1 answers GPU_IS_LOST, then NVML blocks for ever on GPU 2 mid-sweep (a wedged
    driver). The whole read was abandoned at nvml_timeout_s and what had been answered went
    with it: a checker error, and the lost GPU let jobs start. What was answered before the
    hang is now judged: the lost GPU drains, the hang and the GPUs it hid are checker errors."""
    import time

    from rsc_health import engine
    from rsc_health.model import Level, Severity

    fake = FakeNvml(lost=1)
    fake.install(monkeypatch)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetCount", lambda: 4)
    real_pci = pynvml.nvmlDeviceGetPciInfo

    def wedged(handle):
        if handle == "h2":
            time.sleep(3600)  # in the forked child, abandoned at the deadline
        return real_pci(handle)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetPciInfo", wedged)
    cfg = node.config
    cfg.data["gpu"].update(backend="nvml", nvml_binding="pynvml", count=4, nvml_timeout_s=1.0)

    started = time.monotonic()
    findings = engine.run(cfg, node.root, only={"gpu"})
    assert time.monotonic() - started < 5

    drains = [(f.component, f.code) for f in findings if f.severity is Severity.DRAIN_NOW]
    assert drains == [("gpu1", "gpu_lost")]
    errors = {f.component for f in findings if f.status.value == "error"}
    assert {"gpu2", "gpu3"} <= errors  # not answered: the checker could not look
    assert any("no answer within" in f.reason for f in findings)
    from rsc_health.policy import decide

    assert decide(findings).level is Level.DRAIN_NOW

