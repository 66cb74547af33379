"""PCIe links from sysfs: GPUs, NICs and the bridges above them.

`/sys/bus/pci/devices/<bdf>` is a symlink into `/sys/devices/pci<dom>:<bus>/<bridge>/.../<bdf>`,
so the bridges above a device are the PCI addresses on its resolved path. Formats (kernel
Documentation/ABI/testing/sysfs-bus-pci and drivers/pci/pci-sysfs.c): `class` = `0x030200`,
`current_link_speed` = `16.0 GT/s PCIe` (older kernels: `16 GT/s`), `current_link_width` = `16`,
`aer_dev_fatal` = lines `Undefined 0` ... `TOTAL_ERR_FATAL 0`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from rsc_health.collect.sysfs import parse_counters, parse_int, read_text

GPU_CLASSES = ("0x030200", "0x030000")  # 3D controller, VGA controller
NIC_CLASSES = ("0x020700", "0x020000")  # InfiniBand, Ethernet
_BDF = re.compile(r"^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
_SPEED = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*GT/s")
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


def parse_speed(text: str | None) -> float | None:
    m = _SPEED.match(text or "")
    return float(m.group(1)) if m else None


def read_device(path: Path, bdf: str, kind: str) -> PcieDevice:
    dev = PcieDevice(bdf=bdf, kind=kind, pci_class=read_text(path / "class"))
    dev.speed_gts = parse_speed(read_text(path / "current_link_speed"))
    dev.max_speed_gts = parse_speed(read_text(path / "max_link_speed"))
    dev.width = parse_int(read_text(path / "current_link_width"))
    dev.max_width = parse_int(read_text(path / "max_link_width"))
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
