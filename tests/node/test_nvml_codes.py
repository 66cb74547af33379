"""Every NVML return code has a meaning here, and only the ones that say the GPU or driver
cannot run a job drain. A code the table does not know (a newer driver), or an answer that is
no code at all, is a checker error naming it: never a drain, never a crash.

nvmlReturn_t as nvml.h (R570) numbers it; the pynvml installed here agrees (asserted below)."""

from __future__ import annotations

import json
import sys
import types

import pytest

from rsc_health.collect.gpu import NVML_ERRORS, UNUSABLE_ERRORS, NvmlBackend
from rsc_health.model import Level, Severity, Status

from .conftest import bad

HEADER = {
    "NVML_ERROR_UNINITIALIZED": 1, "NVML_ERROR_INVALID_ARGUMENT": 2,
    "NVML_ERROR_NOT_SUPPORTED": 3, "NVML_ERROR_NO_PERMISSION": 4,
    "NVML_ERROR_ALREADY_INITIALIZED": 5, "NVML_ERROR_NOT_FOUND": 6,
    "NVML_ERROR_INSUFFICIENT_SIZE": 7, "NVML_ERROR_INSUFFICIENT_POWER": 8,
    "NVML_ERROR_DRIVER_NOT_LOADED": 9, "NVML_ERROR_TIMEOUT": 10, "NVML_ERROR_IRQ_ISSUE": 11,
    "NVML_ERROR_LIBRARY_NOT_FOUND": 12, "NVML_ERROR_FUNCTION_NOT_FOUND": 13,
    "NVML_ERROR_CORRUPTED_INFOROM": 14, "NVML_ERROR_GPU_IS_LOST": 15,
    "NVML_ERROR_RESET_REQUIRED": 16, "NVML_ERROR_OPERATING_SYSTEM": 17,
    "NVML_ERROR_LIB_RM_VERSION_MISMATCH": 18, "NVML_ERROR_IN_USE": 19, "NVML_ERROR_MEMORY": 20,
    "NVML_ERROR_NO_DATA": 21, "NVML_ERROR_VGPU_ECC_NOT_SUPPORTED": 22,
    "NVML_ERROR_INSUFFICIENT_RESOURCES": 23, "NVML_ERROR_FREQ_NOT_SUPPORTED": 24,
    "NVML_ERROR_ARGUMENT_VERSION_MISMATCH": 25, "NVML_ERROR_DEPRECATED": 26,
    "NVML_ERROR_NOT_READY": 27, "NVML_ERROR_GPU_NOT_FOUND": 28,
    "NVML_ERROR_INVALID_STATE": 29, "NVML_ERROR_RESET_TYPE_NOT_SUPPORTED": 30,
    "NVML_ERROR_UNKNOWN": 999,
}
# What must drain: the GPU or the driver really cannot run a job.
DRAINS = {"NVML_ERROR_INSUFFICIENT_POWER", "NVML_ERROR_DRIVER_NOT_LOADED",
          "NVML_ERROR_IRQ_ISSUE", "NVML_ERROR_LIBRARY_NOT_FOUND", "NVML_ERROR_CORRUPTED_INFOROM",
          "NVML_ERROR_GPU_IS_LOST", "NVML_ERROR_RESET_REQUIRED",
          "NVML_ERROR_LIB_RM_VERSION_MISMATCH", "NVML_ERROR_GPU_NOT_FOUND"}
CHECKER = sorted(set(HEADER) - DRAINS)
# Error answers no table knows or that are no NVML name at all.
UNKNOWN_NAMES = ["NVML_ERROR_31", "NVML_ERROR_1000", "NVML_ERROR_SOMETHING_NEW"]
NOT_NAMES = [18, 15, 31, None, "", True, 1.5, [15], {"code": 15}]


