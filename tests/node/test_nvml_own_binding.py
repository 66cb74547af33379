"""The own ctypes NVML binding (rsc_health.collect.nvmlc, [gpu] nvml_binding = "own") against
pynvml, with no GPU: both drive the same stand-in libnvidia-ml.so.1 (tests/fixtures/nvml_stub,
built with gcc) through LD_LIBRARY_PATH, so each runs its real path end to end; the answers
documents must be equal, healthy and with each error injected. The binding's structs must have
pynvml's sizes and field offsets, and an NVML call that blocks for ever is still abandoned at
its deadline with what was answered before it kept."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
from pathlib import Path

import pynvml
import pytest

from rsc_health.collect import gpu as gpu_mod
from rsc_health.collect import nvmlc
from rsc_health.collect.gpu import TELEMETRY_KEY
from tests.fixtures import nvml_stub

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(not nvml_stub.available(), reason="no gcc to build the stub")

# Every entry point the health pass calls, by the name the library exports.
HEALTH_CALLS = (
    "nvmlSystemGetDriverVersion", "nvmlDeviceGetCount_v2", "nvmlDeviceGetHandleByIndex_v2",
    "nvmlDeviceGetPciInfo_v3", "nvmlDeviceGetUUID", "nvmlDeviceGetName", "nvmlDeviceGetEccMode",
    "nvmlDeviceGetTotalEccErrors", "nvmlDeviceGetRetiredPages",
    "nvmlDeviceGetRetiredPagesPendingStatus", "nvmlDeviceGetRemappedRows",
    "nvmlDeviceGetNvLinkState", "nvmlDeviceGetNvLinkErrorCounter",
    "nvmlDeviceGetCurrPcieLinkGeneration", "nvmlDeviceGetMaxPcieLinkGeneration",
    "nvmlDeviceGetCurrPcieLinkWidth", "nvmlDeviceGetMaxPcieLinkWidth",
    "nvmlDeviceGetPcieReplayCounter", "nvmlDeviceGetTemperature",
    "nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetGpuFabricInfoV",
    "nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetVbiosVersion",
    "nvmlDeviceGetInforomImageVersion",
)
# Each NVML_STUB configuration both bindings are read under.
CASES = (
    ["", "lost=3", "procs=3 pages=2", "count=0", "init=9", "init=18", "err=nvmlInitWithFlags:999",
     "err=nvmlDeviceGetCount_v2:28", "err=nvmlDeviceGetHandleByIndex_v2:15:5",
     "err=nvmlDeviceGetRetiredPages:7", "err=nvmlDeviceGetComputeRunningProcesses_v3:2",
     "err=nvmlDeviceGetNvLinkState:3:1 err=nvmlDeviceGetTotalEccErrors:14:6", "badname=2",
     "procs=300 pages=100", "count=64"]
    + [f"count=2 err={name}:3" for name in HEALTH_CALLS]
    + [f"count=2 err={name}:{code}:1" for name in HEALTH_CALLS[3:] for code in (4, 15, 999)]
)
# A driver older than the calls: the newer entry points it lacks.
OLDER = ("nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetGpuFabricInfoV",
         "nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetVbiosVersion")

READ_BOTH = """
import json, os, sys
from rsc_health.collect.gpu import NvmlBackend
out = []
for case in json.loads(sys.argv[1]):
    os.environ["NVML_STUB"] = case
    out.append({b: NvmlBackend(binding=b).read() for b in ("pynvml", "own")})
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def stub_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("nvml-stub")


def _read_both(lib_dir: Path | None, cases) -> list[dict]:
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "NVML_STUB")}
    env["PYTHONPATH"] = str(REPO)
    if lib_dir is not None:
        env["LD_LIBRARY_PATH"] = str(lib_dir)
    out = subprocess.run([sys.executable, "-c", READ_BOTH, json.dumps(list(cases))], env=env,
                         capture_output=True, text=True, timeout=60, check=True)
    return json.loads(out.stdout)


