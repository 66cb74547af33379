"""NVLink: every expected link active (a down link drains now); error counters rising between
sweeps drain after the job."""

from __future__ import annotations

from rsc_health.checks._finding import checker_error, fail, ok, readable_gpus
from rsc_health.collect.counters import per_sweep
from rsc_health.collect.gpu import ABSENT, NVLINK_COUNTERS, err, flag
from rsc_health.model import Finding, Severity


def _links(g) -> list | None:
    """The GPU's links as NVML answered them; None when the list itself is an error answer
    NVML could not give (the gpu family says it: the checker could not look, no link is
    judged down). An absent one (NOT_SUPPORTED) is no links, as the backend writes it."""
    links = g.answers.get("nvlink")
    e = err(links)
    if e:
        return [] if e in ABSENT else None
    return links if isinstance(links, list) else []  # parse_answers made any other an error


def counters(state) -> dict[str, int]:
    """Each GPU's NVLink error counters, link by link (NVML)."""
    out: dict[str, int] = {}
    for g in state.gpu.gpus if state.gpu else []:
        for link in _links(g) or []:
            for c in NVLINK_COUNTERS:
                v = link.get(c)  # an error answer is a dict: no int, as val() would make it
                if isinstance(v, int):
                    out[f"nvlink/gpu{g.index}/{link.get('link')}/{c}"] = v
    return out


def check(state, cfg: dict) -> list[Finding]:
    gcfg = cfg.get("gpu", {})
    expected = int(gcfg.get("nvlinks_per_gpu", 0))
    per = int(gcfg.get("nvlink_errors_per_sweep", 0))  # judged per counter: _rising
    out: list[Finding] = []
    for g, comp in readable_gpus(state):
        links = _links(g)
        if links is None:
            continue
        found, active = _link_states(comp, links, expected)
        found += _rising(comp, links, state, per)
        if not found and links:
            found = [ok("nvlink", comp, f"{comp} {active} NVLinks active")]
        out.extend(found)
    return out


def _link_states(comp: str, links: list, expected: int) -> tuple[list[Finding], int]:
    """(links down or missing: drain now, or states NVML could not give: a checker error;
    how many links are active)."""
    states = [(lk.get("link"), *((None, err(lk)) if err(lk) else flag(lk["state"])
                                 if lk.get("state") is not None else (None, "no state")))
              for lk in links]
    down = [link for link, up, _ in states if up is False]
    active = sum(1 for _, up, _ in states if up)
    # A state NVML could not give (TIMEOUT, UNKNOWN, ...) or not a real 0/1 (0.0, "0")
    # says nothing about the link: the checker could not look. Only links known down or
    # absent drain.
    unreadable = {link: why for link, _, why in states if why}
    missing = max(0, expected - len(links))
    if down or active + len(unreadable) < expected:
        shown = ",".join(str(x) for x in down) or "-"
        return [fail("nvlink", comp, Severity.DRAIN_NOW, "nvlink_down",
                     f"{comp} {active} of {expected} NVLinks active (down: {shown})",
                     repair=True, down=down, missing=missing)], active
    if unreadable:
        shown = ", ".join(f"{link}: {why}" for link, why in unreadable.items())
        return [checker_error("nvlink", comp, f"{comp} NVLink state unreadable ({shown})")], active
    return [], active


def _rising(comp: str, links: list, state, per: int) -> list[Finding]:
    """Error counters that rose past the limit (`per` sweep, over the sweeps each one's rise
    spans) since the last sweep (drain after the job)."""
    limit, _ = per_sweep(per, state, "nvlink")
    rising = {}
    for lk in links:
        for c in NVLINK_COUNTERS:
            key = f"nvlink/{comp}/{lk.get('link')}/{c}"
            d = state.deltas.get(key, 0)
            # A counter's own span (a baseline older than the family's) is never the shorter:
            # only a rise past the family's limit needs its own looked up.
            if d > limit and (key not in state.sweeps or d > per_sweep(per, state, "nvlink",
                                                                          key)[0]):
                rising[f"{lk.get('link')}/{c}"] = d
    if not rising:
        return []
    first = next(iter(rising))
    return [fail("nvlink", comp, Severity.DRAIN_AFTER_JOB, "nvlink_errors",
                 f"{comp} NVLink errors rising: link {first} +{rising[first]}"
                 + (f" (+{len(rising) - 1} more)" if len(rising) > 1 else ""),
                 repair=True, rising=rising)]
