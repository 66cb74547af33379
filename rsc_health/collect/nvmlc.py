"""A minimal ctypes binding to libnvidia-ml for the job-start health pass only.

`import pynvml` alone costs a prolog more than everything else it does (about 125 M
instructions over a 38 M bare interpreter start: ctypes.util, string, threading, functools and
pynvml's 8,000 lines of module body). This module is what NvmlBackend's health pass calls
instead ([gpu] nvml_binding = "own"): the same function names, arguments and results as
pynvml's wrappers of the calls the health pass makes, the same versioned entry points
(nvmlInitWithFlags, nvmlDeviceGetCount_v2, nvmlDeviceGetHandleByIndex_v2,
nvmlDeviceGetPciInfo_v3, nvmlDeviceGetComputeRunningProcesses_v3), the same struct layouts, and
NVML's return codes as NVMLError(value), so gpu.NvmlBackend turns them into the same answers
document. Differences from pynvml that the document cannot show: the library is loaded by its
soname only (never ctypes.util.find_library, which runs ldconfig/gcc), and an entry point the
library lacks is NVML_ERROR_FUNCTION_NOT_FOUND for that call, never NVMLLibraryMismatchError.
The telemetry pass (sweeps) stays on pynvml.

Standard library only (Python 3.9): every job start on a GPU node loads this in its NVML child.
Verified against pynvml's struct definitions and a stub library (tests/fixtures/nvml_stub),
not against a real driver.
"""

from __future__ import annotations

from ctypes import (
    CDLL,
    Structure,
    byref,
    c_char,
    c_int,
    c_uint,
    c_uint8,
    c_uint32,
    c_ulonglong,
    c_void_p,
    create_string_buffer,
)

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INSUFFICIENT_SIZE = 7
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
SONAME = "libnvidia-ml.so.1"

# nvml.h buffer sizes, as pynvml passes them.
NVML_DEVICE_UUID_V2_BUFFER_SIZE = 96
NVML_DEVICE_NAME_V2_BUFFER_SIZE = 96
NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE = 80
NVML_DEVICE_VBIOS_VERSION_BUFFER_SIZE = 32
NVML_DEVICE_INFOROM_VERSION_BUFFER_SIZE = 16
NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE = 32
NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE = 16
NVML_GPU_FABRIC_UUID_LEN = 16
NVML_VALUE_NOT_AVAILABLE_ULONGLONG = 0xFFFFFFFFFFFFFFFF
nvmlGpuFabricInfo_v2 = 0x02000024
# The most entries a list call may ask room for. A driver that reports billions of retired pages
# or processes (a garbled count) would have the child allocate and the library fill gigabytes;
# past this the answer is INSUFFICIENT_SIZE (a checker error for that field; the GPU's other
# answers stand). Real figures are far below: pages retire by the dozen, a GPU runs at most
# hundreds of compute contexts.
MAX_LIST_ENTRIES = 1 << 16


class NVMLError(Exception):
    """An NVML return code other than success, in `value` (as pynvml's NVMLError)."""

    def __init__(self, value: int):
        super().__init__(f"NVML return code {value}")
        self.value = value


class nvmlPciInfo_t(Structure):
    _fields_ = [
        ("busIdLegacy", c_char * NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE),
        ("domain", c_uint),
        ("bus", c_uint),
        ("device", c_uint),
        ("pciDeviceId", c_uint),
        ("pciSubSystemId", c_uint),
        ("busId", c_char * NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE),
    ]


class c_nvmlProcessInfo_v3_t(Structure):  # nvmlProcessInfo_v2_t's layout, as pynvml's
    _fields_ = [
        ("pid", c_uint),
        ("usedGpuMemory", c_ulonglong),
        ("gpuInstanceId", c_uint),
        ("computeInstanceId", c_uint),
    ]


class c_nvmlGpuFabricInfo_t(Structure):
    _fields_ = [
        ("clusterUuid", c_uint8 * NVML_GPU_FABRIC_UUID_LEN),
        ("status", c_int),  # nvmlReturn_t
        ("cliqueId", c_uint32),
        ("state", c_uint),  # nvmlGpuFabricState_t
    ]


class c_nvmlGpuFabricInfo_v2_t(Structure):
    _fields_ = [
        ("version", c_uint),
        ("clusterUuid", c_uint8 * NVML_GPU_FABRIC_UUID_LEN),
        ("status", c_int),
        ("cliqueId", c_uint32),
        ("state", c_uint),
        ("healthMask", c_uint32),
    ]

    def __init__(self):
        super().__init__(version=nvmlGpuFabricInfo_v2)