def test_own_binding_answers_as_pynvml_on_the_stub_healthy_and_with_each_error(stub_dir):
    docs = _read_both(nvml_stub.build(stub_dir), CASES)
    for case, doc in zip(CASES, docs, strict=True):
        assert doc["own"] == doc["pynvml"], case
    healthy = docs[0]["own"]
    assert healthy["device_count"] == 8 and len(healthy["devices"]) == 8
    gpu = healthy["devices"][0]
    assert gpu["pci_bus_id"] == "00000000:18:00.0" and len(gpu["nvlink"]) == 18
    assert gpu["fabric"]["state"] == 3 and gpu["fabric"]["health_mask"] == 0
    assert gpu["fabric"]["cluster_uuid"] == bytes(range(0xa0, 0xb0)).hex()
    assert gpu["firmware"] == {"vbios": "96.00.89.00.01", "inforom": "G520.0200.00.05"}
    # The injected errors reach the document (the stub did what each case says).
    by_case = dict(zip(CASES, (d["own"] for d in docs), strict=True))
    assert by_case["lost=3"]["devices"][3]["uuid"] == {"error": "NVML_ERROR_GPU_IS_LOST"}
    procs = by_case["procs=3 pages=2"]["devices"][0]
    assert procs["processes"] == [{"pid": 4000, "used_memory": 1 << 30},
                                  {"pid": 4001, "used_memory": 2 << 30},
                                  {"pid": 4002, "used_memory": None}]
    assert procs["retired_pages"] == {"sbe": 2, "dbe": 2, "pending": 0}
    assert by_case["init=9"] == {"error": "NVML_ERROR_DRIVER_NOT_LOADED"}
    # A name that is not UTF-8 made both bindings lose the whole read; now that answer alone.
    garbled = by_case["badname=2"]["devices"]
    many = by_case["procs=300 pages=100"]["devices"][7]
    assert len(many["processes"]) == 256 and many["retired_pages"]["dbe"] == 100
    assert len(by_case["count=64"]["devices"]) == 64
    assert garbled[2]["name"]["error"].startswith("NVML_ERROR_NOT_A_CODE(not UTF-8: ")
    assert garbled[2]["uuid"].endswith("8c02") and garbled[3]["name"] == "NVIDIA H100 80GB HBM3"
    assert by_case["count=2 err=nvmlDeviceGetRemappedRows:3"]["devices"][1]["remapped_rows"] \
        == {"error": "NVML_ERROR_NOT_SUPPORTED"}
    assert by_case["count=2 err=nvmlDeviceGetTemperature:4:1"]["devices"][1]["temperature"] \
        == {"error": "NVML_ERROR_NO_PERMISSION"}


def test_a_library_without_an_entry_point_is_function_not_found_for_that_answer(stub_dir):
    """pynvml raised NVMLLibraryMismatchError (not an NVMLError) for a library without
    nvmlDeviceGetComputeRunningProcesses_v3: the whole read failed. Now both say
    FUNCTION_NOT_FOUND for that answer, and the older calls' answers stand."""
    docs = _read_both(nvml_stub.build(stub_dir, omit=OLDER), ["", "lost=1"])
    for doc in docs:
        assert doc["own"] == doc["pynvml"]
    gpu = docs[0]["own"]["devices"][0]
    missing = {"error": "NVML_ERROR_FUNCTION_NOT_FOUND"}
    assert gpu["processes"] == missing and gpu["firmware"]["vbios"] == missing
    assert gpu["throttle_reasons"] == 1  # the deprecated ThrottleReasons the library has
    assert gpu["fabric"]["state"] == 3 and "health_mask" not in gpu["fabric"]  # R535's call
    assert gpu["firmware"]["inforom"] == "G520.0200.00.05"


def test_no_library_is_library_not_found_for_both():
    [doc] = _read_both(None, [""])
    assert doc["own"] == doc["pynvml"] == {"error": "NVML_ERROR_LIBRARY_NOT_FOUND"}


@pytest.mark.parametrize("ours, theirs", [
    (nvmlc.nvmlPciInfo_t, pynvml.nvmlPciInfo_t),
    (nvmlc.c_nvmlProcessInfo_v3_t, pynvml.c_nvmlProcessInfo_v3_t),
    (nvmlc.c_nvmlGpuFabricInfo_t, pynvml.c_nvmlGpuFabricInfo_t),
    (nvmlc.c_nvmlGpuFabricInfoV_t, pynvml.c_nvmlGpuFabricInfoV_t),
])
def test_every_struct_has_pynvmls_size_and_field_offsets(ours, theirs):
    assert ctypes.sizeof(ours) == ctypes.sizeof(theirs)
    assert ctypes.alignment(ours) == ctypes.alignment(theirs)
    mine = [(name, getattr(ours, name).offset, getattr(ours, name).size)
            for name, *_ in ours._fields_]
    pyn = [(name, getattr(theirs, name).offset, getattr(theirs, name).size)
           for name, *_ in theirs._fields_]
    assert mine == pyn


