"""GPU state from NVML, or from a JSON file of captured NVML answers (replay).

Both backends produce the same document, "NVML answers": a dict that mirrors the NVML calls
made. Any answer may be `{"error": "NVML_ERROR_..."}` with NVML's own error name, so a failing
library, a lost GPU or an unsupported field is data that the checks judge, never an exception.
`parse_answers` turns the document into `GpuState`s.
"""

from __future__ import annotations

from rsc_health.compat import json_dumps, json_loads
from rsc_health.record import dataclass, field

TYPE_CHECKING = False  # typing's, without importing typing: every job start loads this
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from _typeshed import StrPath  # str | os.PathLike[str]

# What an NVML error answer says about the node. Only UNUSABLE ever drains: the GPU or the
# driver really cannot run a job. CHECKER means the checker could not ask or asked wrongly (its
# permissions, its call order, a call this driver lacks or retired, a moment of contention):
# loud, never a drain. ABSENT is "this GPU has no such thing" (see ABSENT below).
UNUSABLE, CHECKER = "unusable", "checker"

# NVML's return codes (nvml.h nvmlReturn_t, R570 headers; pynvml 12 agrees), so replay files
# need no pynvml to be read. code -> (name, kind, why).
NVML_RETURNS: dict[int, tuple[str, str, str]] = {
    1: ("NVML_ERROR_UNINITIALIZED", CHECKER, "our call order: nvmlInit had not run"),
    2: ("NVML_ERROR_INVALID_ARGUMENT", CHECKER, "we asked wrongly (or a link the GPU lacks)"),
    3: ("NVML_ERROR_NOT_SUPPORTED", CHECKER, "this GPU has no such field (absent, see ABSENT)"),
    4: ("NVML_ERROR_NO_PERMISSION", CHECKER, "the checker's privileges, not the GPU"),
    5: ("NVML_ERROR_ALREADY_INITIALIZED", CHECKER, "deprecated; init is ref-counted now"),
    6: ("NVML_ERROR_NOT_FOUND", CHECKER, "a lookup missed; GPU presence is the count's job"),
    7: ("NVML_ERROR_INSUFFICIENT_SIZE", CHECKER, "the caller's buffer was too small"),
    8: ("NVML_ERROR_INSUFFICIENT_POWER", UNUSABLE, "external power cables not attached"),
    9: ("NVML_ERROR_DRIVER_NOT_LOADED", UNUSABLE, "no NVIDIA kernel driver: no GPU job runs"),
    10: ("NVML_ERROR_TIMEOUT", CHECKER, "the call's own timeout; says nothing of the GPU"),
    11: ("NVML_ERROR_IRQ_ISSUE", UNUSABLE, "the driver saw the GPU's interrupts fail"),
    12: ("NVML_ERROR_LIBRARY_NOT_FOUND", UNUSABLE, "the driver's libnvidia-ml is not installed"),
    13: ("NVML_ERROR_FUNCTION_NOT_FOUND", CHECKER, "a library older than the call we made"),
    14: ("NVML_ERROR_CORRUPTED_INFOROM", UNUSABLE, "the board's InfoROM is corrupt: repair"),
    15: ("NVML_ERROR_GPU_IS_LOST", UNUSABLE, "fell off the bus"),
    16: ("NVML_ERROR_RESET_REQUIRED", UNUSABLE, "the GPU must be reset before it is used again"),
    17: ("NVML_ERROR_OPERATING_SYSTEM", CHECKER, "the OS/cgroup blocked the checker's access"),
    18: ("NVML_ERROR_LIB_RM_VERSION_MISMATCH", UNUSABLE,
         "driver upgraded without a reboot: CUDA jobs fail the same way"),
    19: ("NVML_ERROR_IN_USE", CHECKER, "busy for this operation; a job may well be using it"),
    20: ("NVML_ERROR_MEMORY", CHECKER, "host memory for the call; the checker's, not the GPU"),
    21: ("NVML_ERROR_NO_DATA", CHECKER, "nothing to report yet"),
    22: ("NVML_ERROR_VGPU_ECC_NOT_SUPPORTED", CHECKER, "a vGPU operation we do not make"),
    23: ("NVML_ERROR_INSUFFICIENT_RESOURCES", CHECKER, "a resource for the call ran out"),
    24: ("NVML_ERROR_FREQ_NOT_SUPPORTED", CHECKER, "a clock we do not ask for"),
    25: ("NVML_ERROR_ARGUMENT_VERSION_MISMATCH", CHECKER, "our struct version vs the driver's"),
    26: ("NVML_ERROR_DEPRECATED", CHECKER, "the driver retired the call we made"),
    27: ("NVML_ERROR_NOT_READY", CHECKER, "not ready yet (early after boot): ask again later"),
    # NVML enumerated no GPU at all: the gpu check compares that with [gpu] count (gpu_missing).
    28: ("NVML_ERROR_GPU_NOT_FOUND", UNUSABLE, "no GPU enumerated"),
    29: ("NVML_ERROR_INVALID_STATE", CHECKER, "not in a state for this request"),
    30: ("NVML_ERROR_RESET_TYPE_NOT_SUPPORTED", CHECKER, "a reset we do not ask for"),
    999: ("NVML_ERROR_UNKNOWN", CHECKER, "NVML could not say: no evidence against the GPU"),
}
NVML_ERRORS = {name: code for code, (name, _kind, _why) in NVML_RETURNS.items()}
NVML_ERROR_NAMES = {code: name for name, code in NVML_ERRORS.items()}
# The only answers that may drain. A name not in here (CHECKER, a code a newer driver added,
# garbage in a replay file) is a checker error naming what was answered.
UNUSABLE_ERRORS = frozenset(name for name, kind, _why in NVML_RETURNS.values() if kind == UNUSABLE)
NOT_SUPPORTED = "NVML_ERROR_NOT_SUPPORTED"
LOST = "NVML_ERROR_GPU_IS_LOST"
# Unusable answers that speak for the whole device wherever they come back: a GPU that fell
# off the bus, or that must be reset, answers so field by field once its handle was taken.
# Most telling first. (Driver- and library-wide answers cannot appear past nvmlInit.) Not a
# corrupt InfoROM from one field: the GPU still runs jobs (DCGM calls it a warning), only
# that field's record is unreadable, so it stays that field's checker error.
DEVICE_FAULTS = (LOST, "NVML_ERROR_RESET_REQUIRED", "NVML_ERROR_IRQ_ISSUE",
                 "NVML_ERROR_INSUFFICIENT_POWER")
