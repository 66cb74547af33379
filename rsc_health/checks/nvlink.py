"""NVLink: every expected link active (a down link drains now); error counters rising between
sweeps drain after the job."""

from __future__ import annotations

from rsc_health.checks._finding import checker_error, fail, ok, readable_gpus
from rsc_health.collect.gpu import NVLINK_COUNTERS, flag, val
from rsc_health.model import Finding, Severity


def counters(state) -> dict[str, int]:
    """Each GPU's NVLink error counters, link by link (NVML)."""
    out: dict[str, int] = {}
    for g in state.gpu.gpus if state.gpu else []:
        for link in g.answers.get("nvlink") or []:
            for c in NVLINK_COUNTERS:
                v = val(link.get(c))
                if isinstance(v, int):
                    out[f"nvlink/gpu{g.index}/{link.get('link')}/{c}"] = v
    return out


def check(state, cfg: dict) -> list[Finding]:
    gcfg = cfg.get("gpu", {})
    expected = int(gcfg.get("nvlinks_per_gpu", 0))
    limit = int(gcfg.get("nvlink_errors_per_sweep", 0))
    out: list[Finding] = []
    for g, comp in readable_gpus(state):
        links = g.answers.get("nvlink") or []
        before = len(out)
        states = [(lk.get("link"), *(flag(lk["state"]) if lk.get("state") is not None
                                     else (None, "no state"))) for lk in links]
        down = [link for link, up, _ in states if up is False]
        active = sum(1 for _, up, _ in states if up)
        # A state NVML could not give (TIMEOUT, UNKNOWN, ...) or not a real 0/1 (0.0, "0")
        # says nothing about the link: the checker could not look. Only links known down or
        # absent drain.
        unreadable = {link: why for link, _, why in states if why}
        missing = max(0, expected - len(links))
        if down or active + len(unreadable) < expected:
            shown = ",".join(str(x) for x in down) or "-"
            out.append(
                fail("nvlink", comp, Severity.DRAIN_NOW, "nvlink_down",
                     f"{comp} {active} of {expected} NVLinks active (down: {shown})",
                     repair=True, down=down, missing=missing)
            )
        elif unreadable:
            shown = ", ".join(f"{link}: {why}" for link, why in unreadable.items())
            out.append(checker_error("nvlink", comp, f"{comp} NVLink state unreadable ({shown})"))
        rising = {}
        for lk in links:
            for c in NVLINK_COUNTERS:
                d = state.deltas.get(f"nvlink/{comp}/{lk.get('link')}/{c}", 0)
                if d > limit:
                    rising[f"{lk.get('link')}/{c}"] = d
        if rising:
            first = next(iter(rising))
            out.append(
                fail("nvlink", comp, Severity.DRAIN_AFTER_JOB, "nvlink_errors",
                     f"{comp} NVLink errors rising: link {first} +{rising[first]}"
                     + (f" (+{len(rising) - 1} more)" if len(rising) > 1 else ""),
                     repair=True, rising=rising)
            )
        if len(out) == before and links:
            out.append(ok("nvlink", comp, f"{comp} {active} NVLinks active"))
    return out
