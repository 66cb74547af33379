"""Turn a node's findings into one verdict and the Slurm reason string that carries it.

Pure: no I/O, no clock, no Slurm. The mass-drain guard is applied later, by the action layer,
because it needs Slurm's view of the partition.

Reason strings have one grammar so that both people and rsc-health can read them back:

    rsc_health:<mode>:<code>:<human text>

mode is "now" (drain now and requeue), "job" (drain after the running job), "lemon" (historian
verdict) or "manual" (healthctl drain). Slurm stores reasons verbatim, so we keep them short
(MAX_REASON_LEN) and free of characters that would need quoting.
"""

from __future__ import annotations

from rsc_health import lazyre
from rsc_health.compat import UTC, datetime
from rsc_health.model import REASON_PREFIX, Finding, Level, Verdict

MAX_REASON_LEN = 120

MODE_FOR_LEVEL = {Level.DRAIN_NOW: "now", Level.DRAIN_AFTER_JOB: "job"}
# `healthctl drain`: a person's decision under our prefix (never auto-resumed, and never
# counted by the mass-drain guard against the automatic drains).
MANUAL_MODE = "manual"
# `healthctl lemons --apply` (historian verdict) and a failed qualification
# (rsc_health/qualify/flow.py): only a person lifts either.
LEMON_MODE = "lemon"
QUALIFY_MODE = "qualify"
# Qualification drains of a node that was out of service already (rsc_health/qualify/flow.py):
# a run that proved nothing (inconclusive; a fail the mass-drain guard held; a flow cut short,
# drained by `qualify cleanup`) and a three-strikes repair drain. Slurm stamps them with a
# fresh reason time, but they take no node out of service: the mass-drain guard does not count
# them (a fabric event with qualification running must not fill the budget a fresh node with
# a dead GPU needs). A qualification fail still counts.
QUALIFY_REDRAIN_CODES = ("inconclusive", "interrupted", "guard_held", "three_strikes")
# A qualification fail of a node that came to it drained starts its text with when the node
# left service ("out since 2026-11-27T10:02:03Z ..."): the node path's and the lemons' guard
# count the drain from then, not from the fresh reason time Slurm stamps (qualify_out_since).
OUT_SINCE_PREFIX = "out since "
_OUT_SINCE_RE = lazyre.compile(r"^out since (\d{4}-\d\d-\d\dT\d\d:\d\d)Z ")

_REASON_RE = lazyre.compile(
    rf"^{lazyre.escape(REASON_PREFIX)}(?P<mode>[a-z]+):(?P<code>[^:]*):(?P<text>.*)$")
_UNSAFE = lazyre.compile(r"[^\w .,/=+%()\-:#@]")


def decide(findings: list[Finding]) -> Verdict:
    """The worst finding wins, on the one scale (model.Level): a drain over a checker that
    could not look, that over a warning. A checker error never drains a node by itself: it is
    loud, not fatal.

    A drain verdict's causes are every drain-level finding, the worst level's first (they
    lead the reason): the drain is carried out at the worst level, and what the lesser ones
    were for still goes into the drain record and the pending verdict. Kept to the worst
    level alone, an XID 94 (drain after job, never auto-resumed) seen with a missing mount
    (drain now, transient) was drained as the mount alone, its kernel-log line consumed, and
    resumed by three clean sweeps once the mount was back: the GPU needing a reset took jobs
    again for good."""
    worst = max((f.level for f in findings), default=Level.OK)
    if worst in MODE_FOR_LEVEL:
        # sorted() is stable: within a level, the findings keep the order they came in.
        causes = tuple(sorted((f for f in findings if f.level in MODE_FOR_LEVEL),
                              key=lambda f: f.level, reverse=True))
        return Verdict(
            level=worst,
            reason=format_reason(MODE_FOR_LEVEL[worst], causes),
            causes=causes,
            auto_resumable=not any(f.repair for f in causes),
        )
    causes = tuple(f for f in findings if f.level is worst)
    return Verdict(level=worst, reason="", causes=causes if worst is not Level.OK else ())


