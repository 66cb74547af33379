"""`NodeState`: everything the checks judge, collected in one pass (`collect_all`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from rsc_health.checks import REGISTRY, CollectEnv  # the one list of families
from rsc_health.collect import counters, hangs, infiniband, kmsg, mounts, pcie
from rsc_health.collect import gpu as gpu_mod
from rsc_health.config import Config
from rsc_health.model import utcnow

FAMILIES = tuple(f.name for f in REGISTRY)
GPU_FAMILIES = {"gpu", "ecc", "remap", "nvlink", "xid"}  # xid maps PCI addresses to gpuN


@dataclass
class NodeState:
    boot_id: str = ""
    gpu: gpu_mod.GpuReport | None = None
    nvml_answers: dict | None = None
    xid_events: list[kmsg.XidEvent] = field(default_factory=list)
    pcie: list[pcie.PcieDevice] | None = None
    ib_ports: list[infiniband.IbPort] | None = None
    mounts: list[mounts.Mount] | None = None
    mount_probes: dict[str, mounts.ProbeResult] = field(default_factory=dict)
    # Collector problems: (family, source, message) -> checker findings.
    errors: list[tuple[str, str, str]] = field(default_factory=list)
    # What self-contained families (checks.REGISTRY entries with `collect`) read, by family.
    extra: dict = field(default_factory=dict)
    # Flattened error counters and their increase since the previous sweep.
    counters: dict[str, int] = field(default_factory=dict)
    deltas: dict[str, int] = field(default_factory=dict)
    # Probes that can hang (collect.hangs): the kinds this run ran, the ones that did not
    # answer (probe -> what happened), the children this run left behind on them, and every
    # probe hanging with since when and for how many sweeps (set by the engine).
    probes_asked: list[str] = field(default_factory=list)
    hung_probes: dict[str, str] = field(default_factory=dict)
    probe_pids: dict[str, int | None] = field(default_factory=dict)
    hangs: dict[str, dict] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


def gpu_backend(cfg: Config, root: Path):
    """`auto`: replay when reading a test/snapshot root that carries captured answers."""
    gcfg = cfg.section("gpu")
    replay = root / str(gcfg.get("replay_file", "rsc_health/nvml.json")).lstrip("/")
    backend = gcfg.get("backend", "auto")
    if backend == "replay" or (backend == "auto" and str(root) != "/" and replay.exists()):
        return gpu_mod.ReplayBackend(replay)
    return gpu_mod.NvmlBackend(max_links=int(gcfg.get("max_nvlinks", 18)))


def _nvml_answers(backend, timeout: float, state: NodeState) -> dict | None:
    """NVML's answers from an abandonable child; None when it hung before the device count.
    When it hangs mid-read (one GPU's call blocks in a wedged driver), what it answered
    before is kept and judged (a GPU lost before the hang still drains), the hang itself is
    said (`hung_probes`: the engine's nvml_hung), and the GPUs it never reached are
    unanswered (checker errors, never drains)."""
    from rsc_health.collect import bounded

    try:
        return bounded.call(backend.read, timeout, streaming=True)
    except bounded.Abandoned as exc:
        answers = gpu_mod.with_unanswered(exc.partial)
        state.probe_pids[hangs.NVML] = exc.pid
        if answers is None:
            state.hung_probes[hangs.NVML] = f"NVML: Abandoned: {exc}"
            return None
        got = sum(1 for d in answers["devices"] if d.get("error") != "NVML_ERROR_TIMEOUT")
        state.hung_probes[hangs.NVML] = (f"NVML: Abandoned: {exc} (NVML hung after answering "
                                         f"for {got} of {answers['device_count']} GPUs)")
        return answers


def automounts_waiting(cfg: Config, present: list[mounts.Mount]) -> list[str]:
    """Expected paths whose visible mount is autofs's trigger, where the config expects
    something else mounted there (or says nothing of the type)."""
    visible = {m.path: m.fstype for m in present}  # the last mount on a path is the visible one
    return [m["path"] for m in cfg.get("mounts.expected", [])
            if m.get("path") and visible.get(m["path"]) == "autofs"
            and m.get("fstype") != "autofs"]


def mounts_to_probe(cfg: Config, present: list[mounts.Mount]) -> list[str]:
    """The expected mounts that are mounted: the ones statvfs must answer for."""
    mounted = {m.path for m in present}
    expected = [m.get("path") for m in cfg.get("mounts.expected", []) if m.get("path")]
    return [p for p in expected if p in mounted]


def flatten_counters(state: NodeState) -> dict[str, int]:
    out: dict[str, int] = {}
    if state.gpu:
        for g in state.gpu.gpus:
            a = g.answers
            for kind in ("volatile", "aggregate"):
                for err in ("corrected", "uncorrected"):
                    v = gpu_mod.val((a.get("ecc") or {}).get(kind, {}).get(err))
                    if isinstance(v, int):
                        out[f"ecc/gpu{g.index}/{kind}_{err}"] = v
            for link in a.get("nvlink") or []:
                for c in gpu_mod.NVLINK_COUNTERS:
                    v = gpu_mod.val(link.get(c))
                    if isinstance(v, int):
                        out[f"nvlink/gpu{g.index}/{link.get('link')}/{c}"] = v
            v = gpu_mod.val((a.get("pcie") or {}).get("replay"))
            if isinstance(v, int):
                out[f"pcie_replay/gpu{g.index}"] = v
    for dev in state.pcie or []:
        for k, v in dev.aer.items():
            out[f"aer/{dev.bdf}/{k}"] = v
    for port in state.ib_ports or []:
        for k, v in port.counters.items():
            out[f"ib/{port.name}/{k}"] = v
    return out


def collect_all(
    cfg: Config,
    root: Path,
    *,
    only: set[str] | None = None,
    xid_cursor: dict | None = None,
    previous_counters: dict | None = None,
    probe_timeout_s: float | None = None,
    deadline: float | None = None,
    hangs_before: dict[str, dict] | None = None,
) -> tuple[NodeState, dict]:
    """The node's state and the new XID cursor (saved by the caller once judged). `deadline`
    (time.monotonic()) bounds the self-contained families that run programs (site).
    `hangs_before`: the probes on record as hanging (collect.hangs); one whose abandoned child
    is still in the kernel is not asked again, it is still hung."""
    hangs_before = hangs_before or {}
    want = set(only) if only else set(FAMILIES)
    state = NodeState(boot_id=kmsg.boot_id(root))
    new_cursor = dict(xid_cursor or {})

    def guard(family: str, source: str, fn):
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001 - a collector bug is a checker finding
            state.errors.append((family, source, f"{type(exc).__name__}: {exc}"))
            return None

    if want & GPU_FAMILIES:
        backend = gpu_backend(cfg, root)
        if isinstance(backend, gpu_mod.NvmlBackend):
            # A wedged driver blocks NVML calls in the kernel: ask from an abandonable child.
            timeout = float(cfg.get("gpu.nvml_timeout_s", 10.0))
            state.probes_asked.append(hangs.NVML)
            waiting = hangs_before.get(hangs.NVML)
            if hangs.still_waiting(waiting):
                state.hung_probes[hangs.NVML] = (
                    f"NVML: the probe abandoned before (pid {waiting['pid']}) is still waiting "
                    f"in the driver; not asked again")
                answers = None
            else:
                answers = guard("gpu", "nvml", lambda: _nvml_answers(backend, timeout, state))
        else:
            answers = guard("gpu", "nvml", backend.read)
        if answers is not None:
            state.nvml_answers = answers
            state.gpu = guard("gpu", "nvml", lambda: gpu_mod.parse_answers(answers))
    if "xid" in want:
        sources = list(cfg.get("xid.sources", ["/dev/kmsg"]))
        backlog = bool(cfg.get("xid.file_backlog", True))
        read = guard(
            "xid", "kernel log",
            lambda: kmsg.read_new_events(root, sources, xid_cursor or {}, file_backlog=backlog),
        )
        if read is not None:
            state.xid_events = read.events
            new_cursor = read.cursor
            state.errors.extend(("xid", "kernel log", e) for e in read.errors)
    if "pcie" in want:
        state.pcie = guard("pcie", "sysfs", lambda: pcie.collect(root))
    if "infiniband" in want:
        state.ib_ports = guard("infiniband", "sysfs", lambda: infiniband.collect(root))
    if "mount" in want:
        state.mounts = guard("mount", "/proc/mounts", lambda: mounts.collect(root))
    if "mount" in want and state.mounts is not None:
        timeout = probe_timeout_s or float(cfg.get("mounts.probe_timeout_s", 2.0))
        to_probe = mounts_to_probe(cfg, state.mounts or [])
        replay = str(cfg.get("mounts.probe_replay_file", "") or "")
        if replay:  # a snapshot's recorded outcomes, not this machine's statvfs
            state.mount_probes = guard("mount", replay, lambda: mounts.replayed_probes(
                root / replay.lstrip("/"), to_probe)) or {}
        else:
            waiting = [p for p in to_probe
                       if hangs.still_waiting(hangs_before.get(hangs.statvfs(p)))]
            asked = [p for p in to_probe if p not in waiting]
            state.mount_probes = (
                guard("mount", "statvfs", lambda: mounts.probe(root, asked, timeout)) or {}
            )
            now = utcnow()
            for path in waiting:  # its statvfs from an earlier run has still not returned
                state.mount_probes[path] = mounts.ProbeResult(
                    path, False, True, hangs.waited_s(hangs_before[hangs.statvfs(path)], now))
            if automounts_waiting(cfg, state.mounts):
                # autofs unmounts an idle path; its trigger (fstype autofs) is all the table
                # showed. statvfs follows automounts, so the probe just mounted it (or failed
                # to): judge the table as the next job will find it.
                again = guard("mount", "/proc/mounts", lambda: mounts.collect(root))
                if again is not None:
                    state.mounts = again
        state.probes_asked.append(hangs.STATVFS)
        for path, result in state.mount_probes.items():
            if result.hung:
                state.hung_probes[hangs.statvfs(path)] = (
                    f"statvfs {path}: no answer within {result.seconds:.1f}s")
                state.probe_pids[hangs.statvfs(path)] = result.pid
    env = CollectEnv(cfg, deadline)
    for fam in REGISTRY:
        if fam.collect is not None and fam.name in want:
            data = guard(fam.name, fam.name, lambda fam=fam: fam.collect(root, env))
            if data is not None:
                state.extra[fam.name] = data
    state.counters = flatten_counters(state)
    for fam in REGISTRY:
        if fam.counters is not None and fam.name in state.extra:
            state.counters.update(fam.counters(state.extra[fam.name]))
    for key, value in list(state.counters.items()):
        if not counters.plausible(value):
            # Not judged and not kept as a baseline: the last good one stays, so a real rise
            # after a garbled read is still seen.
            del state.counters[key]
            state.errors.append(("counters", key, f"not a counter value: {str(value)[:40]!r}"))
    state.deltas = counters.deltas(previous_counters or {}, state.counters, state.boot_id)
    return state, new_cursor