# A handle NVML refuses so for a GPU it counted is no evidence on one run (a moment of
# contention), but NVML says the same of a GPU in a bad state: with nvmlInit_v2, such GPUs are
# found in nvmlDeviceGetHandleBy* (one the driver failed to initialise, "RmInitAdapter failed!"
# in the kernel log, answers it on every call). Kept run after run (collect.hangs, as
# NVML_HANDLE), it drains once [gpu] handle_error_sweeps sweeps in a row found it (checks.gpu).
HANDLE_REFUSED = frozenset({"NVML_ERROR_UNKNOWN"})
# The health answers (NvmlBackend._device's, past the GPU's identity). A GPU whose handle NVML
# gives but that answers every one of them so (HANDLE_REFUSED; absent ones aside: some calls
# are refused by the library before the GPU is asked) gives no more than one whose handle is
# refused, and no ECC, remap or NVLink judgement of it is possible: it is kept and judged as
# one (GpuState.unanswered). A single field's refusal stays that field's checker error.
HEALTH_ANSWERS = ("ecc_mode", "ecc", "retired_pages", "remapped_rows", "nvlink", "pcie",
                  "temperature", "throttle_reasons", "fabric")
# How many of them must hold a refusal: one call refused beside calls this GPU lacks is
# not a GPU that answers nothing.
UNANSWERED_MIN = 2
# Asking for a link index the GPU does not have answers INVALID_ARGUMENT / NOT_SUPPORTED.
ABSENT = {NOT_SUPPORTED, "NVML_ERROR_INVALID_ARGUMENT", "NVML_ERROR_FUNCTION_NOT_FOUND"}
# An error answer that is not an NVML return code at all (pynvml raised with a value that is
# not an int, a replay file holding a number, null or an object where a name belongs).
NOT_A_CODE = "NVML_ERROR_NOT_A_CODE"
# The most GPUs a device count may say: past it the count is garbled (not asked GPU by GPU).
MAX_DEVICES = 1024
# An answer of the wrong shape (a list where an object belongs, a number for the list of
# links) in a replayed or captured document: no backend wrote it, so it is read as that
# field's error answer, the checker's (parse_answers), never a crash of every family's run.
MALFORMED = "NVML_ANSWER_MALFORMED"
# The answers the checks read into, each an object (or an error answer), with the objects
# inside it that must be objects too; `nvlink` is a list of objects, one a link. Not `fabric`:
# its family says any answer it cannot read itself, in runs the gpu family is not part of.
OBJECT_ANSWERS: dict[str, tuple[str, ...]] = {
    "ecc": ("volatile", "aggregate"), "ecc_mode": (), "retired_pages": (),
    "remapped_rows": (), "pcie": ()}