# Causes a check finds in what it sees at each look (a mount's presence and answer, a port's
# state), not in an event it consumes (a kernel-log line: xid, sxid) nor in a counter's rise
# since the last run (ecc, edac, nvlink, pcie, an IB port's error counters): the same check
# calling the same component ok in a later run says that fault is gone. Each of these checks
# says ok of a component exactly when it finds no fault there (checks/mount.py,
# checks/infiniband.py).
OBSERVED_NOW_CODES = frozenset({"mount_missing", "mount_hung", "mount_error", "mount_ro",
                                "ib_down"})


def still_standing(kept: tuple[Finding, ...] | list[Finding], findings: list[Finding], *,
                   never_resume: frozenset[str] | set[str] = frozenset()) -> list[Finding]:
    """The causes of a verdict kept from an earlier run that still stand against this run's
    `findings`: all but a transient, state-observed cause (OBSERVED_NOW_CODES, not repair,
    not in [actions] never_resume_codes) whose component the same check now calls ok. A
    mount missing while slurmctld was away, back by the next run, drained the node then and
    requeued its jobs for a fault it no longer had. An event's cause (an XID, a counter's
    rise) always stands: its line or its rise was consumed, no later look sees it again."""
    healthy = {(f.family, f.component) for f in findings if f.level is Level.OK}
    return [c for c in kept
            if c.repair or c.code not in OBSERVED_NOW_CODES or c.code in never_resume
            or (c.family, c.component) not in healthy]


# A code's longest in a reason: the clip to MAX_REASON_LEN must fall in the text, never before
# the colon that ends the code (a reason cut there is not read back as ours).
MAX_CODE_LEN = 48


def format_reason(mode: str, causes: tuple[Finding, ...] | list[Finding]) -> str:
    """`rsc_health:now:xid79:gpu3 fell off the bus (+2 more)`, clipped to MAX_REASON_LEN."""
    first = causes[0]
    code = sanitize(first.code or first.family)
    text = (
        first.reason
        if first.reason.startswith(first.component)
        else (f"{first.component} {first.reason}")
    )
    if len(causes) > 1:
        text = f"{text} (+{len(causes) - 1} more)"
    reason = f"{REASON_PREFIX}{mode}:{code.replace(':', '_')[:MAX_CODE_LEN]}:{sanitize(text)}"
    # No trailing space where the clip fell after one: Slurm's reason is read back without it
    # (scontrol prints "REASON [user@time]"), and the node's drain record must equal it.
    return reason[:MAX_REASON_LEN].rstrip()


def sanitize(text: str) -> str:
    """Keep reasons printable and shell/parse-safe whatever the finding text contained."""
    return _UNSAFE.sub("_", " ".join(text.split()))


def parse_reason(reason: str | None) -> dict | None:
    """Read back one of our reason strings; None for a person's or Slurm's own reason."""
    if not reason:
        return None
    m = _REASON_RE.match(reason.strip())
    if not m:
        return None
    return {"mode": m["mode"], "code": m["code"], "text": m["text"].strip()}


def is_ours(reason: str | None) -> bool:
    return parse_reason(reason) is not None


def qualify_out_since(reason: str | None) -> datetime | None:
    """When a node a qualification fail re-drained had left service (aware UTC), or None:
    not a qualification drain, or one of a node that was in service (a suspect)."""
    parsed = parse_reason(reason)
    if parsed is None or parsed["mode"] != QUALIFY_MODE:
        return None
    m = _OUT_SINCE_RE.match(parsed["text"] + " ")
    if not m:
        return None
    try:
        return datetime.strptime(m[1], "%Y-%m-%dT%H:%M").replace(tzinfo=UTC)
    except ValueError:
        return None
