"""XID events: each new event in the kernel log is judged by the catalog (see
rsc_health/xid_catalog.toml); the driver's own line for a GPU it could not initialise (no Xid
line comes with it) is judged here (gpu_init_failed). The kernel log is read by the shared
reader (collect.kmsg) from `[xid] sources`, past the cursor the engine keeps; NVML (the
registry's nvml=True) maps each event's PCI address to its gpuN."""

from __future__ import annotations

from rsc_health.checks._finding import fail, ok, warn
from rsc_health.collect import klog, kmsg
from rsc_health.model import Finding, Severity, Status

TYPE_CHECKING = False  # typing's, without importing typing: every job start loads this
if TYPE_CHECKING:
    from _typeshed import StrPath  # str | os.PathLike[str]

READS_CONFIG = ("xid.sources",)


def collect(root: StrPath, env) -> kmsg.XidRead | None:
    """The events since the cursor and the cursor to save once they are judged; the reader's
    complaints (a FIFO source, lost records, a backlog) are checker findings."""
    read = env.guard("xid", "kernel log", lambda: klog.read(root, env, "xid"))
    if read is not None:
        env.state.errors.extend(("xid", "kernel log", e) for e in read.errors)
    return read


def _pci_key(bus_id: str) -> str:
    """NVML "00000000:3B:00.0" and the driver's "0000:3b:00" both -> "3b:00" + domain."""
    bus_id = bus_id.lower().split(".")[0]
    dom, _, rest = bus_id.partition(":")
    if dom and all(c in "0123456789abcdef" for c in dom):
        return f"{int(dom, 16):x}:{rest}"
    return bus_id


def gpu_by_pci(state) -> dict[str, str]:
    out = {}
    if state.gpu:
        for g in state.gpu.gpus:
            if isinstance(g.pci_bus_id, str) and g.pci_bus_id:  # a garbled answer: no name
                out[_pci_key(g.pci_bus_id)] = f"gpu{g.index}"
    return out


def check(state, cfg: dict) -> list[Finding]:
    catalog = cfg["xid_catalog"]
    by_pci = gpu_by_pci(state)
    # One finding per GPU, XID and line severity: an application storm of 500 XID 13 lines is
    # one WARN with a count, not 500 rows (the first event's details are kept).
    groups: dict[tuple[str, int, str | None, str | None], list] = {}
    read = state.extra.get("xid")
    events = read.events if read is not None else []
    located = [(by_pci.get(_pci_key(ev.pci), ev.pci), ev) for ev in events]
    # The driver's "GPU has fallen off the bus." line stands for an XID 79 only where it
    # printed none: with both, one event.
    xid79 = {comp for comp, ev in located
             if ev.xid == kmsg.GPU_LOST_XID and ev.message != kmsg.GPU_LOST_MESSAGE}
    located = [(comp, ev) for comp, ev in located
               if ev.message != kmsg.GPU_LOST_MESSAGE or comp not in xid79]
    for comp, ev in _latest_recovery_only(located):
        groups.setdefault((comp, ev.xid, ev.severity, ev.recovery), []).append(ev)
    out: list[Finding] = []
    for (comp, xid, line_sev, recovery), events in groups.items():
        ev = events[0]
        if xid == kmsg.INIT_FAILED_XID:
            out.append(_init_failed(comp, events))
            continue
        rule = catalog.rule(xid, line_sev, recovery)
        text = f"{comp} XID {xid} {rule.name}"
        if line_sev:
            text += f" ({line_sev})"
        if recovery:
            text += f" to {recovery.replace('_', ' ')}"
        if len(events) > 1:
            text += f" x{len(events)}"
        data = {"xid": xid, "pci": ev.pci, "message": ev.message[:200], "pid": ev.pid,
                "process": ev.process, "line_severity": line_sev, "source": ev.source,
                "count": len(events)}
        if recovery:
            data["recovery_action"] = recovery
        if ev.mig:
            data["mig"] = ev.mig
        key = kmsg.event_key(e.key for e in events)
        if key:
            # The same events read again (a cursor the node could not save) give the same
            # spool record id, so the historian stores them once.
            data["event_key"] = key
        code = f"xid{xid}"
        if rule.severity >= Severity.DRAIN_AFTER_JOB:
            out.append(fail("xid", comp, rule.severity, code, text, repair=rule.repair, **data))
        elif rule.severity is Severity.WARN:
            out.append(warn("xid", comp, code, text, **data))
        else:
            out.append(Finding("xid", comp, Status.OK, Severity.NONE, text, code, data=data))
    if not out:
        out.append(ok("xid", "kernel log", "no new XID events"))
    return out


def _init_failed(comp: str, events: list) -> Finding:
    """The driver could not initialise this GPU (RmInitAdapter failed): NVML still counts it,
    no Xid line is logged, and no job can use it until it is reset or repaired. A job running
    on the node's other GPUs finishes. `comp` is the bus id as printed when NVML gave no handle
    to name it by (the usual case: such a GPU answers its handle with NVML_ERROR_UNKNOWN)."""
    ev = events[0]
    text = f"{comp} failed to initialise (the driver's {ev.message})"
    if len(events) > 1:
        text += f" x{len(events)}"
    data = {"pci": ev.pci, "message": ev.message[:200], "source": ev.source,
            "count": len(events)}
    key = kmsg.event_key(e.key for e in events)
    if key:
        data["event_key"] = key
    return fail("xid", comp, Severity.DRAIN_AFTER_JOB, "gpu_init_failed", text, repair=True,
                **data)


def _latest_recovery_only(located: list[tuple[str, object]]) -> list[tuple[str, object]]:
    """XID 154 states what a GPU needs *now*: only each GPU's last one counts (a reset that
    happened logs "... to 0x0 (None)" after the "... to 0x1 (GPU Reset Required)")."""
    last = {comp: i for i, (comp, ev) in enumerate(located) if ev.recovery is not None}
    keep = set(last.values())
    return [(c, ev) for i, (c, ev) in enumerate(located) if ev.recovery is None or i in keep]
