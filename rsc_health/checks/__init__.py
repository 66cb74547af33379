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
  its replay judges what the live node judged; `capture(cfg, root, env)`: anything else a
  snapshot must carry for it (the mount probes' outcomes), given the snapshot's CollectEnv
  (its NVML answers, the probes on record as hanging, where the hangs it meets are noted).

A family's functions and file lists are its module's own (`check`, `collect`, `counters`,
`capture`, `READS`, `READS_CONFIG`), named in its `Family` line and imported on first use
(`_Attr`): a stage imports only the family modules it runs (a prolog: [slurm] prolog_families
and the families whose counters it keeps baselines of), not all of them.

tests/unit/test_family_contract.py holds every family to all of it. The shared readers (NVML,
the kernel log, sysfs helpers, the mount table, bounded probes) live in rsc_health.collect,
which never imports this package.
"""

from __future__ import annotations

import sys

from rsc_health.checks.env import CollectEnv
from rsc_health.record import dataclass, field

TYPE_CHECKING = False  # typing's, without importing typing: every job start loads this
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from typing import Any


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
    capture: Callable[..., dict] | None = None  # snapshot extras: cfg, root, env -> doc
    types: dict[str, Any] = field(default_factory=dict)  # key -> config_schema.Spec
    # Its kernel-log cursor's file under the state dir (engine.STATE_FILES lists it): its
    # collect returns a kmsg.XidRead whose cursor is saved once its findings are spooled.
    cursor: str | None = None
    # Its `capture` returns {"<name>_record": doc} (what it read of the live machine: programs'
    # outcomes, processes) and `[<config>] replay_file` makes its collect judge that doc:
    # `check --from` replays it and runs nothing of the machine replaying it.
    replays: bool = False
    # Its counters come from its own collect alone (state.extra[name]): a run that did not
    # collect it has none of them, so one that does not run it never imports it for them
    # (checks.state._read_counters: a prolog spared host and telemetry, 1.6 M instructions).
    counters_own: bool = False
    # Its counters become rates over the run's interval, under keys that start with this: a
    # run of it that read any of them forgets the baselines it did not read (engine.commit),
    # so a counter that did not answer one run gives the next no rate rather than its rise
    # over two intervals divided by one.
    rates_prefix: str | None = None
    # Its per-sweep counters' keys start with these (checks.state.time_key times them as one):
    # when a sweep moves the family's time, a baseline it did not read stays with the time it
    # was taken (checks.state.counter_time_key, engine._keep_unread), so a counter that did not
    # answer one sweep has its next rise judged whole (a UE while ue_count read garbled:
    # helper-207) and over the sweeps it spans, not against one sweep's limit (helper-108).
    # Keys ending in one of `counter_keeps` are memory, not counts (a port seen this boot).
    counter_prefixes: tuple[str, ...] = ()
    counter_keeps: tuple[str, ...] = ()


class _Attr:
    """An attribute of a family module (rsc_health.checks.MODULE), imported when first used:
    called, it is the function; iterated, the tuple of names. Equal by what it names."""

    __slots__ = ("attr", "module", "_value")

    def __init__(self, module: str, attr: str) -> None:
        self.module = module
        self.attr = attr
        self._value: Any = None

    def resolve(self) -> Any:
        if self._value is None:
            # importlib.import_module without importlib (every job start): the family's module
            # is a plain submodule of this package.
            name = f"{__name__}.{self.module}"
            __import__(name)
            self._value = getattr(sys.modules[name], self.attr)
        return self._value

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.resolve()(*args, **kwargs)

    def __iter__(self) -> Iterator[str]:
        return iter(self.resolve())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Attr) and (self.module, self.attr) == (other.module, other.attr)

    def __hash__(self) -> int:
        return hash((self.module, self.attr))

    def __repr__(self) -> str:
        return f"{__name__}.{self.module}.{self.attr}"


# What each Family field names in the family's module.
_ATTRS = {"collect": "collect", "counters": "counters", "capture": "capture", "reads": "READS",
          "reads_config": "READS_CONFIG"}


def _family(name: str, config: str, brings: tuple[str, ...] = (), **declared: Any) -> Family:
    """The family NAME of module rsc_health.checks.NAME: its `check` and what it `brings`
    (Family fields, see _ATTRS), all imported on first use."""
    attrs: dict[str, Any] = {key: _Attr(name, _ATTRS[key]) for key in brings}
    return Family(name, _Attr(name, "check"), config, **attrs, **declared)


REGISTRY: tuple[Family, ...] = (
    _family("gpu", "gpu", nvml=True),
    # NVML maps the kernel's PCI addresses to gpuN.
    _family("xid", "xid", ("reads_config", "collect"), nvml=True, cursor="xid_cursor.json"),
    # The same kernel-log sources as xid ([xid] sources), read past a cursor of its own.
    _family("sxid", "sxid", ("reads_config", "collect"), cursor="sxid_cursor.json"),
    _family("ecc", "gpu", ("counters",), nvml=True, counter_prefixes=("ecc/",)),
    _family("remap", "gpu", nvml=True),
    _family("nvlink", "gpu", ("counters",), nvml=True, counter_prefixes=("nvlink/",)),
    # NVML's PCIe replay counter of each GPU.
    _family("pcie", "pcie", ("reads", "collect", "counters"), nvml=True,
            counter_prefixes=("aer/", "pcie_replay/")),
    _family("infiniband", "infiniband", ("reads", "collect", "counters"),
            counter_prefixes=("ib/",), counter_keeps=("/present", "/ports_seen")),
    _family("mount", "mounts", ("reads", "collect", "capture")),
    _family("host", "host", ("reads", "collect", "counters"), counters_own=True,
            counter_prefixes=("edac/",)),
    # NVSwitch systems: the Fabric Manager service (a bounded systemctl) and NVML's fabric state.
    _family("fabric", "fabric", ("reads", "collect", "capture"), nvml=True, replays=True),
    # Processes NVML sees on the GPUs that belong to no running job (the prolog's check).
    _family("leftover", "leftover", ("collect", "capture"), nvml=True, replays=True),
    # DCGM's verdicts (dcgmi health / diag -j), off unless [dcgm] enabled or a saved file.
    _family("dcgm", "dcgm", ("collect", "capture"), replays=True),
    # Programs, not files: a snapshot carries what they printed, a replay runs nothing.
    _family("site", "site", ("collect", "capture")),
    # NVML's telemetry answers (asked only when it runs) and the HCAs' traffic counters:
    # one sample a run, warnings only.
    _family("telemetry", "telemetry", ("reads", "collect", "counters", "capture"), nvml=True,
            counters_own=True, rates_prefix="tm/"),
)
FAMILIES: tuple[str, ...] = tuple(f.name for f in REGISTRY)
CHECKS: dict[str, Callable] = {f.name: f.check for f in REGISTRY}
BY_NAME: dict[str, Family] = {f.name: f for f in REGISTRY}
