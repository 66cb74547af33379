"""PCIe links of GPUs, NICs and the bridges above them.

Width: a link that trained to fewer lanes than it supports stays that way until reset
(downtrained, drain after the job). Speed: judged on NICs only (`pcie_speed`, drain after the
job). GPUs drop their link to Gen1 when idle to save power (ASPM/dynamic link speed), and the
bridges above them follow, so on those current < max speed is normal and says nothing; a
ConnectX HCA keeps its link at full speed, so a slower NIC link is a bad riser or slot.
What a link supports is the lesser of its two ends': the kernel's max_link_* is one device's
own Link Capabilities, and a Gen5 x16 card under a Gen4 port (or in a slot wired x8) trains at
the best the port allows, for ever, which is no fault. So an endpoint is judged against the
lesser of its own and the port's directly above it, and that port against the lesser of its
own and the endpoint's below it (`_link_partners`).
AER: any fatal error since boot drains now; non-fatal errors rising between sweeps drain
after the job; correctable ones only warn. A width or speed the kernel never prints is a
checker error (the collector keeps it in `unreadable`), never a drain.

The whole family lives here: what it reads (`collect`: sysfs under the node's root, and NVML's
PCIe replay counter of each GPU, through the registry's nvml=True), its counters and its policy.

`/sys/bus/pci/devices/<bdf>` is a symlink into `/sys/devices/pci<dom>:<bus>/<bridge>/.../<bdf>`,
so the bridges above a device are the PCI addresses on its resolved path. Formats (kernel
Documentation/ABI/testing/sysfs-bus-pci and drivers/pci/pci-sysfs.c): `class` = `0x030200`,
`current_link_speed` = `16.0 GT/s PCIe` (older kernels: `16 GT/s`), `current_link_width` = `16`,
`aer_dev_fatal` = lines `Undefined 0` ... `TOTAL_ERR_FATAL 0`.
"""

from __future__ import annotations

import errno
import os

from rsc_health import lazyre
from rsc_health.checks._finding import checker_error, fail, ok, warn
from rsc_health.collect.counters import per_sweep, plausible
from rsc_health.collect.gpu import val
from rsc_health.collect.sysfs import parse_count, parse_counters, read_text
from rsc_health.model import Finding, Severity
from rsc_health.record import dataclass, field

TYPE_CHECKING = False  # typing's, without importing typing: every job start loads this
if TYPE_CHECKING:
    from _typeshed import StrPath  # str | os.PathLike[str]

