"""Each node's GPUs by index and bus id, as its latest heartbeat said (gpu_names, version
12), for the one door that names a GPU to a person: `rsc_health.gpuname.GpuNames.name`.
The report and `healthctl node` read them here."""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import Connection, select

from rsc_health.gpuname import GpuNames
from rsc_health.historian import schema

# Nodes asked in one IN (...): well under every driver's bound parameter limit.
CHUNK = 900


def gpu_names(conn: Connection, nodes: Iterable[str]) -> dict[str, GpuNames]:
    """{node: GpuNames} for these nodes; a node that never said has an empty one (its
    findings keep the half they have)."""
    g = schema.gpu_names
    wanted = sorted({str(n) for n in nodes})
    pairs: dict[str, dict[int, str]] = {n: {} for n in wanted}
    for start in range(0, len(wanted), CHUNK):
        rows = conn.execute(select(g.c.node, g.c.idx, g.c.bus_id)
                            .where(g.c.node.in_(wanted[start:start + CHUNK]))).all()
        for node, idx, bus in rows:
            pairs[node][int(idx)] = bus
    return {n: GpuNames(p) for n, p in pairs.items()}


def named(conn: Connection, nodes: list[str], components: list[str]) -> list[str]:
    """Each (node, component) pair's one name, in order."""
    names = gpu_names(conn, nodes)
    return [names[str(n)].name(str(c)) for n, c in zip(nodes, components, strict=True)]
