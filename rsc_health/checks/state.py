"""`NodeState`: everything the checks judge, collected in one pass (`collect_all`) by the
families of checks.REGISTRY that run: NVML once for all that judge it, then each family's own
collector, then each family's counters."""

from __future__ import annotations

from rsc_health.checks import REGISTRY, CollectEnv
from rsc_health.collect import counters, ibports, kmsg
from rsc_health.collect import gpu as gpu_mod
from rsc_health.collect.node import read_nvml
from rsc_health.config import Config
from rsc_health.record import asdict, dataclass, field

TYPE_CHECKING = False  # typing's, without importing typing: every job start loads this
if TYPE_CHECKING:
    from _typeshed import StrPath  # str | os.PathLike[str]


NVML, IBPORTS = "nvml", "ibports"  # NodeState.collected's names of the shared inputs


@dataclass
class NodeState:
    boot_id: str = ""
    gpu: gpu_mod.GpuReport | None = None  # NVML, read for the families with nvml=True
    nvml_answers: dict | None = None
    # Collector problems: (family, source, message) -> checker findings.
    errors: list[tuple[str, str, str]] = field(default_factory=list)
    # What each family's own collector read, by family name.
    extra: dict = field(default_factory=dict)
    # Flattened error counters and their increase since the previous sweep.
    counters: dict[str, int] = field(default_factory=dict)
    deltas: dict[str, int] = field(default_factory=dict)
    # The baselines on record from earlier runs of this boot (what deltas are taken against).
    baseline: dict[str, int] = field(default_factory=dict)
    # Probes that can hang (collect.hangs): the kinds this run ran, the ones that did not
    # answer (probe -> what happened), the children this run left behind on them, and every
    # probe hanging with since when and for how many sweeps (set by the engine).
    probes_asked: list[str] = field(default_factory=list)
    hung_probes: dict[str, str] = field(default_factory=dict)
    probe_pids: dict[str, int | None] = field(default_factory=dict)
    probe_mounts: dict[str, str] = field(default_factory=dict)  # the mount a child hung on
    # Probes whose abandoned child hung only past the health answers (NVML's telemetry pass):
    # the next run asks health again from a new child instead of going blind.
    hung_after_health: set[str] = field(default_factory=set)
    hangs: dict[str, dict] = field(default_factory=dict)
    # The inputs read in full so far, in collect_all's order: NVML ("nvml"), each family's
    # own collector (its name) and the ports' child ("ibports"). A run the watchdog ends
    # judges the families whose every input is in (ready), and no other.
    collected: set[str] = field(default_factory=set)

    def ready(self, fam) -> bool:
        """Whether every input family `fam` judges is in (collected): its check sees what a
        whole run's would, but no counter deltas (taken once all are read)."""
        return ((not fam.nvml or NVML in self.collected)
                and (fam.collect is None or fam.name in self.collected)
                and (not ibports.port_files(fam.reads or ()) or IBPORTS in self.collected))

    def to_dict(self) -> dict:
        return asdict(self)


def collect_all(
    cfg: Config,
    root: StrPath,
    *,
    only: set[str] | None = None,
    cursors: dict[str, dict] | None = None,
    previous_counters: dict | None = None,
    probe_timeout_s: float | None = None,
    deadline: float | None = None,
    hangs_before: dict[str, dict] | None = None,
    stage: str | None = None,
    inflight=None,
) -> tuple[NodeState, dict]:
    """The node's state and the new kernel-log cursors of the families that ran and keep one
    (family -> cursor; saved by the caller once judged). `deadline`
    (time.monotonic()) bounds the families that run programs (site). `hangs_before`: the
    probes on record as hanging (collect.hangs); one whose abandoned child is still in the
    kernel is not asked again, it is still hung. `stage`: the node path's (CollectEnv.stage).
    `inflight` (engine.InFlight): given the state as soon as there is one, so a run the
    watchdog ends judges what was read before the hang (NodeState.collected)."""
    hangs_before = hangs_before or {}
    families = [f for f in REGISTRY if not only or f.name in only]
    state = NodeState(boot_id=kmsg.boot_id(root))
    if inflight is not None:
        inflight.state = state
    env = CollectEnv(cfg, deadline, state, cursors or {}, hangs_before, probe_timeout_s,
                     stage=stage)
    # The InfiniBand ports' child first: it reads them while NVML answers (collect.ibports).
    ib_files = ibports.port_files(g for f in families if f.collect is not None for g in f.reads)
    if ib_files:
        ibports.start(root, env, ib_files)
    # The statvfs children too: every abandonable child is started before any is waited for,
    # so a hung mount, a hung IB read and a wedged NVML cost the longest wait, not their sum.
    if any(f.name == "mount" for f in families):
        from rsc_health.checks import mount

        env.guard("mount", "statvfs", lambda: mount.start(root, env))
    if any(f.nvml for f in families):
        read_nvml(cfg, root, state, hangs_before,
                  telemetry=any(f.name == "telemetry" for f in families))
        state.collected.add(NVML)
    cursors = cursors or {}
    for fam in (f for f in families if f.collect is not None):
        data = env.guard(fam.name, fam.name, lambda fam=fam: fam.collect(root, env))
        if data is not None:
            state.extra[fam.name] = data
        state.collected.add(fam.name)
    env.guard("infiniband", ibports.SOURCE, lambda: ibports.finish(env))
    state.collected.add(IBPORTS)
    _read_counters(state, families, previous_counters or {})
    state.deltas = counters.deltas(previous_counters or {}, state.counters, state.boot_id)
    new_cursors = {}
    for fam in (f for f in families if f.cursor is not None):
        read = state.extra.get(fam.name)
        new_cursors[fam.name] = dict(read.cursor if read is not None
                                     else cursors.get(fam.name) or {})
    return state, new_cursors


def _read_counters(state: NodeState, families: list, before: dict) -> None:
    """Into state.counters: the counters this run read, to judge and to keep as baselines.

    Only the families that ran move their baselines: a prolog that does not judge NVLink must
    not move its counters' baseline past errors the next sweep has to see. A counter with no
    baseline yet (a first run, a new boot) is kept whoever read it: from then on the family
    that judges it sees its rise (a family whose counters come from its own collect alone,
    counters_own, has none when it did not run). A value that is not a counter is neither
    judged nor kept (the last good baseline stays, so a real rise after a garbled read is
    still seen)."""
    read = state.counters
    kept = (before.get("counters") or {}) if before.get("boot_id") in (None, state.boot_id) \
        else {}
    state.baseline = dict(kept)
    # The families that ran first, then the others' counters that have no baseline yet.
    for ran, fam in sorted(((fam in families, fam) for fam in REGISTRY),
                           key=lambda pair: not pair[0]):
        if fam.counters is not None and (ran or not fam.counters_own):
            read.update({k: v for k, v in fam.counters(state).items() if ran or k not in kept})
    for key in [k for k, v in read.items() if not counters.plausible(v)]:
        state.errors.append(("counters", key, f"not a counter value: {str(read.pop(key))[:40]!r}"))
