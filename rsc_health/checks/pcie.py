"""PCIe links of GPUs, NICs and the bridges above them.

Width: a link that trained to fewer lanes than it supports stays that way until reset
(downtrained, drain after the job). Speed: judged on NICs only (`pcie_speed`, drain after the
job). GPUs drop their link to Gen1 when idle to save power (ASPM/dynamic link speed), and the
bridges above them follow, so on those current < max speed is normal and says nothing; a
ConnectX HCA keeps its link at full speed, so a slower NIC link is a bad riser or slot.
AER: any fatal error since boot drains now; non-fatal errors rising between sweeps drain
after the job; correctable ones only warn. A width or speed the kernel never prints is a
checker error (the collector keeps it in `unreadable`), never a drain.
"""

from __future__ import annotations

from rsc_health.checks._finding import checker_error, fail, ok, warn
from rsc_health.collect.counters import plausible
from rsc_health.model import Finding, Severity


def check(state, cfg: dict) -> list[Finding]:
    pcfg = cfg.get("pcie", {})
    if state.pcie is None:
        return []
    nonfatal_limit = int(pcfg.get("aer_nonfatal_per_sweep", 0))
    cor_limit = int(pcfg.get("aer_correctable_per_sweep", 100))
    out: list[Finding] = []
    for dev in state.pcie:
        comp = dev.bdf
        before = len(out)
        for name, text in dev.unreadable.items():
            out.append(checker_error("pcie", comp, f"pcie: cannot read {comp} {name}: {text!r} "
                                                   f"is not a value the kernel prints"))
        if dev.width and dev.max_width and dev.width < dev.max_width:
            out.append(
                fail("pcie", comp, Severity.DRAIN_AFTER_JOB, "pcie_downtrained",
                     f"{comp} ({dev.kind}) link x{dev.width}, capable of x{dev.max_width}",
                     repair=True, width=dev.width, max_width=dev.max_width, kind=dev.kind)
            )
        if (dev.kind == "nic" and pcfg.get("judge_nic_speed", True) and dev.speed_gts
                and dev.max_speed_gts and dev.speed_gts < dev.max_speed_gts):
            out.append(
                fail("pcie", comp, Severity.DRAIN_AFTER_JOB, "pcie_speed",
                     f"{comp} (nic) link at {dev.speed_gts:g} GT/s, capable of "
                     f"{dev.max_speed_gts:g}", repair=True, speed_gts=dev.speed_gts,
                     max_speed_gts=dev.max_speed_gts, kind=dev.kind)
            )
        fatal = dev.aer.get("fatal", 0)
        if plausible(fatal) and fatal > 0:  # an implausible one is a checker error (collect)
            out.append(
                fail("pcie", comp, Severity.DRAIN_NOW, "aer_fatal",
                     f"{comp} ({dev.kind}) {dev.aer['fatal']} fatal AER errors since boot",
                     repair=True, kind=dev.kind, **dev.aer)
            )
        nonfatal = state.deltas.get(f"aer/{comp}/nonfatal", 0)
        if nonfatal > nonfatal_limit:
            out.append(
                fail("pcie", comp, Severity.DRAIN_AFTER_JOB, "aer_nonfatal",
                     f"{comp} ({dev.kind}) +{nonfatal} non-fatal AER errors since last sweep",
                     repair=True, delta=nonfatal)
            )
        cor = state.deltas.get(f"aer/{comp}/correctable", 0)
        if cor > cor_limit:
            out.append(
                warn("pcie", comp, "aer_correctable",
                     f"{comp} ({dev.kind}) +{cor} correctable AER errors since last sweep",
                     delta=cor)
            )
        if len(out) == before and dev.kind != "bridge":
            link = f"x{dev.width}" if dev.width else "link width unknown,"
            out.append(ok("pcie", comp, f"{comp} ({dev.kind}) {link} ok"))
    out.extend(_gpu_replays(state, int(pcfg.get("replays_per_sweep", 100))))
    return out


def _gpu_replays(state, limit: int) -> list[Finding]:
    """NVML's PCIe replay counter (link-level retries): a rising count is a marginal link."""
    out = []
    for g in state.gpu.gpus if state.gpu else []:
        d = state.deltas.get(f"pcie_replay/gpu{g.index}", 0)
        if d > limit:
            out.append(
                fail("pcie", f"gpu{g.index}", Severity.DRAIN_AFTER_JOB, "pcie_replay",
                     f"gpu{g.index} +{d} PCIe replays since last sweep (limit {limit})",
                     repair=True, delta=d, bus_id=g.pci_bus_id)
            )
    return out
