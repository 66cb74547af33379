"""XID events: each new event is judged by the catalog (see rsc_health/xid_catalog.toml)."""

from __future__ import annotations

from rsc_health.checks._finding import fail, ok, warn
from rsc_health.model import Finding, Severity, Status


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
            if g.pci_bus_id:
                out[_pci_key(g.pci_bus_id)] = f"gpu{g.index}"
    return out


def check(state, cfg: dict) -> list[Finding]:
    catalog = cfg["xid_catalog"]
    by_pci = gpu_by_pci(state)
    out: list[Finding] = []
    for ev in state.xid_events:
        rule = catalog.rule(ev.xid, ev.severity)
        comp = by_pci.get(_pci_key(ev.pci), ev.pci)
        text = f"{comp} XID {ev.xid} {rule.name}"
        if ev.severity:
            text += f" ({ev.severity})"
        data = {"xid": ev.xid, "pci": ev.pci, "message": ev.message[:200], "pid": ev.pid,
                "process": ev.process, "line_severity": ev.severity, "source": ev.source}
        if rule.severity >= Severity.DRAIN_AFTER_JOB:
            out.append(fail("xid", comp, rule.severity, f"xid{ev.xid}", text,
                            repair=rule.repair, **data))
        elif rule.severity is Severity.WARN:
            out.append(warn("xid", comp, f"xid{ev.xid}", text, **data))
        else:
            out.append(Finding("xid", comp, Status.OK, Severity.NONE, text, f"xid{ev.xid}",
                               data=data))
    if not out:
        out.append(ok("xid", "kernel log", "no new XID events"))
    return out