def code_name(value: Any) -> str:
    """NVML's name for a return code: a known int -> its name, another int -> NVML_ERROR_<n>
    (a code newer than this table: visible, never a drain), anything else -> NOT_A_CODE with
    what it was. Never raises (an unhashable value included)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return NVML_ERROR_NAMES.get(value, f"NVML_ERROR_{value}")
    return f"{NOT_A_CODE}({_short(value)})"


def unusable(name: str | None) -> bool:
    """True only for an answer that says the GPU or driver cannot run a job."""
    return name in UNUSABLE_ERRORS


def known(name: str | None) -> bool:
    return name in NVML_ERRORS


def _short(value: Any) -> str:
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - a hostile __repr__ must not crash the collector
        text = type(value).__name__
    return text[:40]


NVLINK_COUNTERS = ("replay", "recovery", "crc_flit", "crc_data")  # NVML_NVLINK_ERROR_DL_* 0..3

# Telemetry (the `telemetry` family; read only when it runs, so a prolog asks NVML nothing
# more). nvmlDeviceGetViolationStatus's perf policies (nvml.h nvmlPerfPolicyType_t): each
# answers a cumulative violationTime in ns, the time clocks were held below the requested
# ones for that reason.
VIOLATION_POLICIES = (("power", 0), ("thermal", 1), ("sync_boost", 2), ("board_limit", 3),
                      ("reliability", 5))
# Cumulative ns per clock-event reason (nvmlDeviceGetFieldValues, R535+): what the violation
# policies lump together as "thermal" split into the hardware's own slowdowns. The pynvml
# name, then the key the answers use. A pynvml without one asks for the others.
EVENT_TIME_FIELDS = (
    ("NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP", "sw_power_cap"),
    ("NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_SLOWDOWN", "hw_slowdown"),
    ("NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN", "sw_thermal"),
    ("NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN", "hw_thermal"),
    ("NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN", "hw_power_brake"),
)
NVML_CLOCK_SM, NVML_CLOCK_MEM = 1, 2  # nvmlClockType_t
# NVLink data KiB sent and received, cumulative (nvml.h NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX
# 138 / _RX 139: payload, no protocol overhead). A scopeId of UINT_MAX sums every link (a
# link index would give that link only). NOT_SUPPORTED off NVLink (the real H200 VM capture).
NVLINK_THROUGHPUT_FIELDS = (("NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX", 138, "tx"),
                            ("NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX", 139, "rx"))
ALL_LINKS = 0xFFFFFFFF
# nvmlDeviceGetRowRemapperHistogram (Ampere+): memory banks by the remap rows they have left.
REMAP_HISTOGRAM = ("max", "high", "partial", "low", "none")
TELEMETRY_KEY = "telemetry"  # a device's telemetry answers
FIRMWARE_KEY = "firmware"  # a device's VBIOS and InfoROM versions (never a checker error)


def error_name(exc: BaseException) -> str:
    """The NVML name of a pynvml exception's return code (code_name: never raises)."""
    return code_name(getattr(exc, "value", None))


