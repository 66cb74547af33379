"""One name for one GPU: its NVML index and its PCI bus id together, `gpu1 (0000:1a:00.0)`.

Findings name a GPU by index (`gpu1`, what NVML enumerates) or, when NVML cannot say which
index a bus id is (an XID from a GPU that fell off the bus), by the bus id the driver printed
(`0000:1a:00`). Each alone is half a name, and the two halves of one GPU read as two GPUs. The
node spools which bus id each index has (its heartbeat's `gpus`), the historian keeps the
latest (gpu_names), and every place that shows a GPU to a person (the report, `healthctl node`)
names it through `GpuNames.name`. Standard library only: the node path imports it.
"""

from __future__ import annotations

from rsc_health import lazyre

TYPE_CHECKING = False  # typing's, without importing typing (nor collections.abc, nor re)
if TYPE_CHECKING:
    from collections.abc import Mapping

# NVML "00000000:1A:00.0", the driver's "0000:1a:00" (XID lines), "PCI:0000:1a:00", "1a:00.0"
_BUS = lazyre.compile(r"^(?:pci:)?(?:(?P<dom>[0-9a-f]{1,8}):)?(?P<bus>[0-9a-f]{1,2}):"
                  r"(?P<dev>[0-9a-f]{1,2})(?:\.(?P<fn>[0-7]))?$")
_INDEX = lazyre.compile(r"^gpu(?P<index>\d{1,4})(?: \((?P<bus>[^)]*)\))?$")


def bus_id(text: object) -> str | None:
    """The canonical bus id `dddd:bb:dd.f` (lower case, 4-digit domain, function .0 when not
    given) of any spelling above; None for anything else."""
    if not isinstance(text, str):
        return None
    m = _BUS.match(text.strip().lower())
    if not m:
        return None
    dom = int(m["dom"] or "0", 16)
    if dom > 0xFFFF:
        return None
    return f"{dom:04x}:{int(m['bus'], 16):02x}:{int(m['dev'], 16):02x}.{m['fn'] or '0'}"


def label(index: int | None, bus: str | None) -> str:
    """`gpu1 (0000:1a:00.0)`; one half alone when only it is known."""
    canon = bus_id(bus) if bus else None
    if index is None:
        return canon or "gpu?"
    return f"gpu{index} ({canon})" if canon else f"gpu{index}"


def index_of(component: str) -> int | None:
    """1 for `gpu1` or `gpu1 (0000:1a:00.0)`, else None."""
    m = _INDEX.match(component.strip())
    return int(m["index"]) if m else None


class GpuNames:
    """The GPUs of one node ({index: bus id}, as its heartbeat said) and the one name of each."""

    def __init__(self, gpus: Mapping[int, str] | None = None):
        self.by_index: dict[int, str] = {}
        self.by_bus: dict[str, int] = {}
        for index, bus in (gpus or {}).items():
            canon = bus_id(bus)
            if canon is not None:
                self.by_index[int(index)] = canon
                self.by_bus[canon] = int(index)

    def name(self, component: str) -> str:
        """A finding's component as the one name: `gpu1` and `0000:1a:00` (the same GPU) both
        become `gpu1 (0000:1a:00.0)`. A component that is no GPU (`mlx5_0/1`, `*`, a
        mount) is returned as it is; a GPU this node never reported keeps the half it has."""
        text = str(component)
        index = index_of(text)
        if index is not None:
            return label(index, self.by_index.get(index))
        canon = bus_id(text)
        if canon is not None:
            return label(self.by_bus.get(canon), canon)
        return text