def test_the_table_is_nvml_h_and_pynvml_agrees():
    import pynvml

    assert NVML_ERRORS == HEADER
    assert UNUSABLE_ERRORS == DRAINS
    for name, code in HEADER.items():
        if hasattr(pynvml, name):
            assert getattr(pynvml, name) == code, name


def _judge(node):
    findings, verdict = node.check(only={"gpu"})
    return bad(findings), verdict


def _checker_only(found, verdict, mentions: str):
    assert verdict.level is Level.CHECKER_ERROR, [(f.code, f.reason) for f in found]
    assert all(f.status is Status.ERROR and f.severity is Severity.NONE for f in found)
    assert any(mentions in f.reason for f in found), [f.reason for f in found]


@pytest.mark.parametrize("name", sorted(DRAINS - {"NVML_ERROR_GPU_IS_LOST"}))
def test_an_unusable_gpu_or_driver_at_init_drains_now(node, name):
    node.write("rsc_health/nvml.json", json.dumps({"error": name}))
    found, verdict = _judge(node)
    assert verdict.level is Level.DRAIN_NOW
    assert [(f.family, f.component, f.severity) for f in found] == [
        ("gpu", "nvml", Severity.DRAIN_NOW)]


def test_a_driver_upgraded_without_a_reboot_says_so():
    from types import SimpleNamespace

    from rsc_health.checks import gpu
    from rsc_health.collect.gpu import parse_answers

    for name, code in [("NVML_ERROR_LIB_RM_VERSION_MISMATCH", "driver_mismatch"),
                       ("NVML_ERROR_GPU_NOT_FOUND", "gpu_missing")]:
        state = SimpleNamespace(gpu=parse_answers({"error": name}))
        [f] = gpu.check(state, {"gpu": {"count": 8}})
        assert (f.code, f.severity, f.repair) == (code, Severity.DRAIN_NOW, True)


@pytest.mark.parametrize("name", ["NVML_ERROR_GPU_IS_LOST", "NVML_ERROR_RESET_REQUIRED",
                                  "NVML_ERROR_IRQ_ISSUE", "NVML_ERROR_INSUFFICIENT_POWER"])
def test_a_device_fault_answered_field_by_field_drains_that_gpu(node, name):
    """A handle was taken, then every field of gpu2 answers that the GPU must be reset (or is
    lost...): the GPU cannot run a job, whichever field said it."""
    def fault(doc):
        dev = doc["devices"][2]
        for key in ("temperature", "ecc_errors", "retired_pages"):
            if key in dev:
                dev[key] = {"error": name}
    node.nvml(fault)
    found, verdict = _judge(node)
    assert verdict.level is Level.DRAIN_NOW
    assert [(f.component, f.severity) for f in found] == [("gpu2", Severity.DRAIN_NOW)]
    assert name in found[0].reason


def test_a_corrupt_inforom_answered_by_one_field_is_that_fields_checker_error(node):
    node.nvml(lambda d: d["devices"][2].__setitem__(
        "retired_pages", {"error": "NVML_ERROR_CORRUPTED_INFOROM"}))
    found, verdict = _judge(node)
    _checker_only(found, verdict, "NVML_ERROR_CORRUPTED_INFOROM")
    assert [f.component for f in found] == ["gpu2"]


# nvmlDeviceGetEccMode answering an error that is not "absent": a corrupt InfoROM (where the ECC
# configuration lives), a one-off TIMEOUT. The counts NVML still gives are judged.
MODE_ERRORS = ["NVML_ERROR_CORRUPTED_INFOROM", "NVML_ERROR_TIMEOUT", "NVML_ERROR_UNKNOWN"]


@pytest.mark.parametrize("mode_error", MODE_ERRORS)
def test_uncorrectable_ecc_drains_when_the_ecc_mode_cannot_be_read(node, mode_error):
    node.nvml(lambda d: d["devices"][2].update(ecc_mode={"error": mode_error}))
    node.nvml(lambda d: d["devices"][2]["ecc"]["volatile"].update(uncorrected=4))
    found, verdict = node.check(only={"gpu", "ecc"})
    assert ("gpu2", "ecc_dbe") in [(f.component, f.code) for f in bad(found)]
    assert verdict.level is Level.DRAIN_NOW