class NvmlBackend:
    """Live NVML through pynvml (imported here, not at module import: CPU nodes lack it), or,
    binding="own", the health pass through rsc_health.collect.nvmlc (a ctypes binding of just
    those calls: `import pynvml` costs a job start more than the rest of it). Telemetry (the
    sweep's pass) is always asked through pynvml."""

    def __init__(self, max_links: int = 18, telemetry: bool = False, binding: str = "pynvml"):
        self.max_links = max_links
        self.telemetry = telemetry
        self.binding = binding

    def read(self, progress: Callable[[dict], None] | None = None) -> dict[str, Any]:
        """Every answer. `progress(doc)`, when given, gets the answers so far after the count
        and after each GPU: a read abandoned when NVML hangs on one GPU keeps the others'."""
        # pynvml missing from the checker's own Python is an install problem (ImportError: a
        # checker finding), not the node's: the NVIDIA library itself missing is
        # NVML_ERROR_LIBRARY_NOT_FOUND from nvmlInit below.
        nv: Any
        if self.binding == "own" and not self.telemetry:
            from rsc_health.collect import nvmlc

            nv = nvmlc
        else:
            import pynvml

            nv = pynvml
        # pynvml raises NVMLLibraryMismatchError (not an NVMLError) where a library lacks the
        # versioned entry point of a call it wraps so (nvmlDeviceGetComputeRunningProcesses_v3
        # on an older driver): FUNCTION_NOT_FOUND for that answer, as NVML would say.
        mismatch = getattr(nv, "NVMLLibraryMismatchError", None)
        errors = (nv.NVMLError, mismatch) if mismatch is not None else nv.NVMLError

        def call(fn, *args):
            try:
                value = fn(*args)
                return value.decode() if isinstance(value, bytes) else value
            except errors as exc:
                return {"error": error_name(exc) if isinstance(exc, nv.NVMLError)
                        else "NVML_ERROR_FUNCTION_NOT_FOUND"}
            except UnicodeDecodeError as exc:
                # A driver string that is not UTF-8 (pynvml decodes it itself and raises):
                # that answer unreadable, a checker error, never the whole read lost.
                return {"error": f"{NOT_A_CODE}(not UTF-8: {_short(exc.object)})"}

        try:
            nv.nvmlInit()
        except nv.NVMLError as exc:
            return {"error": error_name(exc)}
        try:
            doc: dict[str, Any] = {"driver_version": call(nv.nvmlSystemGetDriverVersion)}
            count = call(nv.nvmlDeviceGetCount)
            if isinstance(count, dict):
                doc["device_count"] = count
                return doc
            doc["device_count"] = count
            doc["devices"] = []
            if not 0 <= count <= MAX_DEVICES:
                # A garbled count (4,294,967,295): asking each index's handle until the
                # deadline read as an NVML hang. parse_answers says the count is malformed.
                return doc
            handles = []
            for i in range(count):
                if progress is not None:
                    progress(doc)
                device, handle = self._device(nv, call, i)
                doc["devices"].append(device)
                handles.append(handle)
            if self.telemetry:
                _telemetry_pass(nv, call, doc, handles, progress)
            return doc
        finally:
            # Before the answer, in the child, even though its exit would let go of the driver
            # too (9-10 ms on a real H200): a release that wedges in the driver is then a hang
            # the parent abandons and records (nvml_hung, then nvml_wedged), not a child stuck
            # after answering that nobody kills or counts, one more each run (helper-136).
            try:
                nv.nvmlShutdown()
            except nv.NVMLError:
                pass

    def read_streamed(self, emit: Callable[[Any], None]) -> dict[str, Any]:
        """read(), its progress sent through `emit` as packed reports (unpack_report): each
        GPU's health answers are encoded once, not again in every later report (an 8-GPU
        health pass: 8 GPUs encoded, not 36)."""
        return self.read(_Packer(emit))

    def _device(self, nv, call, index: int) -> tuple[dict[str, Any], Any]:
        """(one GPU's health answers, its handle; None when NVML gave none)."""
        handle = call(nv.nvmlDeviceGetHandleByIndex, index)
        if isinstance(handle, dict):
            return {"index": index, **handle}, None
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
        if not isinstance(rows, dict) and len(rows) != len(names):  # zip(strict=True) is 3.10+
            raise ValueError(f"nvmlDeviceGetRemappedRows: {len(rows)} values, not {len(names)}")
        d["remapped_rows"] = rows if isinstance(rows, dict) else dict(zip(names, rows))
        links = []
        for link in range(self.max_links):
            state = call(nv.nvmlDeviceGetNvLinkState, handle, link)
            if isinstance(state, dict) and state["error"] in ABSENT:
                break
            entry = {"link": link, "state": state}
            for ctype, counter in enumerate(NVLINK_COUNTERS):
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
        d["throttle_reasons"] = clock_event_reasons(nv, call, handle)
        d["fabric"] = _fabric(nv, call, handle)
        # A binding older than the call (or one that lacks it) is absent, as NVML would say.
        running = getattr(nv, "nvmlDeviceGetComputeRunningProcesses", None)
        procs = (call(running, handle) if running is not None
                 else {"error": "NVML_ERROR_FUNCTION_NOT_FOUND"})
        d["processes"] = procs if isinstance(procs, dict) else _processes(procs)
        d[FIRMWARE_KEY] = _firmware(nv, call, handle)
        return d, handle


def _telemetry_pass(nv, call, doc: dict[str, Any], handles: list,
                    progress: Callable[[dict], None] | None) -> None:
    """Every GPU's telemetry, after every GPU's health answers: a driver that blocks in a
    warn-only telemetry field (the read abandoned at its deadline) leaves the health of all
    GPUs judged. Until a GPU's telemetry is read it says NVML's own timeout (UNANSWERED), what
    a read abandoned there reports: absent to the telemetry family, no GPU field error."""
    devices = doc["devices"]
    for d, handle in zip(devices, handles):
        if handle is not None:
            d[TELEMETRY_KEY] = dict(UNANSWERED)
    for d, handle in zip(devices, handles):
        if handle is None:
            continue
        if progress is not None:
            progress(doc)
        d[TELEMETRY_KEY] = _telemetry(nv, call, handle)


def _firmware(nv, call, handle) -> dict[str, Any]:
    """The board's VBIOS and InfoROM image versions: what a firmware update changes (the
    heartbeat carries them; qualification's driver/firmware trigger reads them). A binding
    without the call answers FUNCTION_NOT_FOUND, as NVML would."""
    out: dict[str, Any] = {}
    for key, name in (("vbios", "nvmlDeviceGetVbiosVersion"),
                      ("inforom", "nvmlDeviceGetInforomImageVersion")):
        fn = getattr(nv, name, None)
        out[key] = (call(fn, handle) if fn is not None
                    else {"error": "NVML_ERROR_FUNCTION_NOT_FOUND"})
    return out


def clock_event_reasons(nv, call, handle) -> Any:
    """nvmlDeviceGetCurrentClocksEventReasons (R535+), else the deprecated
    ...ClocksThrottleReasons it replaces (removed in CUDA 14): the same bitmask, whichever
    this pynvml and driver have. A pynvml without either answers FUNCTION_NOT_FOUND (absent)."""
    missing = {"error": "NVML_ERROR_FUNCTION_NOT_FOUND"}
    for name in ("nvmlDeviceGetCurrentClocksEventReasons",
                 "nvmlDeviceGetCurrentClocksThrottleReasons"):
        fn = getattr(nv, name, None)
        if fn is None:
            continue
        answer = call(fn, handle)
        if err(answer) != "NVML_ERROR_FUNCTION_NOT_FOUND":  # the driver has it: its answer
            return answer
    return missing


