"""GPU state from NVML, or from a JSON file of captured NVML answers (replay).

Both backends produce the same document, "NVML answers": a dict that mirrors the NVML calls
made. Any answer may be `{"error": "NVML_ERROR_..."}` with NVML's own error name, so a failing
library, a lost GPU or an unsupported field is data that the checks judge, never an exception.
`parse_answers` turns the document into `GpuState`s.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# NVML's return codes (nvml.h nvmlReturn_t), so replay files need no pynvml to be read.
NVML_ERRORS = {
    "NVML_ERROR_UNINITIALIZED": 1,
    "NVML_ERROR_INVALID_ARGUMENT": 2,
    "NVML_ERROR_NOT_SUPPORTED": 3,
    "NVML_ERROR_NO_PERMISSION": 4,
    "NVML_ERROR_NOT_FOUND": 6,
    "NVML_ERROR_INSUFFICIENT_POWER": 8,
    "NVML_ERROR_DRIVER_NOT_LOADED": 9,
    "NVML_ERROR_TIMEOUT": 10,
    "NVML_ERROR_IRQ_ISSUE": 11,
    "NVML_ERROR_LIBRARY_NOT_FOUND": 12,
    "NVML_ERROR_FUNCTION_NOT_FOUND": 13,
    "NVML_ERROR_CORRUPTED_INFOROM": 14,
    "NVML_ERROR_GPU_IS_LOST": 15,
    "NVML_ERROR_RESET_REQUIRED": 16,
    "NVML_ERROR_UNKNOWN": 999,
}
NVML_ERROR_NAMES = {code: name for name, code in NVML_ERRORS.items()}
NOT_SUPPORTED = "NVML_ERROR_NOT_SUPPORTED"
LOST = "NVML_ERROR_GPU_IS_LOST"
# Asking for a link index the GPU does not have answers INVALID_ARGUMENT / NOT_SUPPORTED.
ABSENT = {NOT_SUPPORTED, "NVML_ERROR_INVALID_ARGUMENT", "NVML_ERROR_FUNCTION_NOT_FOUND"}

NVLINK_COUNTERS = ("replay", "recovery", "crc_flit", "crc_data")  # NVML_NVLINK_ERROR_DL_* 0..3


def error_name(exc: BaseException) -> str:
    value = getattr(exc, "value", None)
    return NVML_ERROR_NAMES.get(value, f"NVML_ERROR_{value}" if value is not None else "")


class NvmlBackend:
    """Live NVML through pynvml (imported here, not at module import: CPU nodes lack it)."""

    def __init__(self, max_links: int = 18):
        self.max_links = max_links

    def read(self) -> dict[str, Any]:
        # pynvml missing from the checker's own Python is an install problem (ImportError: a
        # checker finding), not the node's: the NVIDIA library itself missing is
        # NVML_ERROR_LIBRARY_NOT_FOUND from nvmlInit below.
        import pynvml

        def call(fn, *args):
            try:
                value = fn(*args)
            except pynvml.NVMLError as exc:
                return {"error": error_name(exc)}
            return value.decode() if isinstance(value, bytes) else value

        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            return {"error": error_name(exc)}
        try:
            doc: dict[str, Any] = {"driver_version": call(pynvml.nvmlSystemGetDriverVersion)}
            count = call(pynvml.nvmlDeviceGetCount)
            if isinstance(count, dict):
                doc["device_count"] = count
                return doc
            doc["device_count"] = count
            doc["devices"] = [self._device(pynvml, call, i) for i in range(count)]
            return doc
        finally:
            try:
                pynvml.nvmlShutdown()
            except pynvml.NVMLError:
                pass

    def _device(self, nv, call, index: int) -> dict[str, Any]:
        handle = call(nv.nvmlDeviceGetHandleByIndex, index)
        if isinstance(handle, dict):
            return {"index": index, **handle}
        pci = call(nv.nvmlDeviceGetPciInfo, handle)
        d: dict[str, Any] = {
            "index": index,
            "uuid": call(nv.nvmlDeviceGetUUID, handle),
            "pci_bus_id": pci if isinstance(pci, dict) else _text(pci.busId),
            "name": call(nv.nvmlDeviceGetName, handle),
        }
        mode = call(nv.nvmlDeviceGetEccMode, handle)
        d["ecc_mode"] = mode if isinstance(mode, dict) else {"current": mode[0], "pending": mode[1]}
        d["ecc"] = {
            kind: {
                err: call(nv.nvmlDeviceGetTotalEccErrors, handle, etype, ctype)
                for err, etype in (("corrected", 0), ("uncorrected", 1))
            }
            for kind, ctype in (("volatile", 0), ("aggregate", 1))
        }
        sbe = call(nv.nvmlDeviceGetRetiredPages, handle, 0)
        dbe = call(nv.nvmlDeviceGetRetiredPages, handle, 1)
        d["retired_pages"] = {
            "sbe": sbe if isinstance(sbe, dict) else len(sbe),
            "dbe": dbe if isinstance(dbe, dict) else len(dbe),
            "pending": call(nv.nvmlDeviceGetRetiredPagesPendingStatus, handle),
        }
        rows = call(nv.nvmlDeviceGetRemappedRows, handle)
        names = ("correctable", "uncorrectable", "pending", "failure")
        d["remapped_rows"] = rows if isinstance(rows, dict) else dict(zip(names, rows, strict=True))
        links = []
        for link in range(self.max_links):
            state = call(nv.nvmlDeviceGetNvLinkState, handle, link)
            if isinstance(state, dict) and state["error"] in ABSENT:
                break
            entry = {"link": link, "state": state}
            for counter, ctype in zip(NVLINK_COUNTERS, range(4), strict=True):
                entry[counter] = call(nv.nvmlDeviceGetNvLinkErrorCounter, handle, link, ctype)
            links.append(entry)
        d["nvlink"] = links
        d["pcie"] = {
            "gen": call(nv.nvmlDeviceGetCurrPcieLinkGeneration, handle),
            "max_gen": call(nv.nvmlDeviceGetMaxPcieLinkGeneration, handle),
            "width": call(nv.nvmlDeviceGetCurrPcieLinkWidth, handle),
            "max_width": call(nv.nvmlDeviceGetMaxPcieLinkWidth, handle),
            "replay": call(nv.nvmlDeviceGetPcieReplayCounter, handle),
        }
        d["temperature"] = call(nv.nvmlDeviceGetTemperature, handle, 0)
        d["throttle_reasons"] = call(nv.nvmlDeviceGetCurrentClocksThrottleReasons, handle)
        return d


class ReplayBackend:
    """Captured NVML answers from a JSON file (tests, `healthctl check --from`, bug reports)."""

    def __init__(self, path: Path):
        self.path = path

    def read(self) -> dict[str, Any]:
        """The captured answers; an unreadable or garbled file raises (a checker finding)."""
        from rsc_health.collect.sysfs import read_bounded

        doc = json.loads(read_bounded(self.path))
        if not isinstance(doc, dict):
            raise ValueError(f"{self.path}: not a JSON object of NVML answers")
        return doc


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def err(value: Any) -> str | None:
    """NVML's error name when an answer is an error, else None."""
    if isinstance(value, dict) and "error" in value:
        return str(value["error"])
    return None