@pytest.mark.parametrize("mode_error", MODE_ERRORS)
def test_an_unreadable_ecc_mode_with_clean_counts_is_a_checker_error_not_ecc_disabled(
        node, mode_error):
    node.nvml(lambda d: d["devices"][2].update(ecc_mode={"error": mode_error}))
    found, verdict = node.check(only={"gpu", "ecc"})
    _checker_only(bad(found), verdict, mode_error)
    assert [f.component for f in bad(found)] == ["gpu2"]


@pytest.mark.parametrize("name", CHECKER + UNKNOWN_NAMES)
def test_a_checker_side_answer_at_init_never_drains(node, name):
    node.write("rsc_health/nvml.json", json.dumps({"error": name}))
    found, verdict = _judge(node)
    _checker_only(found, verdict, name)
    if name in UNKNOWN_NAMES:
        assert "does not know" in found[0].reason


@pytest.mark.parametrize("name", CHECKER + UNKNOWN_NAMES)
def test_a_checker_side_answer_for_one_gpu_never_drains(node, name):
    node.nvml(lambda d: d["devices"].__setitem__(4, {"index": 4, "error": name}))
    found, verdict = _judge(node)
    _checker_only(found, verdict, name)
    assert [f.component for f in found] == ["gpu4"]


def _refuse_handle(node, index: int) -> None:
    node.nvml(lambda d: d["devices"].__setitem__(index, {"index": index,
                                                         "error": "NVML_ERROR_UNKNOWN"}))


def test_a_gpu_whose_handle_fails_run_after_run_with_rminitadapter_failed_drains(node):
    # The kernel logs the failed init; NVML counts the GPU and refuses its handle (UNKNOWN,
    # what NVML's docs say of a GPU in a bad state): found by tester h1 still CHECKER_ERROR
    # after four sweeps, every prolog passing.
    node.append("dev/kmsg",
                "3,9001,912345678,-;NVRM: GPU 0000:3b:00.0: RmInitAdapter failed! "
                "(0x62:0x55:2385)\n"
                "3,9002,912345690,-;NVRM: GPU 0000:3b:00.0: rm_init_adapter failed, device "
                "minor number 3\n")
    _refuse_handle(node, 3)
    for _ in range(4):  # four sweeps in a row: not a moment's contention
        found, verdict = node.check(sweep=True)
    assert verdict.level >= Level.DRAIN_AFTER_JOB, [(f.code, f.reason) for f in bad(found)]


def test_a_handle_refused_sweep_after_sweep_drains_after_the_job_without_a_kernel_line(node):
    # No kernel line to say why (another source, an overrun ring): the refusal alone, once it
    # persists, is the node's fault. Job starts between the sweeps neither count nor reset it.
    _refuse_handle(node, 3)
    levels = []
    for stage in ("sweep", "prolog", "sweep", "epilog", "sweep"):
        found, verdict = node.check(only={"gpu"}, sweep=stage == "sweep", stage=stage)
        levels.append(verdict.level)
    assert levels[:4] == [Level.CHECKER_ERROR] * 4
    drains = [f for f in bad(found) if f.severity >= Severity.DRAIN_AFTER_JOB]
    assert [(f.code, f.component, f.repair, f.data["sweeps"]) for f in drains] == [
        ("gpu_no_handle", "gpu3", True, 3)]
    assert verdict.level is Level.DRAIN_AFTER_JOB


