"""NVSwitch SXid events: each new `nvidia-nvswitchN: SXid (PCI:...): NNNNN, ...` line in the
kernel log is judged by the SXid catalog (rsc_health/sxid_catalog.toml: the Fabric Manager
User Guide's non-fatal, fatal and always-fatal groups; a fatal one drains, a non-fatal one
warns). The lines are read by the kernel-log reader the xid family uses (collect.kmsg), from
the same `[xid] sources`, past a cursor of its own (sxid_cursor.json): a prolog that judges
XIDs but not SXids never consumes an SXid line, and no line is counted twice across sweeps.
On a machine without NVSwitches there are no such lines: one all-clear finding."""

from __future__ import annotations

from rsc_health.checks._finding import fail, ok, warn
from rsc_health.collect import klog, kmsg
from rsc_health.model import Finding, Severity, Status

TYPE_CHECKING = False  # typing's, without importing typing: every job start loads this
if TYPE_CHECKING:
    from _typeshed import StrPath  # str | os.PathLike[str]

FAMILY = "sxid"
READS_CONFIG = ("xid.sources",)


def collect(root: StrPath, env) -> kmsg.XidRead | None:
    read = env.guard(FAMILY, "kernel log", lambda: klog.read(
        root, env, FAMILY, parse=kmsg.parse_sxid_line, event=kmsg.SxidEvent))
    if read is not None:
        # The shared reader names its cursor after XIDs; this one is the SXid cursor.
        env.state.errors.extend((FAMILY, "kernel log", e.replace("XID cursor", "SXid cursor"))
                                for e in read.errors)
    return read


def check(state, cfg: dict) -> list[Finding]:
    catalog = cfg["sxid_catalog"]
    read = state.extra.get(FAMILY)
    events = list(read.events) if read is not None else []
    # One error prints a first line (with Fatal / Non-fatal) and detail lines ("Severity N
    # Engine instance ...", "Data {...}") under the same switch and code: the detail lines are
    # counted with it, and judged on their own only when their first line is not in this read.
    heads = {(ev.switch, ev.sxid) for ev in events if not ev.detail}
    groups: dict[tuple[int, int, str | None], list] = {}
    details: dict[tuple[int, int], int] = {}
    for ev in events:
        if ev.detail and (ev.switch, ev.sxid) in heads:
            details[(ev.switch, ev.sxid)] = details.get((ev.switch, ev.sxid), 0) + 1
            continue
        groups.setdefault((ev.switch, ev.sxid, ev.severity), []).append(ev)
    out: list[Finding] = []
    for (switch, code, line_sev), evs in sorted(groups.items(), key=lambda kv: (
            kv[0][0], kv[0][1], kv[0][2] or "")):
        ev = evs[0]
        rule = catalog.rule(code, line_sev)
        comp = f"nvswitch{switch}"
        text = f"{comp} SXid {code} {rule.name}"
        if line_sev:
            text += f" ({'Fatal' if line_sev == 'fatal' else 'Non-fatal'})"
        if len(evs) > 1:
            text += f" x{len(evs)}"
        data = {"sxid": code, "pci": ev.pci, "message": ev.message[:200],
                "line_severity": line_sev, "source": ev.source, "count": len(evs),
                "detail_lines": details.get((switch, code), 0)}
        key = kmsg.event_key(e.key for e in evs)
        if key:
            data["event_key"] = key
        fcode = f"sxid{code}"
        if rule.severity >= Severity.DRAIN_AFTER_JOB:
            out.append(fail(FAMILY, comp, rule.severity, fcode, text, repair=rule.repair, **data))
        elif rule.severity is Severity.WARN:
            out.append(warn(FAMILY, comp, fcode, text, **data))
        else:
            out.append(Finding(FAMILY, comp, Status.OK, Severity.NONE, text, fcode, data=data))
    if not out:
        out.append(ok(FAMILY, "kernel log", "no new NVSwitch SXid events"))
    return out
