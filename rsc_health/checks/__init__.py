"""Pure checks: `NodeState` (+ the counter deltas it carries) and config -> findings.

One module per check family; each exposes `check(state, cfg) -> list[Finding]` and does no I/O
(the XID catalog is loaded by the engine and passed in through `cfg`).
"""

from __future__ import annotations

from collections.abc import Callable

from rsc_health.checks import ecc, gpu, infiniband, mount, nvlink, pcie, remap, xid

CHECKS: dict[str, Callable] = {
    "gpu": gpu.check,
    "xid": xid.check,
    "ecc": ecc.check,
    "remap": remap.check,
    "nvlink": nvlink.check,
    "pcie": pcie.check,
    "infiniband": infiniband.check,
    "mount": mount.check,
}
