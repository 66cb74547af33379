"""The NVLink fabric of an NVSwitch system (HGX/DGX A100, H100, H200): the Fabric Manager
service and each GPU's fabric state as NVML answers it.

On an NVSwitch system a GPU joins the fabric only once Fabric Manager has trained it; with FM
down, CUDA on that GPU fails to initialise (cudaErrorSystemNotReady) and an FM that died after
training leaves the next fabric event unhandled. Neither shows in the GPU's other answers,
which is how an FM down for weeks goes unnoticed. Two looks:

- the service: `systemctl is-active <[fabric] manager_unit>`, bounded (`[fabric] timeout_s`),
  only where the node has NVSwitches: `[fabric] nvswitch = "auto"` finds them as NVIDIA PCI
  devices of class 0x0680 (bridge, other) under /sys/bus/pci/devices, "yes"/"no" say so;
- the GPUs: nvmlDeviceGetGpuFabricInfoV (collect.gpu) on every GPU that has a fabric (state
  NOT_SUPPORTED, or the call answering NOT_SUPPORTED, is a GPU without one: PCIe cards, pre-
  Hopper, no NVSwitch): NOT_STARTED drains after the job, IN_PROGRESS warns (training at boot),
  COMPLETED with a status other than success drains after the job, and the health mask
  (R550+) names a degraded bandwidth (warn) or an unhealthy route (drain after the job).
Nothing here is a repair: a restarted FM and a retrained fabric are seen by the next sweep.
"""

from __future__ import annotations

import os

from rsc_health.checks import _program
from rsc_health.checks._finding import checker_error, fail, ok, readable_gpus, warn
from rsc_health.checks.env import replayed
from rsc_health.collect.gpu import FABRIC_STATES, NVML_ERROR_NAMES, err
from rsc_health.collect.sysfs import read_text
from rsc_health.model import Finding, Severity

TYPE_CHECKING = False  # typing's, without importing typing: every job start loads this
if TYPE_CHECKING:
    from _typeshed import StrPath  # str | os.PathLike[str]

FAMILY = "fabric"
READS = ("sys/bus/pci/devices/*/class", "sys/bus/pci/devices/*/vendor")
NVIDIA = "0x10de"
NVSWITCH_CLASS = "0x0680"  # PCI class "bridge, other": how an NVSwitch enumerates
# nvmlGpuFabricInfo_v2 healthMask fields (nvml.h NVML_GPU_FABRIC_HEALTH_MASK_*): (shift, what
# the value 1 ("true") means, severity).
HEALTH_BITS = (
    (0, "bandwidth degraded", Severity.WARN),
    (2, "route recovery in progress", Severity.WARN),
    (4, "route unhealthy", Severity.DRAIN_AFTER_JOB),
    (6, "access timeout recovery in progress", Severity.WARN),
)


def nvswitches(root: StrPath) -> list[str]:
    """The NVSwitches' PCI addresses, from sysfs."""
    found = []
    base = os.path.join(root, "sys/bus/pci/devices")
    try:
        devices = sorted(os.listdir(base))[:4096]
    except OSError:
        return []
    for name in devices:
        dev = os.path.join(base, name)
        cls = read_text(os.path.join(dev, "class"))
        vendor = read_text(os.path.join(dev, "vendor"))
        if vendor == NVIDIA and cls is not None and cls.startswith(NVSWITCH_CLASS):
            found.append(name)
    return found


def collect(root: StrPath, env) -> dict:
    doc = replayed(root, env.cfg, "fabric", "the fabric")
    return doc if doc is not None else record(root, env.cfg, env.deadline)


def capture(cfg, root: StrPath, env) -> dict:
    return {"fabric_record": record(root, cfg, None)}


def record(root: StrPath, cfg, deadline: float | None) -> dict:
    mode = str(cfg.get("fabric.nvswitch"))
    switches = nvswitches(root) if mode == "auto" else []
    doc: dict = {"mode": mode, "nvswitches": switches, "manager": None}
    if mode == "yes" or (mode == "auto" and switches):
        unit = str(cfg.get("fabric.manager_unit"))
        doc["manager"] = _program.run(
            root, str(cfg.get("fabric.systemctl")), ["is-active", unit],
            timeout_s=float(cfg.get("fabric.timeout_s")), deadline=deadline, max_bytes=4096)
        doc["manager"]["unit"] = unit
    return doc