def val(value: Any) -> Any:
    """The answer, or None when NVML answered with an error (not supported = absent)."""
    return None if err(value) else value


@dataclass
class GpuState:
    index: int
    uuid: str | None = None
    pci_bus_id: str | None = None
    name: str | None = None
    error: str | None = None  # the device itself is unreachable (e.g. NVML_ERROR_GPU_IS_LOST)
    answers: dict = field(default_factory=dict)  # the raw NVML answers for this device
    field_errors: dict = field(default_factory=dict)  # field -> NVML error other than absent


# NVML answers that say the checker could not look (its permissions, its own timeout, a
# library older than the call): checker findings, never a drain.
CHECKER_ERRORS = {"NVML_ERROR_NO_PERMISSION", "NVML_ERROR_TIMEOUT", "NVML_ERROR_UNINITIALIZED",
                  "NVML_ERROR_FUNCTION_NOT_FOUND", "NVML_ERROR_INVALID_ARGUMENT",
                  "NVML_ERROR_UNKNOWN"}


@dataclass
class GpuReport:
    error: str | None  # NVML itself failed (library not found, driver not loaded)
    driver_version: str | None
    gpus: list[GpuState]
    # The answers could not be understood (wrong types): what the checker could not read.
    malformed: str | None = None


def parse_answers(doc: dict[str, Any]) -> GpuReport:
    top = err(doc)
    if top:
        return GpuReport(top, None, [])
    count_err = err(doc.get("device_count"))
    if count_err:
        return GpuReport(count_err, None, [])
    count, devices = doc.get("device_count"), doc.get("devices")
    if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= 1024:
        return GpuReport(None, None, [], malformed=f"device_count {str(count)[:40]!r}")
    if not isinstance(devices, list) or len(devices) != count:
        return GpuReport(None, None, [], malformed=f"{count} devices counted, "
                         f"{len(devices) if isinstance(devices, list) else 'no'} listed")
    gpus = []
    for i, dev in enumerate(devices):
        if not isinstance(dev, dict):
            return GpuReport(None, None, [], malformed=f"device {i} is not an object")
        state = GpuState(index=int(dev.get("index", i)), error=err(dev), answers=dev)
        state.uuid = val(dev.get("uuid"))
        state.pci_bus_id = val(dev.get("pci_bus_id"))
        state.name = val(dev.get("name"))
        state.field_errors = dict(_field_errors(dev))
        # A GPU that falls off the bus mid-read answers GPU_IS_LOST field by field.
        if not state.error and LOST in state.field_errors.values():
            state.error, state.field_errors = LOST, {}
        gpus.append(state)
    return GpuReport(None, val(doc.get("driver_version")), gpus)


def _field_errors(node: Any, path: str = ""):
    """Errors that are not "absent": a permission problem or a timeout is a checker error."""
    if isinstance(node, dict):
        e = err(node)
        if e:
            if e not in ABSENT and path:
                yield path, e
            return
        for key, value in node.items():
            yield from _field_errors(value, f"{path}.{key}" if path else str(key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _field_errors(value, f"{path}[{i}]")