def test_a_gpu_whose_handle_answers_again_starts_the_count_afresh(node):
    healthy = _healthy_doc(node)
    for _ in range(2):
        _refuse_handle(node, 3)
        node.check(only={"gpu"}, sweep=True)
        node.write("rsc_health/nvml.json", healthy)
        found, verdict = node.check(only={"gpu"}, sweep=True)  # gpu3 answers
        assert verdict.level is Level.OK
    _refuse_handle(node, 3)
    found, verdict = node.check(only={"gpu"}, sweep=True)
    assert verdict.level is Level.CHECKER_ERROR  # one sweep in a row, not three of four


@pytest.mark.parametrize("name", ["NVML_ERROR_NO_PERMISSION", "NVML_ERROR_TIMEOUT",
                                  "NVML_ERROR_SOMETHING_NEW"])
def test_a_handle_refused_for_the_checkers_own_reasons_never_drains_however_long(node, name):
    node.nvml(lambda d: d["devices"].__setitem__(3, {"index": 3, "error": name}))
    for _ in range(4):
        found, verdict = node.check(only={"gpu"}, sweep=True)
    _checker_only(bad(found), verdict, name)


UNKNOWN = {"error": "NVML_ERROR_UNKNOWN"}


def _every_health_call_unknown(doc, i: int, *, absent: tuple[str, ...] = ()) -> None:
    """GPU i: its handle taken, and every health call after it answering UNKNOWN (what
    nvidia-smi shows as ERR! / Unknown Error in every field); `absent`: answers NOT_SUPPORTED
    instead (what the library answers for a call the GPU lacks, e.g. an H100's retired pages,
    before the GPU is asked)."""
    d = doc["devices"][i]
    for k in list(d):
        if k in ("index", "uuid", "pci_bus_id", "name"):
            continue
        if k in absent:
            d[k] = {"error": "NVML_ERROR_NOT_SUPPORTED"}
        elif k == "nvlink":
            d[k] = [{"link": n, "state": dict(UNKNOWN), "replay": dict(UNKNOWN),
                     "recovery": dict(UNKNOWN), "crc_flit": dict(UNKNOWN),
                     "crc_data": dict(UNKNOWN)} for n in range(18)]
        elif k == "ecc":
            d[k] = {kind: {e: dict(UNKNOWN) for e in ("corrected", "uncorrected")}
                    for kind in ("volatile", "aggregate")}
        elif k == "pcie":
            d[k] = {kk: dict(UNKNOWN) for kk in d[k]}
        else:
            d[k] = dict(UNKNOWN)


@pytest.mark.parametrize("absent", [(), ("retired_pages", "fabric")], ids=["all", "some-absent"])
def test_gpu_answering_unknown_to_every_health_call_sweep_after_sweep_eventually_drains(
        node, absent):
    """gpu3's handle is given, then every call (ECC, remap, all 18 NVLink states, PCIe,
    temperature, fabric...) answers NVML_ERROR_UNKNOWN, sweep after sweep. The same answer to
    the *handle* drains after [gpu] handle_error_sweeps = 3 sweeps (gpu_no_handle); per field
    it was a checker error for ever and the GPU kept taking jobs. Job starts between the
    sweeps neither count nor reset it."""
    node.nvml(lambda doc: _every_health_call_unknown(doc, 3, absent=absent))
    levels = []
    for stage in ("sweep", "prolog", "sweep", "epilog", "sweep"):
        findings, verdict = node.check(sweep=stage == "sweep", stage=stage)
        levels.append(verdict.level)
    assert levels[:4] == [Level.CHECKER_ERROR] * 4
    drains = [f for f in bad(findings) if f.severity >= Severity.DRAIN_AFTER_JOB]
    assert [(f.code, f.component, f.repair, f.data["sweeps"]) for f in drains] == [
        ("gpu_no_answer", "gpu3", True, 3)], sorted({f.code for f in bad(findings)})
    assert verdict.level is Level.DRAIN_AFTER_JOB