GPU_CLASSES = ("0x030200", "0x030000")  # 3D controller, VGA controller
NIC_CLASSES = ("0x020700", "0x020000")  # InfiniBand, Ethernet
_BDF = lazyre.compile(r"^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
_SPEED = lazyre.compile(r"\s*(\d+(?:\.\d+)?) GT/s(?: PCIe)?\s*")
# What the kernel prints: the negotiated width field of the Link Status register (x0 when the
# link is down), and pci_speed_string()'s rates (Gen1-Gen6) or "Unknown" (older: "Unknown speed").
LINK_WIDTHS = frozenset((0, 1, 2, 4, 8, 12, 16, 32))
LINK_SPEEDS = frozenset((2.5, 5.0, 8.0, 16.0, 32.0, 64.0))
UNKNOWN_SPEED = ("Unknown", "Unknown speed")
AER_TOTALS = {
    "aer_dev_correctable": "TOTAL_ERR_COR",
    "aer_dev_nonfatal": "TOTAL_ERR_NONFATAL",
    "aer_dev_fatal": "TOTAL_ERR_FATAL",
}
ATTRS = ("class", "current_link_speed", "max_link_speed", "current_link_width",
         "max_link_width", *AER_TOTALS)
# What a snapshot carries: every PCI function's attributes read below (a symlink on the way,
# such as sys/bus/pci/devices/<bdf>, as a link, so the bridges above a device replay too).
READS = tuple(f"sys/bus/pci/devices/*/{attr}" for attr in ATTRS)


@dataclass
class PcieDevice:
    bdf: str
    kind: str  # gpu | nic | bridge
    pci_class: str | None
    speed_gts: float | None = None
    max_speed_gts: float | None = None
    width: int | None = None
    max_width: int | None = None
    aer: dict[str, int] = field(default_factory=dict)  # correctable/nonfatal/fatal totals
    parent_of: list[str] = field(default_factory=list)  # for bridges: the endpoints below
    upstream: str | None = None  # for endpoints: the port directly above, its link's other end
    unreadable: dict[str, str] = field(default_factory=dict)  # attribute -> what it said


def parse_speed(text: str | None) -> float | None:
    """GT/s of a link speed the kernel prints ("16.0 GT/s PCIe", older "16 GT/s"), else None."""
    m = _SPEED.fullmatch(text or "")
    speed = float(m.group(1)) if m else None
    return speed if speed in LINK_SPEEDS else None


def parse_width(text: str | None) -> int | None:
    """A link width the kernel prints ("16"), else None: parse_int would read "1e30" as 1."""
    width = parse_count(text)
    return width if width in LINK_WIDTHS else None


def read_device(path: StrPath, bdf: str, kind: str) -> PcieDevice:
    dev = PcieDevice(bdf=bdf, kind=kind, pci_class=read_text(os.path.join(path, "class")))

    def attr(name: str, parse, unknown: tuple[str, ...] = ()):
        text = read_text(os.path.join(path, name))
        value = parse(text)
        if value is None and text is not None and text not in unknown:
            dev.unreadable[name] = text[:40]
        return value

    dev.speed_gts = attr("current_link_speed", parse_speed, UNKNOWN_SPEED)
    dev.max_speed_gts = attr("max_link_speed", parse_speed, UNKNOWN_SPEED)
    dev.width = attr("current_link_width", parse_width)
    dev.max_width = attr("max_link_width", parse_width)
    for fname, total in AER_TOTALS.items():
        counters = parse_counters(read_text(os.path.join(path, fname)))
        if total in counters:
            dev.aer[fname.removeprefix("aer_dev_")] = counters[total]
    return dev


def collect(root: StrPath, env=None) -> list[PcieDevice]:
    base = os.path.join(root, "sys/bus/pci/devices")
    try:
        names = sorted(os.listdir(base))
    except OSError:
        return []
    devices: dict[str, PcieDevice] = {}
    for name in names:
        entry = os.path.join(base, name)
        pci_class = (read_text(os.path.join(entry, "class")) or "").lower()
        kind = "gpu" if pci_class in GPU_CLASSES else "nic" if pci_class in NIC_CLASSES else ""
        if not kind:
            continue
        devices[name] = read_device(entry, name, kind)
        try:
            resolved = _resolve(entry)
        except OSError:
            continue
        # Ancestors on the resolved path that look like PCI addresses are the bridges above;
        # the last of them is the port at the other end of the device's link.
        for part in os.path.dirname(resolved).split("/"):
            if not part or not _BDF.match(part):
                continue
            devices[name].upstream = part
            bridge = devices.get(part)
            if bridge is None:
                bridge_path = os.path.join(base, part)
                bridge = read_device(bridge_path, part, "bridge")
                devices[part] = bridge
            if bridge.kind == "bridge":
                bridge.parent_of.append(name)
    return list(devices.values())


def _resolve(path: str) -> str:
    """pathlib's Path.resolve() (3.10+): the real path, and a symlink loop on the way is a
    RuntimeError (the family's collector error), not a path."""
    real = os.path.realpath(path)
    try:
        os.stat(real)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise RuntimeError(f"Symlink loop from {exc.filename!r}") from None
    return real


def counters(state) -> dict[str, int]:
    """AER totals of every device, and NVML's PCIe replay counter of every GPU."""
    out: dict[str, int] = {}
    for dev in state.extra.get("pcie") or []:
        for k, v in dev.aer.items():
            out[f"aer/{dev.bdf}/{k}"] = v
    for g in state.gpu.gpus if state.gpu else []:
        v = val((g.answers.get("pcie") or {}).get("replay"))
        if isinstance(v, int):
            out[f"pcie_replay/gpu{g.index}"] = v
    return out

def check(state, cfg: dict) -> list[Finding]:
    pcfg = cfg.get("pcie", {})
    devices = state.extra.get("pcie")
    if devices is None:
        return []
    # Per counter: one a run could not read is judged over the sweeps since its baseline.
    nonfatal_per = int(pcfg.get("aer_nonfatal_per_sweep", 0))
    cor_per = int(pcfg.get("aer_correctable_per_sweep", 100))
    out: list[Finding] = []
    partner = _link_partners(devices)
    for dev in devices:
        comp = dev.bdf
        before = len(out)
        for name, text in dev.unreadable.items():
            out.append(checker_error("pcie", comp, f"pcie: cannot read {comp} {name}: {text!r} "
                                                   f"is not a value the kernel prints"))
        other = partner.get(comp)
        max_width = _lesser(dev.max_width, other.max_width if other else None)
        max_speed = _lesser(dev.max_speed_gts, other.max_speed_gts if other else None)
        if dev.width and max_width and dev.width < max_width:
            out.append(
                fail("pcie", comp, Severity.DRAIN_AFTER_JOB, "pcie_downtrained",
                     f"{comp} ({dev.kind}) link x{dev.width}, capable of x{max_width}",
                     repair=True, width=dev.width, max_width=max_width, kind=dev.kind)
            )
        if (dev.kind == "nic" and pcfg.get("judge_nic_speed", True) and dev.speed_gts
                and max_speed and dev.speed_gts < max_speed):
            out.append(
                fail("pcie", comp, Severity.DRAIN_AFTER_JOB, "pcie_speed",
                     f"{comp} (nic) link at {dev.speed_gts:g} GT/s, capable of "
                     f"{max_speed:g}", repair=True, speed_gts=dev.speed_gts,
                     max_speed_gts=max_speed, kind=dev.kind)
            )
        fatal = dev.aer.get("fatal", 0)
        if plausible(fatal) and fatal > 0:  # an implausible one is a checker error (collect)
            out.append(
                fail("pcie", comp, Severity.DRAIN_NOW, "aer_fatal",
                     f"{comp} ({dev.kind}) {dev.aer['fatal']} fatal AER errors since boot",
                     repair=True, kind=dev.kind, **dev.aer)
            )
        nonfatal = state.deltas.get(f"aer/{comp}/nonfatal", 0)
        nonfatal_limit, since = per_sweep(nonfatal_per, state, "pcie", f"aer/{comp}/nonfatal")
        if nonfatal > nonfatal_limit:
            out.append(
                fail("pcie", comp, Severity.DRAIN_AFTER_JOB, "aer_nonfatal",
                     f"{comp} ({dev.kind}) +{nonfatal} non-fatal AER errors {since}",
                     repair=True, delta=nonfatal)
            )
        cor = state.deltas.get(f"aer/{comp}/correctable", 0)
        cor_limit, since = per_sweep(cor_per, state, "pcie", f"aer/{comp}/correctable")
        if cor > cor_limit:
            out.append(
                warn("pcie", comp, "aer_correctable",
                     f"{comp} ({dev.kind}) +{cor} correctable AER errors {since}",
                     delta=cor)
            )
        if len(out) == before and dev.kind != "bridge":
            link = f"x{dev.width}" if dev.width else "link width unknown,"
            out.append(ok("pcie", comp, f"{comp} ({dev.kind}) {link} ok"))
    out.extend(_gpu_replays(state, int(pcfg.get("replays_per_sweep", 100))))
    return out


def _link_partners(devices: list[PcieDevice]) -> dict[str, PcieDevice]:
    """{bdf: the device at the other end of its link}: an endpoint's is the port directly
    above it, and that port's is the endpoint (the functions of one card below a port share
    its link). Bridges above a switch's ports have none here: their link's other end is not
    told apart from a switch's internal bus without the PCIe capability's port type."""
    by_bdf = {d.bdf: d for d in devices}
    out: dict[str, PcieDevice] = {}
    for dev in devices:
        port = by_bdf.get(dev.upstream) if dev.upstream else None
        if port is None:
            continue
        out[dev.bdf] = port
        out.setdefault(port.bdf, dev)
    return out


def _lesser(own: float | None, other: float | None):
    """A link's capability: the lesser of its two ends', or its own where the other end's is
    unknown (unread, "Unknown", garbled); None where its own is (nothing to judge against)."""
    return own if own is None or other is None else min(own, other)


def _gpu_replays(state, per: int) -> list[Finding]:
    """NVML's PCIe replay counter (link-level retries): a rising count is a marginal link."""
    out = []
    for g in state.gpu.gpus if state.gpu else []:
        key = f"pcie_replay/gpu{g.index}"
        d = state.deltas.get(key, 0)
        limit, since = per_sweep(per, state, "pcie", key)
        if d > limit:
            out.append(
                fail("pcie", f"gpu{g.index}", Severity.DRAIN_AFTER_JOB, "pcie_replay",
                     f"gpu{g.index} +{d} PCIe replays {since} (limit {limit:g})",
                     repair=True, delta=d, bus_id=g.pci_bus_id)
            )
    return out
