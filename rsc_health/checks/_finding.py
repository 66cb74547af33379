"""Short constructors so each check reads as its policy, not as boilerplate. The status word
each writes is its level's (model.Level.status): one scale, the word derived from it."""

from __future__ import annotations

from rsc_health.model import Finding, Level, Severity


def ok(family: str, component: str, reason: str = "ok", **data) -> Finding:
    return Finding(family, component, Level.OK.status, Severity.NONE, reason, data=data)


def warn(family: str, component: str, code: str, reason: str, **data) -> Finding:
    return Finding(family, component, Level.WARN.status, Severity.WARN, reason, code, False, data)


def fail(
    family: str, component: str, severity: Severity, code: str, reason: str, *, repair: bool, **data
) -> Finding:
    """A fault asking for `severity` (a drain; a warning is `warn`)."""
    if severity not in (Severity.DRAIN_AFTER_JOB, Severity.DRAIN_NOW):
        raise ValueError(f"fail() takes a drain severity, not {severity.severity_word}")
    return Finding(family, component, severity.status, severity, reason, code, repair, data)


def checker_error(family: str, component: str, reason: str, **data) -> Finding:
    """The checker could not look: loud, never drains by itself (policy.decide)."""
    return Finding(
        "checker", component, Level.CHECKER_ERROR.status, Severity.NONE, reason,
        f"{family}_unreadable", False, data,
    )


def gpu_name(index: int) -> str:
    return f"gpu{index}"


def readable_gpus(state):
    """(gpu, "gpuN") for every GPU NVML answered for; gpu.py reports the ones it could not read."""
    if state.gpu is None or state.gpu.error:
        return
    for g in state.gpu.gpus:
        if not g.error:
            yield g, gpu_name(g.index)
