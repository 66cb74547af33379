"""`NodeState`: everything the checks judge, collected in one pass (`collect_all`) by the
families of checks.REGISTRY that run: NVML once for all that judge it, then each family's own
collector, then each family's counters."""

from __future__ import annotations

import time

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
# The stages that judge a counter's rise against the baseline the sweep keeps and move none:
# a job start between two sweeps must not split a burst into steps under a per-sweep limit.
JOB_STAGES = ("prolog", "epilog")


def time_key(family: str) -> str:
    """The counter key of when `family`'s baselines were taken (ms of CLOCK_MONOTONIC, which
    runs from boot: baselines are of one boot, and a wall-clock step cannot touch it)."""
    return f"time_ms/{family}"


def counter_time_key(key: str) -> str:
    """The key of when counter `key`'s baseline was taken, kept only while that is earlier than
    its family's time (time_key): a run that moved the family's time could not read it, and
    its baseline stays, so the next read's rise is judged over the sweeps it spans. Counter
    keys hold a '/', family names none: the two never meet."""
    return f"time_ms/{key}"


def _now_ms() -> int:
    return int(time.monotonic() * 1000)


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
    # Counters read whose baselines this run leaves as they are (a prolog's, an epilog's).
    held: set[str] = field(default_factory=set)
    # The families whose counters no earlier run of this boot judged (unjudged_families): a
    # rise of theirs is their whole value since boot. And the families of per-sweep counters
    # that ran and read some (judged, unless their check fails: engine.commit).
    unjudged: set[str] = field(default_factory=set)
    counted: set[str] = field(default_factory=set)
    # Family -> the sweeps its counters' rise spans (counters.SWEEP_S each, never under 1):
    # the time since its baselines were taken, where it is on record. Counter key -> the
    # same for a counter whose baseline is older (one a run could not read: counter_time_key).
    sweeps: dict[str, float] = field(default_factory=dict)
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
    # Probes that answered with a refusal that counts run after run (a GPU whose handle NVML
    # refuses: hangs.nvml_handle), kept in the same record as hangs, with no child.
    refused_probes: dict[str, str] = field(default_factory=dict)
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
    sweep: bool = False,
    inflight=None,
) -> tuple[NodeState, dict]:
    """The node's state and the new kernel-log cursors of the families that ran and keep one
    (family -> cursor; saved by the caller once judged). `deadline` (time.monotonic())
    bounds NVML's wait and the families that run programs (site). `hangs_before`: the
    probes on record as hanging (collect.hangs); one whose abandoned child is still in the
    kernel is not asked again, it is still hung. `stage`: the node path's (CollectEnv.stage);
    a prolog or epilog moves no counter baseline that is on record (JOB_STAGES). `sweep`:
    the run is a sweep (engine.run's), which times the baselines it moves.
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
                  telemetry=any(f.name == "telemetry" for f in families), deadline=deadline)
        state.collected.add(NVML)
    cursors = cursors or {}
    for fam in (f for f in families if f.collect is not None):
        data = env.guard(fam.name, fam.name, lambda fam=fam: fam.collect(root, env))
        if data is not None:
            state.extra[fam.name] = data
        state.collected.add(fam.name)
    env.guard("infiniband", ibports.SOURCE, lambda: ibports.finish(env))
    state.collected.add(IBPORTS)
    _read_counters(state, families, previous_counters or {}, stage=stage, sweep=sweep,
                   now=_replay_ms(cfg, root))
    state.deltas = counters.deltas(
        previous_counters or {}, state.counters, state.boot_id,
        since_boot=tuple(p for f in families if f.name in state.unjudged
                         for p in f.counter_prefixes))
    new_cursors = {}
    for fam in (f for f in families if f.cursor is not None):
        read = state.extra.get(fam.name)
        new_cursors[fam.name] = dict(read.cursor if read is not None
                                     else cursors.get(fam.name) or {})
    return state, new_cursors


def _replay_ms(cfg: Config, root: StrPath) -> int | None:
    """A snapshot's replay (`check --from`): the node's CLOCK_MONOTONIC when it was read (the
    baselines' times are of its clock, not the replaying host's: helper-108), or -1 when the
    snapshot is older than that record (its spans cannot be told: each is one sweep). None
    when this is a live run."""
    replay = str(cfg.get("telemetry.clock_replay_file") or "")
    if not replay:
        return None
    try:
        value = counters.replay_clock(root, replay).get("monotonic_ms")
    except (OSError, ValueError, RecursionError):  # a garbled file: telemetry's to say
        return -1
    return value if type(value) is int and value >= 0 else -1


def per_sweep_families() -> list:
    """The families whose counters are judged per sweep against a baseline (not rates)."""
    return [f for f in REGISTRY if f.counters is not None and f.rates_prefix is None]


def unjudged_families(before: dict, boot_id: str) -> set[str]:
    """The families of per-sweep counters no run of `boot_id` has judged yet, by the record of
    the previous run (counters.load()'s): every one when that was of another boot (a reboot),
    the ones it names when it was of this boot, none when there is no boot on record (a first
    run takes its baselines silently: nothing is judged that was there before rsc-health)."""
    if counters.rebooted(before, boot_id):
        return {f.name for f in per_sweep_families()}
    if before.get("boot_id") == boot_id:
        return set(before.get("unjudged") or ()) & {f.name for f in per_sweep_families()}
    return set()


def _read_counters(state: NodeState, families: list, before: dict, *,
                   stage: str | None = None, sweep: bool = False,
                   now: int | None = None) -> None:
    """Into state.counters: the counters this run read, to judge and to keep as baselines.

    Only the families that ran move their baselines: a prolog that does not judge NVLink must
    not move its counters' baseline past errors the next sweep has to see. A prolog or epilog
    moves none that is on record (state.held): the limits are per sweep, and the rise it
    judges is the one since the sweep's baseline, which the next sweep judges whole. A counter
    with no baseline yet (a first run, a new counter) is kept whoever read it: from then on the
    family that judges it sees its rise (a family whose counters come from its own collect
    alone, counters_own, has none when it did not run). Not so after a reboot: a family no run
    of the new boot has judged yet (state.unjudged) has its counters read only by a run of it,
    which judges their whole value since boot, whichever stage runs first after the reboot (a
    prolog that kept NVLink's 5000 errors since boot as baselines hid them from every sweep;
    one that wrote the new boot's file without EDAC's made a sweep take a UE as its baseline).
    A value that is not a counter is
    neither judged nor kept: the last good baseline stays, and when it was taken too
    (counter_time_key, engine._keep_unread), so a real rise after a garbled read, or a counter
    absent for a run, is still seen, over the sweeps it spans. A family with a clock of its own
    (rates_prefix) keeps its own rules."""
    read = state.counters
    kept = (before.get("counters") or {}) if before.get("boot_id") in (None, state.boot_id) \
        else {}
    state.baseline = dict(kept)
    state.unjudged = unjudged_families(before, state.boot_id)
    hold = stage in JOB_STAGES
    now = _now_ms() if now is None else now
    # The families that ran first, then the others' counters that have no baseline yet.
    for ran, fam in sorted(((fam in families, fam) for fam in REGISTRY),
                           key=lambda pair: not pair[0]):
        if fam.counters is None or (not ran and (fam.counters_own or fam.name in state.unjudged)):
            continue
        try:
            got = fam.counters(state)
        except Exception as exc:  # noqa: BLE001 - one family's answers it cannot read must
            # not end every family's run (one engine error hiding a GPU's double-bit error):
            # its counters are neither judged nor kept (the last good baselines stay).
            state.errors.append((fam.name, "counters",
                                 f"counters unreadable: {type(exc).__name__}: {exc}"[:200]))
            continue
        read.update({k: v for k, v in got.items() if ran or k not in kept})
        if ran and got and fam.rates_prefix is None:
            state.counted.add(fam.name)
            _timed(state, fam.name, kept, now, hold=hold, sweep=sweep)
            _own_spans(state, got, kept, now)
            if hold:
                state.held.update(k for k in got if k in kept)
    for key in [k for k, v in read.items() if not counters.plausible(v)]:
        state.errors.append(("counters", key, f"not a counter value: {str(read.pop(key))[:40]!r}"))


def _own_spans(state: NodeState, got: dict, kept: dict, now: int) -> None:
    """The sweeps (state.sweeps, by counter key) the rise of each counter in `got` spans whose
    baseline is older than its family's time (counter_time_key): one a run could not read
    kept its baseline, and its rise since is judged over that time, not over one sweep."""
    if now < 0:
        return
    for key in got:
        then = kept.get(counter_time_key(key))
        if isinstance(then, int) and then <= now:
            state.sweeps[key] = max(1.0, (now - then) / 1000 / counters.SWEEP_S)


def _timed(state: NodeState, family: str, kept: dict, now: int, *, hold: bool,
           sweep: bool) -> None:
    """`family`'s sweeps (state.sweeps) from when its baselines were taken, and their new
    time where this run moves them: a sweep's, or any run's once one is on record (a run
    that moved them untimed would leave an older time, a window too long)."""
    key = time_key(family)
    then = kept.get(key)
    if now < 0:
        return  # a replay of a snapshot that kept no clock: each span is one sweep
    if isinstance(then, int) and then <= now:
        state.sweeps[family] = max(1.0, (now - then) / 1000 / counters.SWEEP_S)
    if not hold and (sweep or then is not None):
        state.counters[key] = now