c_nvmlGpuFabricInfoV_t = c_nvmlGpuFabricInfo_v2_t


class Process:
    """One compute process, as pynvml's friendly object: pid, usedGpuMemory (None when the
    driver says "not available"), gpuInstanceId, computeInstanceId."""

    def __init__(self, info: c_nvmlProcessInfo_v3_t):
        self.pid = info.pid
        used = info.usedGpuMemory
        self.usedGpuMemory = None if used == NVML_VALUE_NOT_AVAILABLE_ULONGLONG else used
        self.gpuInstanceId = info.gpuInstanceId
        self.computeInstanceId = info.computeInstanceId


_lib = None
_functions: dict = {}


def _load():
    global _lib
    if _lib is None:
        try:
            _lib = CDLL(SONAME)  # by soname, as the dynamic loader finds it: no find_library
        except OSError:
            raise NVMLError(NVML_ERROR_LIBRARY_NOT_FOUND) from None
    return _lib


def _fn(name: str):
    """The library's entry point; a library without it answers FUNCTION_NOT_FOUND."""
    fn = _functions.get(name)
    if fn is None:
        if _lib is None:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        try:
            fn = getattr(_lib, name)
        except AttributeError:
            raise NVMLError(NVML_ERROR_FUNCTION_NOT_FOUND) from None
        _functions[name] = fn
    return fn


def _check(ret: int) -> None:
    if ret != NVML_SUCCESS:
        raise NVMLError(ret)


def _string(name: str, size: int, *args) -> bytes:
    buf = create_string_buffer(size)
    _check(_fn(name)(*args, buf, c_uint(size)))
    return buf.value


# One output cell of each type, and its reference, for the calls that answer one number: the
# health pass makes about 120 calls per GPU (18 NVLinks x 5), and a new cell and byref per call
# were a third of each call's cost. Not thread-safe: the NVML child asks from one thread.
_UINT = c_uint()
_UINT_REF = byref(_UINT)
_ULONGLONG = c_ulonglong()
_ULONGLONG_REF = byref(_ULONGLONG)


def _uint(name: str, *args) -> int:
    """An entry point's one unsigned int answer. The unsigned int arguments (link, counter,
    sensor, error and counter types: small constants of the health pass) go as Python ints, as
    pynvml passes the NVLink ones: ctypes passes a C int, the same bits below 2**31."""
    _check(_fn(name)(*args, _UINT_REF))
    return _UINT.value


def _ulonglong(name: str, *args) -> int:
    _check(_fn(name)(*args, _ULONGLONG_REF))
    return _ULONGLONG.value


def _room(count: int) -> int:
    """Room for a list call's second ask: twice the first answer's count plus 5 (entries added
    between the two calls), as pynvml asks; a count past MAX_LIST_ENTRIES is not given room."""
    if count > MAX_LIST_ENTRIES:
        raise NVMLError(NVML_ERROR_INSUFFICIENT_SIZE)
    return count * 2 + 5


def nvmlInit() -> None:
    _load()
    _check(_fn("nvmlInitWithFlags")(0))


def nvmlShutdown() -> None:
    _check(_fn("nvmlShutdown")())


def nvmlSystemGetDriverVersion() -> bytes:
    return _string("nvmlSystemGetDriverVersion", NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE)


def nvmlDeviceGetCount() -> int:
    return _uint("nvmlDeviceGetCount_v2")


def nvmlDeviceGetHandleByIndex(index: int) -> c_void_p:
    device = c_void_p()
    _check(_fn("nvmlDeviceGetHandleByIndex_v2")(c_uint(index), byref(device)))
    return device


def nvmlDeviceGetPciInfo(handle) -> nvmlPciInfo_t:
    info = nvmlPciInfo_t()
    _check(_fn("nvmlDeviceGetPciInfo_v3")(handle, byref(info)))
    return info


def nvmlDeviceGetUUID(handle) -> bytes:
    return _string("nvmlDeviceGetUUID", NVML_DEVICE_UUID_V2_BUFFER_SIZE, handle)


def nvmlDeviceGetName(handle) -> bytes:
    return _string("nvmlDeviceGetName", NVML_DEVICE_NAME_V2_BUFFER_SIZE, handle)


def nvmlDeviceGetEccMode(handle) -> list:
    current, pending = c_uint(), c_uint()
    _check(_fn("nvmlDeviceGetEccMode")(handle, byref(current), byref(pending)))
    return [current.value, pending.value]


def nvmlDeviceGetTotalEccErrors(handle, error_type: int, counter_type: int) -> int:
    return _ulonglong("nvmlDeviceGetTotalEccErrors", handle, error_type,
                      counter_type)


