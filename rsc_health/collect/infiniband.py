"""InfiniBand ports from /sys/class/infiniband/<hca>/ports/<n>/ (formats from the kernel's
drivers/infiniband/core/sysfs.c, as rdma-core's ibstat reads them): `state` = `4: ACTIVE`,
`phys_state` = `5: LinkUp`, `rate` = `400 Gb/sec (4X NDR)`, `link_layer` = `InfiniBand`,
`counters/<name>` = a decimal integer."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from rsc_health.collect.sysfs import parse_count, parse_int, read_text

_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*Gb/sec")
ERROR_COUNTERS = (
    "symbol_error",
    "link_downed",
    "link_error_recovery",
    "port_rcv_errors",
    "port_rcv_remote_physical_errors",
    "port_xmit_discards",
    "local_link_integrity_errors",
    "excessive_buffer_overrun_errors",
)


@dataclass
class IbPort:
    hca: str
    port: str
    state: str | None  # "ACTIVE", "DOWN", "INIT", ...
    state_code: int | None
    phys_state: str | None  # "LinkUp", "Polling", "Disabled", ...
    rate_gbps: float | None
    link_layer: str | None
    counters: dict[str, int] = field(default_factory=dict)
    unreadable: list[str] = field(default_factory=list)  # counter files that held no count

    @property
    def name(self) -> str:
        return f"{self.hca}/{self.port}"


def _word(text: str | None) -> str | None:
    """`4: ACTIVE` -> `ACTIVE`."""
    if not text:
        return None
    return text.split(":", 1)[1].strip() if ":" in text else text.strip()


def parse_rate(text: str | None) -> float | None:
    m = _RATE.match(text or "")
    return float(m.group(1)) if m else None


def collect(root: Path) -> list[IbPort]:
    base = root / "sys/class/infiniband"
    ports: list[IbPort] = []
    try:
        hcas = sorted(p for p in base.iterdir())
    except OSError:
        return []
    for hca in hcas:
        try:
            port_dirs = sorted((hca / "ports").iterdir(), key=lambda p: p.name)
        except OSError:
            continue
        for pdir in port_dirs:
            state_text = read_text(pdir / "state")
            port = IbPort(
                hca=hca.name,
                port=pdir.name,
                state=_word(state_text),
                state_code=parse_int(state_text),
                phys_state=_word(read_text(pdir / "phys_state")),
                rate_gbps=parse_rate(read_text(pdir / "rate")),
                link_layer=read_text(pdir / "link_layer"),
            )
            for counter in ERROR_COUNTERS:
                text = read_text(pdir / "counters" / counter)
                value = parse_count(text)
                if value is not None:
                    port.counters[counter] = value
                elif text is not None:
                    port.unreadable.append(counter)
            ports.append(port)
    return ports