def test_a_gpu_that_answers_one_health_call_again_starts_the_count_afresh(node):
    healthy = _healthy_doc(node)
    for _ in range(2):
        node.nvml(lambda doc: _every_health_call_unknown(doc, 3))
        node.check(sweep=True)
        node.check(sweep=True)
        node.write("rsc_health/nvml.json", healthy)
        node.nvml(lambda doc: (_every_health_call_unknown(doc, 3),
                               doc["devices"][3].update(temperature=41)))
        found, verdict = node.check(sweep=True)  # a value: not a GPU that answers nothing
        assert verdict.level is Level.CHECKER_ERROR, [(f.code, f.reason) for f in bad(found)]
        node.write("rsc_health/nvml.json", healthy)
    node.nvml(lambda doc: _every_health_call_unknown(doc, 3))
    found, verdict = node.check(sweep=True)
    assert verdict.level is Level.CHECKER_ERROR  # one sweep in a row, not four of six


@pytest.mark.parametrize("field", ["temperature", "remapped_rows", "ecc_mode", "pcie"])
def test_one_health_calls_unknown_stays_that_fields_checker_error_however_long(node, field):
    node.nvml(lambda doc: doc["devices"][3].update({field: dict(UNKNOWN)}))
    for _ in range(5):
        found, verdict = node.check(sweep=True)
    _checker_only(bad(found), verdict, "NVML_ERROR_UNKNOWN")


def test_every_health_call_refused_for_the_checkers_own_reasons_never_drains(node):
    """NO_PERMISSION everywhere (the checker's privileges) is not a GPU that answers nothing."""
    def edit(doc):
        _every_health_call_unknown(doc, 3)
        doc["devices"][3]["temperature"] = {"error": "NVML_ERROR_NO_PERMISSION"}
    node.nvml(edit)
    for _ in range(5):
        found, verdict = node.check(sweep=True)
    assert verdict.level is Level.CHECKER_ERROR, [(f.code, f.reason) for f in bad(found)]


@pytest.mark.parametrize("value", NOT_NAMES, ids=repr)
def test_a_replayed_error_that_is_not_a_name_never_drains_nor_crashes(node, value):
    node.write("rsc_health/nvml.json", json.dumps({"error": value}))
    _checker_only(*_judge(node), "NVML_ERROR_NOT_A_CODE")
    node.write("rsc_health/nvml.json", _healthy_doc(node))
    node.nvml(lambda d: d["devices"].__setitem__(2, {"index": 2, "error": value}))
    _checker_only(*_judge(node), "NVML_ERROR_NOT_A_CODE")
    # The same garbage where one field's answer belongs is no fault either.
    node.write("rsc_health/nvml.json", _healthy_doc(node))
    node.nvml(lambda d: d["devices"][2].update(
        retired_pages={"sbe": 0, "dbe": 0, "pending": {"error": value}}))
    found, verdict = node.check()
    assert verdict.level is Level.CHECKER_ERROR, [(f.code, f.reason) for f in bad(found)]


_HEALTHY: dict[str, str] = {}


def _healthy_doc(node) -> str:
    """The fixture's NVML answers as first copied (tests edit the file in place)."""
    from tests.node.conftest import FIXTURES

    if "doc" not in _HEALTHY:
        _HEALTHY["doc"] = (FIXTURES / "healthy" / "rsc_health" / "nvml.json").read_text()
    return _HEALTHY["doc"]


# ---- the live backend, with a pynvml that raises what a newer or broken binding might -------
class FakeError(Exception):
    def __init__(self, value):
        super().__init__(value)
        self.value = value


