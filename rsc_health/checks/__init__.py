"""Check families: each one file that reads the node, keeps its counters and judges.

A family module exposes `check(state, cfg) -> list[Finding]` (pure: no I/O; the XID catalog
is loaded by the engine and passed in through `cfg`) and, when it reads something of its own,
`collect(root, CollectEnv)` (its data lands in `state.extra[name]`) and `counters(state)` (the
error counters kept between sweeps). `REGISTRY` is the one list of families: engine,
collectors, the snapshot and config validation read it, and its `Family` line declares
everything the family needs and brings:

- `config`: its section in default_config.toml (typed from the defaults; `types` gives the
  element type of a list or map whose default is empty, so `[1, "eth0"]` is refused);
- `nvml`: it judges NVML's answers (state.gpu), so NVML is read whenever it runs, alone
  (`check --only NAME`, `prolog_families = [NAME]`) or not;
- `reads`: the files under the node's root it reads (globs), and `reads_config`: config keys
  whose values name more of them; a snapshot carries exactly these (symlinks as links), so
  its replay judges what the live node judged; `capture(cfg, root)`: anything else a
  snapshot must carry for it (the mount probes' outcomes).

tests/unit/test_family_contract.py holds every family to all of it. The shared readers (NVML,
the kernel log, sysfs helpers, the mount table, bounded probes) live in rsc_health.collect,
which never imports this package.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rsc_health.checks import (
    dcgm,
    ecc,
    fabric,
    gpu,
    host,
    infiniband,
    leftover,
    mount,
    nvlink,
    pcie,
    remap,
    site,
    sxid,
    telemetry,
    xid,
)
from rsc_health.checks.env import CollectEnv
from rsc_health.record import dataclass, field


@dataclass(frozen=True)
class Family:
    name: str
    check: Callable
    config: str  # its [section] in default_config.toml (several families may share one)
    nvml: bool = False  # judges NVML's answers: NVML is read whenever it runs
    reads: tuple[str, ...] = ()  # globs under the root its collect reads
    reads_config: tuple[str, ...] = ()  # config keys naming more files it reads
    collect: Callable[[Any, CollectEnv], Any] | None = None
    counters: Callable[[Any], dict[str, int]] | None = None
    capture: Callable[[Any, Any], dict] | None = None  # snapshot extras: cfg, root -> doc
    types: dict[str, Any] = field(default_factory=dict)  # key -> config_schema.Spec
    # Its kernel-log cursor's file under the state dir (engine.STATE_FILES lists it): its
    # collect returns a kmsg.XidRead whose cursor is saved once its findings are spooled.
    cursor: str | None = None
    # Its `capture` returns {"<name>_record": doc} (what it read of the live machine: programs'
    # outcomes, processes) and `[<config>] replay_file` makes its collect judge that doc:
    # `check --from` replays it and runs nothing of the machine replaying it.
    replays: bool = False


REGISTRY: tuple[Family, ...] = (
    Family("gpu", gpu.check, "gpu", nvml=True),
    # NVML maps the kernel's PCI addresses to gpuN.
    Family("xid", xid.check, "xid", nvml=True, reads_config=xid.READS_CONFIG,
           collect=xid.collect, cursor="xid_cursor.json"),
    # The same kernel-log sources as xid ([xid] sources), read past a cursor of its own.
    Family("sxid", sxid.check, "sxid", reads_config=sxid.READS_CONFIG, collect=sxid.collect,
           cursor="sxid_cursor.json"),
    Family("ecc", ecc.check, "gpu", nvml=True, counters=ecc.counters),
    Family("remap", remap.check, "gpu", nvml=True),
    Family("nvlink", nvlink.check, "gpu", nvml=True, counters=nvlink.counters),
    # NVML's PCIe replay counter of each GPU.
    Family("pcie", pcie.check, "pcie", nvml=True, reads=pcie.READS, collect=pcie.collect,
           counters=pcie.counters),
    Family("infiniband", infiniband.check, "infiniband", reads=infiniband.READS,
           collect=infiniband.collect, counters=infiniband.counters),
    Family("mount", mount.check, "mounts", reads=mount.READS, collect=mount.collect,
           capture=mount.capture),
    Family("host", host.check, "host", reads=host.READS, collect=host.collect,
           counters=host.counters),
    # NVSwitch systems: the Fabric Manager service (a bounded systemctl) and NVML's fabric state.
    Family("fabric", fabric.check, "fabric", nvml=True, reads=fabric.READS,
           collect=fabric.collect, capture=fabric.capture, replays=True),
    # Processes NVML sees on the GPUs that belong to no running job (the prolog's check).
    Family("leftover", leftover.check, "leftover", nvml=True, collect=leftover.collect,
           capture=leftover.capture, replays=True),
    # DCGM's verdicts (dcgmi health / diag -j), off unless [dcgm] enabled or a saved file.
    Family("dcgm", dcgm.check, "dcgm", collect=dcgm.collect, capture=dcgm.capture,
           replays=True),
    # Programs, not files: a snapshot carries what they printed, a replay runs nothing.
    Family("site", site.check, "site", collect=site.collect, capture=site.capture),
    # NVML's telemetry answers (asked only when it runs) and the HCAs' traffic counters:
    # one sample a run, warnings only.
    Family("telemetry", telemetry.check, "telemetry", nvml=True, reads=telemetry.READS,
           collect=telemetry.collect, counters=telemetry.counters, capture=telemetry.capture),
)
FAMILIES: tuple[str, ...] = tuple(f.name for f in REGISTRY)
CHECKS: dict[str, Callable] = {f.name: f.check for f in REGISTRY}
BY_NAME: dict[str, Family] = {f.name: f for f in REGISTRY}