def test_every_struct_of_the_binding_is_compared_with_pynvmls():
    """A struct added to nvmlc without a layout check above fails here."""
    structs = {name for name, value in vars(nvmlc).items()
               if isinstance(value, type) and issubclass(value, ctypes.Structure)
               and value is not ctypes.Structure}
    assert structs == {"nvmlPciInfo_t", "c_nvmlProcessInfo_v3_t", "c_nvmlGpuFabricInfo_t",
                       "c_nvmlGpuFabricInfo_v2_t", "c_nvmlGpuFabricInfoV_t"}
    assert nvmlc.c_nvmlGpuFabricInfoV_t().version == pynvml.c_nvmlGpuFabricInfoV_t().version


def test_the_binding_versions_match_pynvmls_entry_points():
    """The versioned names the binding calls are the ones pynvml's wrappers resolve."""
    import inspect
    source = inspect.getsource(nvmlc)
    for name in ("nvmlInitWithFlags", "nvmlDeviceGetCount_v2", "nvmlDeviceGetHandleByIndex_v2",
                 "nvmlDeviceGetPciInfo_v3", "nvmlDeviceGetComputeRunningProcesses_v3"):
        assert f'"{name}"' in source
        assert f'"{name}"' in inspect.getsource(pynvml)


HUNG_READ = """
import json, sys
from pathlib import Path
from rsc_health.checks.state import NodeState
from rsc_health.collect import node
from rsc_health.config import load_config
state = NodeState()
node.read_nvml(load_config(sys.argv[1]), Path("/"), state, {})
print(json.dumps({"answers": state.nvml_answers, "hung": state.hung_probes,
                  "pids": list(state.probe_pids.values()), "errors": state.errors}))
"""


@pytest.mark.parametrize("binding", ["own", "pynvml"])
def test_an_nvml_call_that_never_returns_is_abandoned_with_the_answers_before_it(
        stub_dir, tmp_path, binding):
    """GPU 2's temperature call blocks for ever in the library (as an ioctl into a wedged
    driver): the child is abandoned at nvml_timeout_s, GPUs 0-1 keep their answers, 2-7 are
    NVML's own timeout (a checker error, never a drain), and the hang is said."""
    site = tmp_path / "site.toml"
    site.write_text(f'[gpu]\ncount = 8\nbackend = "nvml"\nnvml_binding = "{binding}"\n'
                    'nvml_timeout_s = 1.0\n')
    env = {k: v for k, v in os.environ.items() if k != "NVML_STUB"}
    env.update(PYTHONPATH=str(REPO), LD_LIBRARY_PATH=str(nvml_stub.build(stub_dir)),
               NVML_STUB="hang=nvmlDeviceGetTemperature:2")
    out = subprocess.run([sys.executable, "-c", HUNG_READ, str(site)], env=env,
                         capture_output=True, text=True, timeout=30, check=True)
    got = json.loads(out.stdout)
    devices = got["answers"]["devices"]
    assert [d.get("error") for d in devices] == [None, None] + ["NVML_ERROR_TIMEOUT"] * 6
    assert devices[1]["temperature"] == 35 and devices[1]["uuid"].endswith("8c01")
    assert "after answering for 2 of 8 GPUs" in got["hung"]["nvml"]
    assert got["errors"] == [] and len(got["pids"]) == 1


def _fixture_devices() -> list[dict]:
    doc = json.loads((REPO / "tests/fixtures/nodes/healthy/rsc_health/nvml.json").read_text())
    return [{k: v for k, v in d.items() if k != TELEMETRY_KEY} for d in doc["devices"]]