def _telemetry(nv, call, handle) -> dict[str, Any]:
    """One GPU's telemetry answers. Each field is its own call: one NOT_SUPPORTED or
    NO_PERMISSION is that field absent, never the others."""
    def struct(answer, *names):
        if isinstance(answer, dict):
            return answer
        return {n: getattr(answer, n, None) for n in names}

    t: dict[str, Any] = {
        "clocks": {"sm": call(nv.nvmlDeviceGetClockInfo, handle, NVML_CLOCK_SM),
                   "mem": call(nv.nvmlDeviceGetClockInfo, handle, NVML_CLOCK_MEM)},
        "max_clocks": {"sm": call(nv.nvmlDeviceGetMaxClockInfo, handle, NVML_CLOCK_SM),
                       "mem": call(nv.nvmlDeviceGetMaxClockInfo, handle, NVML_CLOCK_MEM)},
        "power_mw": call(nv.nvmlDeviceGetPowerUsage, handle),
        "enforced_power_limit_mw": call(nv.nvmlDeviceGetEnforcedPowerLimit, handle),
        "utilization": struct(call(nv.nvmlDeviceGetUtilizationRates, handle), "gpu", "memory"),
    }
    violation = {}
    for name, policy in VIOLATION_POLICIES:
        answer = call(nv.nvmlDeviceGetViolationStatus, handle, policy)
        violation[name] = answer if isinstance(answer, dict) else \
            getattr(answer, "violationTime", None)
    t["violation_ns"] = violation
    t["event_time_ns"] = _event_times(nv, call, handle)
    t["nvlink_kib"] = _nvlink_throughput(nv, call, handle)
    hist = getattr(nv, "nvmlDeviceGetRowRemapperHistogram", None)
    t["remap_histogram"] = (struct(call(hist, handle), *REMAP_HISTOGRAM) if hist is not None
                            else {"error": "NVML_ERROR_FUNCTION_NOT_FOUND"})
    return t


def _nvlink_throughput(nv, call, handle) -> dict[str, Any]:
    """NVLink data KiB {"tx", "rx"} summed over the GPU's links, one field-values call; each
    field's own return code is its answer (NOT_SUPPORTED without NVLink)."""
    ids = [(getattr(nv, name, fid), ALL_LINKS) for name, fid, _key in NVLINK_THROUGHPUT_FIELDS]
    answer = call(nv.nvmlDeviceGetFieldValues, handle, ids)
    keys = [key for _name, _fid, key in NVLINK_THROUGHPUT_FIELDS]
    if isinstance(answer, dict):
        return {key: answer for key in keys}
    out: dict[str, Any] = {}
    for key, value in zip(keys, answer):
        ret = getattr(value, "nvmlReturn", 0)
        out[key] = {"error": code_name(ret)} if ret else _field_value(value)
    return out


def _event_times(nv, call, handle) -> dict[str, Any]:
    """The clock-event reasons' cumulative ns, one nvmlDeviceGetFieldValues call for all."""
    wanted = [(key, getattr(nv, name)) for name, key in EVENT_TIME_FIELDS if hasattr(nv, name)]
    if not wanted:
        return {}
    answer = call(nv.nvmlDeviceGetFieldValues, handle, [fid for _key, fid in wanted])
    if isinstance(answer, dict):
        return {key: answer for key, _fid in wanted}
    out: dict[str, Any] = {}
    for (key, _fid), value in zip(wanted, answer):
        ret = getattr(value, "nvmlReturn", 0)
        if ret:
            out[key] = {"error": code_name(ret)}
            continue
        out[key] = _field_value(value)
    return out


def _field_value(value) -> Any:
    """A c_nvmlFieldValue_t's value by its valueType (nvml.h nvmlValueType_t)."""
    union = value.value
    kind = getattr(value, "valueType", 3)
    attr = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal",
            6: "usVal"}.get(kind, "ullVal")
    return getattr(union, attr, None)


# Compute processes kept per GPU (a GPU runs a handful; MPS clients can be dozens).
MAX_PROCESSES = 256
# nvmlGpuFabricState_t (nvml.h): NOT_SUPPORTED (no fabric: not an NVSwitch/NVLink-domain GPU),
# NOT_STARTED (Fabric Manager has not trained it), IN_PROGRESS, COMPLETED.
FABRIC_STATES = {0: "not_supported", 1: "not_started", 2: "in_progress", 3: "completed"}


