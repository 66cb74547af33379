"""ECC: uncorrectable errors drain now; a burst of corrected errors drains after the job."""

from __future__ import annotations

from rsc_health.checks._finding import fail, ok, readable_gpus, warn
from rsc_health.collect.counters import per_sweep, plausible
from rsc_health.collect.gpu import ABSENT, val
from rsc_health.collect.gpu import err as nvml_error
from rsc_health.model import Finding, Severity


def counters(state) -> dict[str, int]:
    """Each GPU's volatile and aggregate ECC counts (NVML)."""
    out: dict[str, int] = {}
    for g in state.gpu.gpus if state.gpu else []:
        ecc = g.answers.get("ecc") or {}
        for kind in ("volatile", "aggregate"):
            for err in ("corrected", "uncorrected"):
                v = val((ecc.get(kind) or {}).get(err))
                if isinstance(v, int):
                    out[f"ecc/gpu{g.index}/{kind}_{err}"] = v
    return out


def check(state, cfg: dict) -> list[Finding]:
    gcfg = cfg.get("gpu", {})
    out: list[Finding] = []
    for g, comp in readable_gpus(state):
        a = g.answers
        answer = a.get("ecc_mode")
        if answer is None or nvml_error(answer) in ABSENT:
            continue  # ECC not supported on this GPU: nothing to judge
        # Any other error (a corrupt InfoROM, where the ECC configuration lives; a TIMEOUT) is
        # the gpu family's checker error: the counts are still judged wherever they were read.
        mode = val(answer)
        before = len(out)
        if (isinstance(mode, dict) and gcfg.get("ecc_required", True)
                and mode.get("current") == 0):
            out.append(warn("ecc", comp, "ecc_disabled", f"{comp} ECC is disabled"))
        vol = (a.get("ecc") or {}).get("volatile") or {}
        dbe = val(vol.get("uncorrected"))
        agg_dbe_delta = state.deltas.get(f"ecc/{comp}/aggregate_uncorrected", 0)
        if (plausible(dbe) and dbe > 0) or agg_dbe_delta > 0:
            out.append(
                fail("ecc", comp, Severity.DRAIN_NOW, "ecc_dbe",
                     f"{comp} uncorrectable ECC errors: {dbe or agg_dbe_delta}", repair=True,
                     volatile_uncorrected=dbe, aggregate_delta=agg_dbe_delta)
            )
        sbe_key = f"ecc/{comp}/volatile_corrected"
        sbe_delta = state.deltas.get(sbe_key, 0)
        limit, since = per_sweep(int(gcfg.get("ecc_corrected_per_sweep", 1000)), state, "ecc",
                                 sbe_key)
        if sbe_delta > limit:
            out.append(
                fail("ecc", comp, Severity.DRAIN_AFTER_JOB, "ecc_sbe_rising",
                     f"{comp} {sbe_delta} corrected ECC errors {since} (> {limit:g})",
                     repair=True, delta=sbe_delta)
            )
        if len(out) == before:
            out.append(ok("ecc", comp, f"{comp} ECC ok"))
    return out