def fake_pynvml(fail: dict[str, object]) -> types.ModuleType:
    """A pynvml module for a 2-GPU node; `fail` maps a function name to the .value its
    NVMLError carries (any object: pynvml passes through whatever the C call returned)."""
    mod = types.ModuleType("pynvml")
    mod.NVMLError = FakeError

    class Pci:
        busId = b"00000000:18:00.0"

    answers = {
        "nvmlInit": None, "nvmlShutdown": None, "nvmlSystemGetDriverVersion": "570.86",
        "nvmlDeviceGetCount": 2, "nvmlDeviceGetHandleByIndex": lambda i: f"h{i}",
        "nvmlDeviceGetUUID": lambda h: f"GPU-{h}", "nvmlDeviceGetPciInfo": Pci(),
        "nvmlDeviceGetName": "NVIDIA H100", "nvmlDeviceGetEccMode": [1, 1],
        "nvmlDeviceGetTotalEccErrors": 0, "nvmlDeviceGetRetiredPages": [],
        "nvmlDeviceGetRetiredPagesPendingStatus": 0,
        "nvmlDeviceGetRemappedRows": (0, 0, 0, 0),
        "nvmlDeviceGetNvLinkState": lambda h, link: 1 if link < 2 else _raise(3),
        "nvmlDeviceGetNvLinkErrorCounter": 0, "nvmlDeviceGetCurrPcieLinkGeneration": 5,
        "nvmlDeviceGetMaxPcieLinkGeneration": 5, "nvmlDeviceGetCurrPcieLinkWidth": 16,
        "nvmlDeviceGetMaxPcieLinkWidth": 16, "nvmlDeviceGetPcieReplayCounter": 0,
        "nvmlDeviceGetTemperature": 40, "nvmlDeviceGetCurrentClocksThrottleReasons": 0,
    }

    def make(name, result):
        def call(*args):
            if name in fail:
                raise FakeError(fail[name])
            return result(*args) if callable(result) else result
        return call

    for name, result in answers.items():
        setattr(mod, name, make(name, result))
    return mod


def _raise(code):
    raise FakeError(code)


LIVE_VALUES = [31, 1000, -1, "NVML_ERROR_GPU_IS_LOST", None, b"\x0f", 15.0, [15], {"x": 1},
               object()]


@pytest.mark.parametrize("where", ["nvmlInit", "nvmlDeviceGetCount",
                                   "nvmlDeviceGetHandleByIndex", "nvmlDeviceGetUUID",
                                   "nvmlDeviceGetRetiredPagesPendingStatus",
                                   "nvmlDeviceGetRemappedRows", "nvmlDeviceGetTemperature"])
@pytest.mark.parametrize("value", LIVE_VALUES, ids=lambda v: type(v).__name__ + repr(v)[:12])
def test_live_nvml_raising_a_code_no_table_knows_never_drains_nor_crashes(
        monkeypatch, node, where, value):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml({where: value}))
    doc = NvmlBackend(max_links=4).read()
    json.dumps(doc)  # what `healthctl snapshot` would write: must serialise
    node.write("config.toml", node.path("config.toml").read_text().replace(
        "count = 8", "count = 2").replace("nvlinks_per_gpu = 18", "nvlinks_per_gpu = 2"))
    node.write("rsc_health/nvml.json", json.dumps(doc))
    findings, verdict = node.check(only={"gpu", "ecc", "remap", "nvlink", "pcie"})
    found = bad(findings)
    assert verdict.level is Level.CHECKER_ERROR, [(f.code, f.reason) for f in found]
    assert not [f for f in found if f.severity > Severity.WARN]


@pytest.mark.parametrize(("value", "drains"), [(15, True), (18, True), (16, True),
                                               (26, False), (21, False), (25, False)])
def test_live_nvml_codes_are_judged_by_the_table(monkeypatch, node, value, drains):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml({"nvmlDeviceGetHandleByIndex": value}))
    doc = NvmlBackend(max_links=4).read()
    node.write("config.toml", node.path("config.toml").read_text().replace("count = 8",
                                                                           "count = 2"))
    node.write("rsc_health/nvml.json", json.dumps(doc))
    _, verdict = node.check(only={"gpu"})
    assert verdict.level is (Level.DRAIN_NOW if drains else Level.CHECKER_ERROR)