def _processes(procs: Any) -> list[dict] | dict:
    """pynvml's process objects as answers; a binding that hands back something else is an
    answer that is not one (NOT_A_CODE: a checker error), never a crash of the whole read."""
    try:
        return [{"pid": int(p.pid),
                 "used_memory": None if p.usedGpuMemory is None else int(p.usedGpuMemory)}
                for p in list(procs)[:MAX_PROCESSES]]
    except (TypeError, ValueError, AttributeError, OverflowError):
        return {"error": f"{NOT_A_CODE}({_short(procs)})"}


def _fabric(nv, call, handle) -> dict[str, Any]:
    """The GPU's NVLink fabric state: nvmlDeviceGetGpuFabricInfoV (R550+, with the health
    mask), else nvmlDeviceGetGpuFabricInfo (R535); NVML's error as answered otherwise
    (NOT_SUPPORTED before Hopper and off NVSwitch systems, FUNCTION_NOT_FOUND on a driver that
    has neither: both absent)."""
    import ctypes

    versioned = getattr(nv, "c_nvmlGpuFabricInfoV_t", None)
    if versioned is not None and hasattr(nv, "nvmlDeviceGetGpuFabricInfoV"):
        info = versioned()
        got = call(nv.nvmlDeviceGetGpuFabricInfoV, handle, ctypes.byref(info))
        if not isinstance(got, dict):
            return _fabric_doc(info, health=True)
        if got.get("error") != "NVML_ERROR_FUNCTION_NOT_FOUND":
            return got
    if not hasattr(nv, "nvmlDeviceGetGpuFabricInfo"):
        return {"error": "NVML_ERROR_FUNCTION_NOT_FOUND"}
    info = nv.c_nvmlGpuFabricInfo_t()
    got = call(nv.nvmlDeviceGetGpuFabricInfo, handle, ctypes.byref(info))
    return got if isinstance(got, dict) else _fabric_doc(info, health=False)


def _fabric_doc(info, *, health: bool) -> dict[str, Any]:
    doc = {"state": int(info.state), "status": int(info.status),
           "clique_id": int(info.cliqueId), "cluster_uuid": bytes(info.clusterUuid).hex()}
    if health:
        doc["health_mask"] = int(info.healthMask)
    return doc


class ReplayBackend:
    """Captured NVML answers from a JSON file (tests, `healthctl check --from`, bug reports)."""

    def __init__(self, path: StrPath):
        self.path = path

    def read(self) -> dict[str, Any]:
        """The captured answers; an unreadable or garbled file raises (a checker finding)."""
        from rsc_health.collect.sysfs import read_bounded

        doc = json_loads(read_bounded(self.path))
        if not isinstance(doc, dict):
            raise ValueError(f"{self.path}: not a JSON object of NVML answers")
        return doc


PACKED = "devices_json"  # a packed report's devices, each one already a JSON text


class _Packer:
    """NvmlBackend.read's progress as packed reports: the document with its devices as JSON
    texts. A GPU's health answers do not change once it is in the list, so each is encoded
    once; in the telemetry pass every GPU's answers change (its telemetry), so each report
    encodes them all afresh, as before."""

    def __init__(self, emit: Callable[[Any], None]):
        self.emit = emit
        self.encoded: list[str] = []

    def __call__(self, doc: dict[str, Any]) -> None:
        devices = doc.get("devices")
        if not isinstance(devices, list):
            self.emit(doc)
            return
        if any(TELEMETRY_KEY in d for d in devices if isinstance(d, dict)):
            encoded = [json_dumps(d, default=str) for d in devices]
        else:
            self.encoded.extend(json_dumps(d, default=str) for d in devices[len(self.encoded):])
            encoded = self.encoded
        report = {k: v for k, v in doc.items() if k != "devices"}
        report[PACKED] = encoded
        self.emit(report)


def unpack_report(report: Any) -> Any:
    """A packed report (NvmlBackend.read_streamed) as the answers document it stands for; any
    other report as it is; None for a packed report that does not decode."""
    if not isinstance(report, dict) or PACKED not in report:
        return report
    try:
        devices = [_device(text) for text in report[PACKED]]
    except (TypeError, ValueError, RecursionError):  # RecursionError: nested too deep
        return None
    doc = {k: v for k, v in report.items() if k != PACKED}
    doc["devices"] = devices
    return doc


def _device(text: Any) -> Any:
    """One packed device's answers; TypeError for what is not a JSON text (as json.loads)."""
    if not isinstance(text, (str, bytes, bytearray)):
        raise TypeError(f"not a JSON text: {type(text).__name__}")
    return json_loads(bytes(text) if isinstance(text, bytearray) else text)


# What a GPU that NVML never answered for (the read was abandoned at its deadline) shows: the
# call's own timeout, which says nothing of the GPU (a checker error, never a drain).
UNANSWERED = {"error": "NVML_ERROR_TIMEOUT"}


