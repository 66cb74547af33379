"""Pure checks: `NodeState` (+ the counter deltas it carries) and config -> findings.

One module per check family; each exposes `check(state, cfg) -> list[Finding]` and does no I/O
(the XID catalog is loaded by the engine and passed in through `cfg`). `REGISTRY` is the one
list of families: engine, collectors and config read it. A family written the new way (see
host.py) also brings its own `collect(root)` and `counters(data)`, so adding it is that one
file, its line below, and its section in default_config.toml. A collector gets the node's
root and a `CollectEnv` (the config, and the stage's deadline it must return by: site.py runs
programs and needs both; host.py needs neither).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rsc_health.checks import ecc, gpu, host, infiniband, mount, nvlink, pcie, remap, site, xid


@dataclass(frozen=True)
class CollectEnv:
    """What a collector may need beyond the root: the config, and the time.monotonic() by which
    it must have returned (None: no stage budget, e.g. `healthctl check`)."""

    cfg: Any
    deadline: float | None = None


@dataclass(frozen=True)
class Family:
    name: str
    check: Callable
    # Self-contained families: read the node under its root, collect(root, CollectEnv) (any
    # exception is a checker finding), and the error counters to keep between sweeps. The
    # older families are collected by rsc_health.collect.node.
    collect: Callable[[Any, CollectEnv], Any] | None = None
    counters: Callable[[Any], dict[str, int]] | None = None


REGISTRY: tuple[Family, ...] = (
    Family("gpu", gpu.check),
    Family("xid", xid.check),
    Family("ecc", ecc.check),
    Family("remap", remap.check),
    Family("nvlink", nvlink.check),
    Family("pcie", pcie.check),
    Family("infiniband", infiniband.check),
    Family("mount", mount.check),
    Family("host", host.check, host.collect, host.counters),
    Family("site", site.check, site.collect),
)
CHECKS: dict[str, Callable] = {f.name: f.check for f in REGISTRY}
