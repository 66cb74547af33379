"""Host memory: EDAC error counts of every memory controller (the `host` family).

The whole family lives here, as a new family should: what it reads (`collect`, under the
node's root), which counters it keeps between sweeps (`counters`), and the policy (`check`);
its registry line in rsc_health/checks/__init__.py (with what it reads, for snapshots), its
[host] section in default_config.toml and its row in the README's family table are all it
adds elsewhere.

/sys/devices/system/edac/mc/mc<N>/{ue_count,ce_count} (kernel Documentation/admin-guide/
ras.rst): uncorrectable and corrected errors since the EDAC driver loaded. An uncorrectable
error the node survived drains it now for a DIMM swap; corrected errors climbing faster than
`[host] ce_per_sweep` mean a DIMM on its way out: drain after the job. No EDAC driver (no mc
directory) is not a finding: many nodes report memory errors only through MCE.
"""

from __future__ import annotations

import os

from rsc_health.checks._finding import checker_error, fail, ok
from rsc_health.collect.counters import per_sweep, plausible
from rsc_health.collect.sysfs import parse_count, read_text
from rsc_health.model import Finding, Severity

TYPE_CHECKING = False  # typing's, without importing typing: every job start loads this
if TYPE_CHECKING:
    from _typeshed import StrPath  # str | os.PathLike[str]

EDAC = "sys/devices/system/edac/mc"
READS = (f"{EDAC}/mc*/ue_count", f"{EDAC}/mc*/ce_count")


def collect(root: StrPath, env=None) -> dict[str, dict[str, int | None]]:
    """{"mc0": {"ue": 0, "ce": 12}, ...}; a count that cannot be read is None."""
    base = os.path.join(root, EDAC)
    if not os.path.isdir(base):
        return {}
    out = {}
    for mc in sorted(os.listdir(base)):
        if not mc.startswith("mc") or not mc[2:].isdigit():
            continue
        out[mc] = {kind: _count(os.path.join(base, mc, f"{kind}_count")) for kind in ("ue", "ce")}
    return out


def _count(path: str) -> int | None:
    value = parse_count(read_text(path))
    return value if plausible(value) else None


def counters(state) -> dict[str, int]:
    return {f"edac/{mc}/{kind}": v for mc, counts in (state.extra.get("host") or {}).items()
            for kind, v in counts.items() if isinstance(v, int)}


def check(state, cfg: dict) -> list[Finding]:
    data = state.extra.get("host")
    if not data:
        return []
    per = int(cfg.get("host", {}).get("ce_per_sweep", 100))
    out: list[Finding] = []
    for mc, counts in data.items():
        before = len(out)
        if counts.get("ue") is None or counts.get("ce") is None:
            out.append(checker_error("host", mc, f"host: cannot read EDAC counts of {mc}"))
            continue
        ue = state.deltas.get(f"edac/{mc}/ue", 0)
        ce = state.deltas.get(f"edac/{mc}/ce", 0)
        limit, since = per_sweep(per, state, "host", f"edac/{mc}/ce")
        if ue > 0:
            out.append(fail("host", mc, Severity.DRAIN_NOW, "edac_ue",
                            f"{mc} +{ue} uncorrectable host memory errors", repair=True,
                            delta=ue))
        if ce > limit:
            out.append(fail("host", mc, Severity.DRAIN_AFTER_JOB, "edac_ce_rising",
                            f"{mc} +{ce} corrected host memory errors {since} "
                            f"(> {limit:g})", repair=True, delta=ce))
        if len(out) == before:
            out.append(ok("host", mc, f"{mc} memory ok"))
    return out