def with_unanswered(partial: Any) -> dict[str, Any] | None:
    """The answers a hung read got before its deadline (NvmlBackend.read's last progress),
    each GPU it never reached marked UNANSWERED; None when it got no device count."""
    if not isinstance(partial, dict) or not isinstance(partial.get("devices"), list):
        return None
    count = partial.get("device_count")
    if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= MAX_DEVICES:
        return None
    done = partial["devices"][:count]
    return {**partial, "devices": done + [{"index": i, **UNANSWERED}
                                          for i in range(len(done), count)]}


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def err(value: Any) -> str | None:
    """NVML's error name when an answer is an error, else None. A captured error that is not a
    name (a number, null, "", an object) is still an error, NOT_A_CODE: a file that says 18
    where it should say a name was not written by this backend, so it never drains."""
    if isinstance(value, dict) and "error" in value:
        e = value["error"]
        if isinstance(e, str) and e:
            return e
        return f"{NOT_A_CODE}({_short(e)})"
    return None


def val(value: Any) -> Any:
    """The answer, or None when NVML answered with an error (not supported = absent)."""
    return None if err(value) else value


def flag(answer: Any) -> tuple[bool | None, str | None]:
    """(yes/no, why unreadable) for an NVML yes/no answer (pending, failure, link state).

    Only a real bool or the integers 0/1 (what pynvml returns, what our backend captures) are
    an answer; truthiness is not: "false", 1.0, [] or 2 in a replayed or captured file would
    otherwise drain a node, or hide a yes. Absent (missing key, NOT_SUPPORTED) is (None, None);
    anything else the checker could not read is (None, why), a checker error."""
    if answer is None:
        return None, None
    e = err(answer)
    if e:
        return None, (None if e in ABSENT else e)
    if isinstance(answer, bool):
        return answer, None
    if type(answer) is int and answer in (0, 1):
        return bool(answer), None
    return None, f"not 0 or 1: {_short(answer)}"


@dataclass
class GpuState:
    index: int
    uuid: str | None = None
    pci_bus_id: str | None = None
    name: str | None = None
    error: str | None = None  # the device itself is unreachable (e.g. NVML_ERROR_GPU_IS_LOST)
    answers: dict = field(default_factory=dict)  # the raw NVML answers for this device
    field_errors: dict = field(default_factory=dict)  # field -> NVML error other than absent
    # Its handle given, every health answer refused (HEALTH_ANSWERS): the refusal, else None.
    unanswered: str | None = None


@dataclass
class GpuReport:
    error: str | None  # NVML itself failed (library not found, driver not loaded)
    driver_version: str | None
    gpus: list[GpuState]
    # The answers could not be understood (wrong types): what the checker could not read.
    malformed: str | None = None


def _shape(value: Any) -> str:
    if isinstance(value, dict):
        return "an object"
    return "a list" if isinstance(value, list) else f"a {type(value).__name__}"


def _malformed(value: Any, belongs: str) -> dict[str, str]:
    """The error answer standing for `value`, found where `belongs` should be."""
    return {"error": f"{MALFORMED}({_shape(value)} where {belongs} belongs)"}


def _well_formed(dev: dict[str, Any]) -> dict[str, Any]:
    """The device's answers with every one of the wrong shape (OBJECT_ANSWERS, `nvlink`)
    replaced by its error answer (_malformed): the checks judge the rest, and the gpu family
    says those as it says any answer NVML could not give. `dev` itself when all are right
    (a healthy run copies nothing)."""
    fixed: dict[str, Any] | None = None

    def put(key: str, value: Any) -> None:
        nonlocal fixed
        if fixed is None:
            fixed = dict(dev)
        fixed[key] = value

    for key, inner in OBJECT_ANSWERS.items():
        answer = dev.get(key)
        if answer is None or err(answer):
            continue  # absent, or an error answer: already what the checks read as one
        if not isinstance(answer, dict):
            put(key, _malformed(answer, "an object"))
            continue
        bad = {k: _malformed(answer[k], "an object") for k in inner
               if answer.get(k) is not None and not isinstance(answer[k], dict)}
        if bad:
            put(key, {**answer, **bad})
    links = dev.get("nvlink")
    if links is not None and not err(links):
        if not isinstance(links, list):
            put("nvlink", _malformed(links, "a list"))
        elif not all(isinstance(lk, dict) for lk in links):
            put("nvlink", [lk if isinstance(lk, dict) else {"link": i, **_malformed(
                lk, "an object")} for i, lk in enumerate(links)])
    return dev if fixed is None else fixed


def _unanswered(dev: dict[str, Any]) -> str | None:
    """The refusal (HANDLE_REFUSED) when no health answer of this GPU holds a value or another
    error than absent, and UNANSWERED_MIN of them hold that refusal; None otherwise."""
    keys = 0
    refusals: set[str] = set()
    for key in HEALTH_ANSWERS:
        answer = dev.get(key)
        if answer is None:
            continue
        found = _refusals(answer, key == "nvlink")
        if found is None:
            return None
        keys += 1 if found else 0
        refusals |= found
    return next(iter(refusals)) if keys >= UNANSWERED_MIN and len(refusals) == 1 else None


