"""PCIe links from sysfs: GPUs, NICs and the bridges above them.

`/sys/bus/pci/devices/<bdf>` is a symlink into `/sys/devices/pci<dom>:<bus>/<bridge>/.../<bdf>`,
so the bridges above a device are the PCI addresses on its resolved path. Formats (kernel
Documentation/ABI/testing/sysfs-bus-pci and drivers/pci/pci-sysfs.c): `class` = `0x030200`,
`current_link_speed` = `16.0 GT/s PCIe` (older kernels: `16 GT/s`), `current_link_width` = `16`,
`aer_dev_fatal` = lines `Undefined 0` ... `TOTAL_ERR_FATAL 0`.

A width or speed the kernel never prints (`-4`, `1e30`, `x16junk`, `99 GT/s`) is kept as read in
`unreadable` and judged by nobody: the check says it as a checker error, never a drain.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from rsc_health.collect.sysfs import parse_count, parse_counters, read_text

GPU_CLASSES = ("0x030200", "0x030000")  # 3D controller, VGA controller
NIC_CLASSES = ("0x020700", "0x020000")  # InfiniBand, Ethernet
_BDF = re.compile(r"^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
_SPEED = re.compile(r"\s*(\d+(?:\.\d+)?) GT/s(?: PCIe)?\s*")
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


def read_device(path: Path, bdf: str, kind: str) -> PcieDevice:
    dev = PcieDevice(bdf=bdf, kind=kind, pci_class=read_text(path / "class"))

    def attr(name: str, parse, unknown: tuple[str, ...] = ()):
        text = read_text(path / name)
        value = parse(text)
        if value is None and text is not None and text not in unknown:
            dev.unreadable[name] = text[:40]
        return value

    dev.speed_gts = attr("current_link_speed", parse_speed, UNKNOWN_SPEED)
    dev.max_speed_gts = attr("max_link_speed", parse_speed, UNKNOWN_SPEED)
    dev.width = attr("current_link_width", parse_width)
    dev.max_width = attr("max_link_width", parse_width)
    for fname, total in AER_TOTALS.items():
        counters = parse_counters(read_text(path / fname))
        if total in counters:
            dev.aer[fname.removeprefix("aer_dev_")] = counters[total]
    return dev


def collect(root: Path) -> list[PcieDevice]:
    base = root / "sys/bus/pci/devices"
    try:
        entries = sorted(base.iterdir())
    except OSError:
        return []
    devices: dict[str, PcieDevice] = {}
    for entry in entries:
        pci_class = (read_text(entry / "class") or "").lower()
        kind = "gpu" if pci_class in GPU_CLASSES else "nic" if pci_class in NIC_CLASSES else ""
        if not kind:
            continue
        devices[entry.name] = read_device(entry, entry.name, kind)
        try:
            resolved = entry.resolve()
        except OSError:
            continue
        # Ancestors on the resolved path that look like PCI addresses are the bridges above.
        for part in resolved.parent.parts:
            if not _BDF.match(part):
                continue
            bridge = devices.get(part)
            if bridge is None:
                bridge_path = base / part
                bridge = read_device(bridge_path, part, "bridge")
                devices[part] = bridge
            if bridge.kind == "bridge":
                bridge.parent_of.append(entry.name)
    return list(devices.values())