def test_the_nvml_child_encodes_each_gpus_health_answers_once():
    """The child reports the answers so far after each GPU (kept if a later GPU hangs). Each
    report re-encoded every GPU before it: 36 GPUs' answers encoded for an 8-GPU node, and
    the parent decoded them all. Packed reports carry each GPU's answers encoded once, and
    unpack to the document the old report was, at every step of the health pass and of the
    telemetry pass after it."""
    sent: list[str] = []
    packer = gpu_mod._Packer(lambda report: sent.append(json.dumps(report)))
    doc: dict = {"driver_version": "535.129.03", "device_count": 8, "devices": []}
    encodes = []
    real_dumps = json.dumps
    saved_dumps = gpu_mod.json_dumps

    def counting(obj, *args, **kwargs):
        if isinstance(obj, dict) and "index" in obj:  # one GPU's answers
            encodes.append(obj["index"])
        return real_dumps(obj, *args, **kwargs)

    for device in _fixture_devices():
        gpu_mod.json_dumps = counting
        try:
            packer(doc)
        finally:
            gpu_mod.json_dumps = saved_dumps
        assert gpu_mod.unpack_report(json.loads(sent[-1])) == json.loads(json.dumps(doc))
        doc["devices"].append(device)
    assert encodes == list(range(7))  # each GPU once (the 8th is in the answer only)
    # The telemetry pass changes every GPU's answers: each report is whole again.
    for d in doc["devices"]:
        d[TELEMETRY_KEY] = dict(gpu_mod.UNANSWERED)
    for d in doc["devices"]:
        packer(doc)
        assert gpu_mod.unpack_report(json.loads(sent[-1])) == json.loads(json.dumps(doc))
        d[TELEMETRY_KEY] = {"power_mw": 71000}
    assert gpu_mod.unpack_report({gpu_mod.PACKED: ["{not json"]}) is None
    assert gpu_mod.unpack_report({"device_count": 2, "devices": []}) == {"device_count": 2,
                                                                         "devices": []}


def test_the_own_binding_reads_without_pynvml_or_ctypes_util(stub_dir):
    """What the binding is for: a job start's NVML child never imports pynvml (125 M
    instructions) nor ctypes.util (find_library runs ldconfig); the telemetry pass does."""
    code = ("import json, sys\n"
            "from rsc_health.collect.gpu import NvmlBackend\n"
            "doc = NvmlBackend(binding='own').read()\n"
            "own = sorted(m for m in ('pynvml', 'ctypes.util') if m in sys.modules)\n"
            "NvmlBackend(binding='own', telemetry=True).read()\n"
            "print(json.dumps([doc['device_count'], own, 'pynvml' in sys.modules]))\n")
    env = {k: v for k, v in os.environ.items() if k != "NVML_STUB"}
    env.update(PYTHONPATH=str(REPO), LD_LIBRARY_PATH=str(nvml_stub.build(stub_dir)))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=60, check=True)
    assert json.loads(out.stdout) == [8, [], True]


def test_a_garbled_list_count_is_a_checker_error_for_that_field_not_gigabytes(stub_dir):
    """A driver that answers billions of retired pages or compute processes had the own binding
    ask room for twice that (a 32 GB buffer for the library to fill, in the NVML child of every
    job start). Past MAX_LIST_ENTRIES (65,536; the stub says 100,000, which the old code took
    whole) the field is INSUFFICIENT_SIZE; the GPU's other answers, and the other GPUs, stand."""
    code = """
import json, os, sys
from rsc_health.collect.gpu import NvmlBackend
os.environ["NVML_STUB"] = "count=2 procs=100000 pages=100000"
print(json.dumps(NvmlBackend(binding="own").read()))
"""
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "NVML_STUB")}
    env.update(PYTHONPATH=str(REPO), LD_LIBRARY_PATH=str(nvml_stub.build(stub_dir)))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=60, check=True)
    doc = json.loads(out.stdout)
    assert len(doc["devices"]) == 2
    for gpu in doc["devices"]:
        assert gpu["processes"] == {"error": "NVML_ERROR_INSUFFICIENT_SIZE"}
        assert gpu["uuid"].startswith("GPU-") and isinstance(gpu["temperature"], int)
        assert "error" in str(gpu["retired_pages"])