def _refusals(node: Any, links: bool) -> set[str] | None:
    """The refusals (HANDLE_REFUSED) among a health answer's leaves; None at the first one
    that is a value or another error than absent. `links`: the nvlink list, whose entries'
    "link" is the backend's own number, not an answer."""
    e = err(node)
    if e:
        return {e} if e in HANDLE_REFUSED else set() if e in ABSENT else None
    if isinstance(node, dict):
        items = [v for k, v in node.items() if not (links and k == "link")]
    elif isinstance(node, list):
        items = node
    else:
        return None
    out: set[str] = set()
    for value in items:
        found = _refusals(value, links and not isinstance(node, dict))
        if found is None:
            return None
        out |= found
    return out


def parse_answers(doc: dict[str, Any]) -> GpuReport:
    if not isinstance(doc, dict):
        return GpuReport(None, None, [], malformed=f"{_shape(doc)}, not an object")
    top = err(doc)
    if top:
        return GpuReport(top, None, [])
    count_err = err(doc.get("device_count"))
    if count_err:
        return GpuReport(count_err, None, [])
    count, devices = doc.get("device_count"), doc.get("devices")
    if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= MAX_DEVICES:
        return GpuReport(None, None, [], malformed=f"device_count {str(count)[:40]!r}")
    if not isinstance(devices, list) or len(devices) != count:
        return GpuReport(None, None, [], malformed=f"{count} devices counted, "
                         f"{len(devices) if isinstance(devices, list) else 'no'} listed")
    gpus = []
    for i, dev in enumerate(devices):
        if not isinstance(dev, dict):
            return GpuReport(None, None, [], malformed=f"device {i} is not an object")
        dev = _well_formed(dev)
        index = dev.get("index", i)
        if type(index) is not int or not 0 <= index < MAX_DEVICES:
            # Named by its place in the list, as one with no index is; the index said.
            dev = {**dev, "index": _malformed(index, "a GPU index")}
            index = i
        state = GpuState(index=index, error=err(dev), answers=dev)
        state.uuid = val(dev.get("uuid"))
        state.pci_bus_id = val(dev.get("pci_bus_id"))
        state.name = val(dev.get("name"))
        errors = dict(_field_errors(dev))
        # Telemetry fields NVML refuses (NO_PERMISSION, NOT_SUPPORTED, ...) are absent, not
        # the checker's problem: the telemetry family leaves them out of its sample.
        # Firmware versions NVML will not say are only unknown.
        # A read abandoned in the telemetry pass leaves the whole key UNANSWERED: absent too.
        state.field_errors = {k: v for k, v in errors.items()
                              if k not in (TELEMETRY_KEY, FIRMWARE_KEY)
                              and not k.startswith((TELEMETRY_KEY + ".", FIRMWARE_KEY + "."))}
        # A GPU that falls off the bus (or needs a reset) mid-read answers so field by
        # field: that is the device's state, not one field's.
        fault = next((f for f in DEVICE_FAULTS if f in errors.values()), None)
        if not state.error and fault:
            state.error, state.field_errors = fault, {}
        if not state.error:
            state.unanswered = _unanswered(dev)
        gpus.append(state)
    return GpuReport(None, val(doc.get("driver_version")), gpus)


def versions(report: GpuReport, gpu: GpuState) -> dict[str, str]:
    """{"driver": ..., "vbios": ..., "inforom": ...}: what NVML said of this GPU's driver and
    firmware, the values it could not say left out."""
    fw = gpu.answers.get(FIRMWARE_KEY) if isinstance(gpu.answers, dict) else None
    fw = fw if isinstance(fw, dict) else {}
    found = {"driver": report.driver_version, "vbios": val(fw.get("vbios")),
             "inforom": val(fw.get("inforom"))}
    return {k: v.strip()[:64] for k, v in found.items() if isinstance(v, str) and v.strip()}


def _field_errors(node: Any, path: str = "") -> list[tuple[str, str]]:
    """Errors that are not "absent": a permission problem or a timeout is a checker error.
    (path, error) in the answers' own order; a leaf (a number, a string) is no error and is
    passed over where it stands, without a call or a path of its own (about 190 answers a
    GPU: a recursive generator for each cost a healthy prolog 1.5 M instructions)."""
    found: list[tuple[str, str]] = []
    _errors_under(node, path, found)
    return found


def _errors_under(node: Any, path: str, found: list[tuple[str, str]]) -> None:
    if isinstance(node, dict):
        e = err(node)
        if e:
            if e not in ABSENT and path:
                found.append((path, e))
            return
        for key, value in node.items():
            if isinstance(value, (dict, list)):
                _errors_under(value, f"{path}.{key}" if path else str(key), found)
    elif isinstance(node, list):
        for i, value in enumerate(node):
            if isinstance(value, (dict, list)):
                _errors_under(value, f"{path}[{i}]", found)