def check(state, cfg: dict) -> list[Finding]:
    rec = state.extra.get(FAMILY)
    if not isinstance(rec, dict):
        return []
    out: list[Finding] = []
    manager = rec.get("manager")
    if manager is not None:
        out.extend(_manager(manager))
    fabric_gpus = 0
    for g, comp in readable_gpus(state):
        answer = g.answers.get("fabric") if isinstance(g.answers, dict) else None
        if answer is None or err(answer):
            continue  # absent; an error other than absent is the gpu family's to say
        if not isinstance(answer, dict) or answer.get("state") not in FABRIC_STATES:
            out.append(checker_error(FAMILY, comp, f"{comp} fabric state not one NVML "
                                     f"gives: {str(answer)[:80]}"))
            continue
        if answer["state"] == 0:  # NVML_GPU_FABRIC_STATE_NOT_SUPPORTED
            continue
        fabric_gpus += 1
        out.extend(_gpu(comp, answer))
    if manager is None and not fabric_gpus:
        out.append(ok(FAMILY, "fabric", "no NVSwitch fabric on this node: nothing to judge"))
    elif not [f for f in out if f.severity > Severity.NONE or f.family != FAMILY]:
        out.append(ok(FAMILY, "fabric", f"fabric manager active, {fabric_gpus} GPU(s) "
                      "trained into the fabric"))
    return out


def _manager(rec: dict) -> list[Finding]:
    unit = str(rec.get("unit") or "nvidia-fabricmanager")
    why = _program.trouble(rec, f"systemctl is-active {unit}")
    if why:
        return [checker_error(FAMILY, unit, why)]
    words = str(rec.get("stdout", "")).split()
    answer = words[0] if words else ""
    if answer == "active":
        return []
    if answer in ("activating", "reloading", "refreshing"):
        return [warn(FAMILY, unit, "fabric_manager_starting", f"{unit} is {answer}",
                     answer=answer)]
    shown = "".join(c for c in answer if c.isprintable())[:32] or "no answer"
    return [fail(FAMILY, unit, Severity.DRAIN_AFTER_JOB, "fabric_manager_down",
                 f"{unit} is {shown} on an NVSwitch system: new CUDA jobs cannot use the "
                 "fabric", repair=False, answer=shown, returncode=rec.get("returncode"))]


def _gpu(comp: str, answer: dict) -> list[Finding]:
    state = answer["state"]
    data = {"state": FABRIC_STATES[state], "clique_id": answer.get("clique_id"),
            "cluster_uuid": answer.get("cluster_uuid")}
    if state == 1:
        return [fail(FAMILY, comp, Severity.DRAIN_AFTER_JOB, "fabric_not_started",
                     f"{comp} not trained into the NVLink fabric (Fabric Manager has not "
                     "started it)", repair=False, **data)]
    if state == 2:
        return [warn(FAMILY, comp, "fabric_in_progress",
                     f"{comp} NVLink fabric training in progress", **data)]
    status = answer.get("status")
    if isinstance(status, bool) or not isinstance(status, int):
        return [checker_error(FAMILY, comp, f"{comp} fabric status {str(status)[:40]!r} is "
                              "not an NVML return code")]
    if status != 0:
        name = NVML_ERROR_NAMES.get(status, f"NVML_ERROR_{status}")
        return [fail(FAMILY, comp, Severity.DRAIN_AFTER_JOB, "fabric_failed",
                     f"{comp} NVLink fabric training finished with {name}", repair=False,
                     status=name, **data)]
    out: list[Finding] = []
    mask = answer.get("health_mask")
    if isinstance(mask, int) and not isinstance(mask, bool) and 0 <= mask < 2**32:
        for shift, what, severity in HEALTH_BITS:
            if (mask >> shift) & 0x3 == 1:
                if severity is Severity.WARN:
                    out.append(warn(FAMILY, comp, "fabric_degraded", f"{comp} fabric {what}",
                                    health_mask=mask, **data))
                else:
                    out.append(fail(FAMILY, comp, severity, "fabric_unhealthy",
                                    f"{comp} fabric {what}", repair=False, health_mask=mask,
                                    **data))
    return out