def nvmlDeviceGetRetiredPages(handle, source: int) -> list:
    """The retired page addresses: asked for the count, then with room for twice that plus 5
    (pages retired between the two calls), as pynvml does."""
    fn = _fn("nvmlDeviceGetRetiredPages")
    count = c_uint(0)
    ret = fn(handle, c_uint(source), byref(count), None)
    if ret not in (NVML_SUCCESS, NVML_ERROR_INSUFFICIENT_SIZE):
        raise NVMLError(ret)
    room = _room(count.value)
    pages = (c_ulonglong * room)()
    count.value = room
    _check(fn(handle, c_uint(source), byref(count), pages))
    return [int(p) for p in pages[0:min(count.value, room)]]


def nvmlDeviceGetRetiredPagesPendingStatus(handle) -> int:
    return _uint("nvmlDeviceGetRetiredPagesPendingStatus", handle)


def nvmlDeviceGetRemappedRows(handle) -> tuple:
    out = (c_uint(), c_uint(), c_uint(), c_uint())
    _check(_fn("nvmlDeviceGetRemappedRows")(handle, *(byref(v) for v in out)))
    return tuple(v.value for v in out)


def nvmlDeviceGetNvLinkState(handle, link: int) -> int:
    return _uint("nvmlDeviceGetNvLinkState", handle, link)


def nvmlDeviceGetNvLinkErrorCounter(handle, link: int, counter: int) -> int:
    return _ulonglong("nvmlDeviceGetNvLinkErrorCounter", handle, link, counter)


def nvmlDeviceGetCurrPcieLinkGeneration(handle) -> int:
    return _uint("nvmlDeviceGetCurrPcieLinkGeneration", handle)


def nvmlDeviceGetMaxPcieLinkGeneration(handle) -> int:
    return _uint("nvmlDeviceGetMaxPcieLinkGeneration", handle)


def nvmlDeviceGetCurrPcieLinkWidth(handle) -> int:
    return _uint("nvmlDeviceGetCurrPcieLinkWidth", handle)


def nvmlDeviceGetMaxPcieLinkWidth(handle) -> int:
    return _uint("nvmlDeviceGetMaxPcieLinkWidth", handle)


def nvmlDeviceGetPcieReplayCounter(handle) -> int:
    return _uint("nvmlDeviceGetPcieReplayCounter", handle)


def nvmlDeviceGetTemperature(handle, sensor: int) -> int:
    return _uint("nvmlDeviceGetTemperature", handle, sensor)


def nvmlDeviceGetCurrentClocksEventReasons(handle) -> int:
    return _ulonglong("nvmlDeviceGetCurrentClocksEventReasons", handle)


def nvmlDeviceGetCurrentClocksThrottleReasons(handle) -> int:
    return _ulonglong("nvmlDeviceGetCurrentClocksThrottleReasons", handle)


def nvmlDeviceGetGpuFabricInfoV(handle, info) -> int:
    """info: byref(c_nvmlGpuFabricInfoV_t()), filled in place (as pynvml's)."""
    _check(_fn("nvmlDeviceGetGpuFabricInfoV")(handle, info))
    return NVML_SUCCESS


def nvmlDeviceGetGpuFabricInfo(handle, info) -> int:
    _check(_fn("nvmlDeviceGetGpuFabricInfo")(handle, info))
    return NVML_SUCCESS


def nvmlDeviceGetComputeRunningProcesses(handle) -> list:
    """The compute processes: [] when the first call (no buffer) succeeds, else asked again
    with room for twice the count plus 5, as pynvml does."""
    fn = _fn("nvmlDeviceGetComputeRunningProcesses_v3")
    count = c_uint(0)
    ret = fn(handle, byref(count), None)
    if ret == NVML_SUCCESS:
        return []
    if ret != NVML_ERROR_INSUFFICIENT_SIZE:
        raise NVMLError(ret)
    room = _room(count.value)
    infos = (c_nvmlProcessInfo_v3_t * room)()
    count.value = room
    _check(fn(handle, byref(count), infos))
    return [Process(infos[i]) for i in range(min(count.value, room))]


def nvmlDeviceGetVbiosVersion(handle) -> bytes:
    return _string("nvmlDeviceGetVbiosVersion", NVML_DEVICE_VBIOS_VERSION_BUFFER_SIZE, handle)


def nvmlDeviceGetInforomImageVersion(handle) -> bytes:
    return _string("nvmlDeviceGetInforomImageVersion", NVML_DEVICE_INFOROM_VERSION_BUFFER_SIZE,
                   handle)