CRASH_READ = """
import ctypes, json, sys
from pathlib import Path
from rsc_health.checks.state import NodeState
from rsc_health.collect import node, nvmlc
from rsc_health.config import load_config
if sys.argv[2] == "own-crashes":
    # A layout slip on a driver the binding was never run against: the call segfaults.
    nvmlc.nvmlDeviceGetTemperature = lambda handle, sensor: ctypes.string_at(0)
state = NodeState()
node.read_nvml(load_config(sys.argv[1]), Path("/"), state, {})
print(json.dumps({"answers": state.nvml_answers, "hung": state.hung_probes,
                  "errors": state.errors}))
"""


def _crash_read(stub_dir, tmp_path, binding: str, how: str, stub: str = "") -> dict:
    site = tmp_path / "site.toml"
    site.write_text(f'[gpu]\ncount = 8\nbackend = "nvml"\nnvml_binding = "{binding}"\n'
                    'nvml_timeout_s = 5.0\n')
    env = {k: v for k, v in os.environ.items() if k != "NVML_STUB"}
    env.update(PYTHONPATH=str(REPO), LD_LIBRARY_PATH=str(nvml_stub.build(stub_dir)),
               NVML_STUB=stub)
    out = subprocess.run([sys.executable, "-c", CRASH_READ, str(site), how], env=env,
                         capture_output=True, text=True, timeout=60, check=True)
    return json.loads(out.stdout)


def test_an_own_binding_that_crashes_is_asked_again_through_pynvml_not_counted_a_hang(
        stub_dir, tmp_path):
    """The own binding segfaults in its child (a layout slip on a driver it was never run
    against). Before, a child that died without an answer read as NVML hung: every GPU after
    the crash unjudged on every job start, and nvml_hang_sweeps sweeps of "hangs" drained a
    sound node. Now the health pass is asked again through pynvml at once (all 8 GPUs judged),
    the crash is a loud checker error, and no hang is recorded."""
    got = _crash_read(stub_dir, tmp_path, "own", "own-crashes")
    devices = got["answers"]["devices"]
    assert len(devices) == 8 and all("error" not in d for d in devices)
    assert all(isinstance(d["temperature"], int) for d in devices)
    assert got["hung"] == {}
    assert len(got["errors"]) == 1
    assert "own NVML binding's child died" in got["errors"][0][2]
    assert "signal 11" in got["errors"][0][2] and "pynvml" in got["errors"][0][2]


def test_an_nvml_library_that_crashes_its_child_is_a_checker_error_not_a_hang(
        stub_dir, tmp_path):
    """The driver's library itself segfaults on GPU 2 (through pynvml, nothing to fall back
    to): GPUs 0-1 keep their answers (a GPU lost before the crash still drains), 2-7 are
    unanswered (checker errors), the crash is said with its signal, and no hang is recorded:
    a crashing checker never counts toward nvml_hang_sweeps."""
    got = _crash_read(stub_dir, tmp_path, "pynvml", "as-is",
                      stub="crash=nvmlDeviceGetTemperature:2")
    devices = got["answers"]["devices"]
    assert [d.get("error") for d in devices] == [None, None] + ["NVML_ERROR_TIMEOUT"] * 6
    assert got["hung"] == {}
    assert [e[:2] for e in got["errors"]] == [["gpu", "nvml"]]
    assert "NVML's child died" in got["errors"][0][2] and "signal 11" in got["errors"][0][2]


@pytest.mark.parametrize("binding", ["own", "pynvml"])
def test_a_garbled_device_count_is_a_checker_error_not_an_nvml_hang(stub_dir, tmp_path, binding):
    """A driver that says 4,294,967,295 GPUs: the child asked for each one's handle until
    nvml_timeout_s, the parent waited out the whole timeout at every job start, and the read
    was recorded as NVML hung (toward nvml_hang_sweeps' drain) with a report of hundreds of
    thousands of unanswered GPUs. The count is past what parse_answers accepts (1,024):
    nothing is asked past it, the answers say the count, no hang is recorded."""
    import time

    t0 = time.monotonic()
    got = _crash_read(stub_dir, tmp_path, binding, "as-is", stub="saycount=4294967295")
    took = time.monotonic() - t0
    assert got["hung"] == {}
    assert got["answers"]["device_count"] == 4294967295
    assert got["answers"]["devices"] == []
    assert took < 4.0, took  # nvml_timeout_s is 5 s
    from rsc_health.collect import gpu

    assert gpu.parse_answers(got["answers"]).malformed == "device_count '4294967295'"
