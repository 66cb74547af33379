"""Qualification's first step: the node's own checks, as `healthctl check` runs them.

A tier of benchmarks alone can pass a node the node path would drain (gpu_burn and nvbandwidth
measure the GPUs they find: 7 of 8 look fine). So before any test, `qualify run` runs the
families in [qualify] gate_families through the one engine entry point (`engine.run`,
read-only: the XID cursor and counter baselines stay the prolog/epilog/sweep's), as the node
resolves its config, within the sweep's budget. A finding at a drain level fails the run before
any test; a checker error (the checks could not look) makes it inconclusive unless a test
fails it; warnings are shown and never block. Once the tests ran, the checks look again: a
fault the stress itself raised (an XID 48 under gpu_burn whose figures still pass) is the
node's too, as the epilog would find it.

Each look also reads the drain verdict the node path kept and could not carry out
(pending_verdict.json: slurmctld away, the mass-drain guard, someone else's drain): its events
are consumed (an XID 79's kmsg line is behind the cursor), so the fresh look cannot see them,
yet the node path drains on it at its next run. It is a finding at its own drain level
(`pending_drain`), by the node path's own rule: its causes join every fresh verdict and the
worst level wins (policy.decide), so only a worse fresh verdict supersedes it. Read only:
the file is the node path's to carry out or discard.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from rsc_health.model import Finding, Level, Status
from rsc_health.qualify.outcome import Outcome

TEST = "node_checks"  # the gate's name among the run's outcomes (and the flow's drain code)
AFTER = "node_checks_after"  # the second look, once the tests ran
ALL = "*"  # [qualify] gate_families: every family, as the sweep runs them
SHOWN = 5  # causes named in the reason; the rest counted


@dataclass
class Gate:
    findings: list[Finding]
    outcome: Outcome | None  # None: nothing blocks (ok or warnings only)
    warnings: list[Finding] = field(default_factory=list)

    @property
    def blocks(self) -> bool:
        """A drain-level finding: no test runs."""
        return self.outcome is not None and self.outcome.failed is not None


def families(cfg) -> set[str] | None:
    chosen = list(cfg.get("qualify.gate_families"))
    return None if ALL in chosen else set(chosen)


def look(cfg, root: Path, node: str) -> list[Finding]:
    """The node's findings, read-only, from the engine `healthctl check` and the sweep use."""
    from rsc_health.config import resolve_node_config, state_dir
    from rsc_health.engine import run
    from rsc_health.node.stage import STAGES, budget

    # The sweep's view: this node's overrides, no partition's (a job's partition may relax).
    node_cfg, _ = resolve_node_config(cfg, node=node)
    fresh = run(node_cfg, root, only=families(node_cfg),
                budget_s=budget(node_cfg, STAGES["sweep"]) * 0.5, save_state=False)
    return fresh + pending(Path(state_dir(node_cfg, root)), fresh,
                           set(node_cfg.get("actions.never_resume_codes")))


# Why the node path kept a verdict (store.PendingVerdict.why), as the reason says it.
_KEPT_BECAUSE = {"slurm_unavailable": "Slurm unavailable", "fault": "a checker fault",
                 "unrecorded": "the drain record could not be written"}


def pending(sdir: Path, fresh: list[Finding], never_resume: frozenset[str] | set[str] = frozenset()
            ) -> list[Finding]:
    """The node path's pending drain verdict as a finding at its level, unless the fresh
    findings ask a worse level (nodepath._judge decides on the fresh findings and the pending
    causes together: its drain is carried out at the worst level and named by it, every
    cause going into the drain record, and the file is forgotten once that verdict is carried
    out). A file load_pending would discard (garbled, a FIFO, /dev/zero) is a warning, and so
    is left: the gate never clears nor rewrites it."""
    from rsc_health.node.store import HELD_BY, PENDING_VERDICT_FILE, CorruptPending, read_pending
    from rsc_health.policy import decide, still_standing

    try:
        kept = read_pending(sdir)
    except CorruptPending as exc:
        return [Finding("pending", PENDING_VERDICT_FILE, Status.WARN, Level.WARN,
                        f"{PENDING_VERDICT_FILE} unreadable ({str(exc)[:120]}): the node "
                        "path discards it at its next run", "pending_unreadable")]
    if kept is None or not kept.verdict.drains:
        return []
    # As the node path does (nodepath._still_pending): a kept cause the fresh look sees
    # healed is not carried out.
    causes = still_standing(kept.verdict.causes, fresh, never_resume=never_resume)
    if not causes:
        return []
    verdict = decide(causes)
    if decide(fresh).level > verdict.level:
        # A worse fresh verdict: the node path's drain is carried out at its level and named
        # by it (the kept causes go into its drain record with it): the fresh finding is named.
        return []
    when = f"{kept.time:%Y-%m-%dT%H:%M:%SZ}" if kept.time else "at an unknown time"
    why = HELD_BY.get(kept.why) or _KEPT_BECAUSE.get(kept.why) or kept.why or "?"
    return [Finding("pending", PENDING_VERDICT_FILE, Status.FAIL, verdict.level,
                    f"drain verdict kept since {when} ({why}), not carried out yet: "
                    f"{verdict.reason}", "pending_drain",
                    repair=any(c.repair for c in causes),
                    data={"why": kept.why, "time": kept.time.isoformat() if kept.time else None,
                          "codes": sorted({c.code or c.family for c in causes})})]


def one(f: Finding) -> str:
    """`xid79 on gpu3: ...`: the finding's code and component (once: not where the reason
    already starts with it, as policy.format_reason)."""
    where = "" if f.reason.startswith(f.component) else f" on {f.component}"
    return f"{f.code or f.family}{where}: {f.reason}"


def _named(findings: list[Finding]) -> str:
    text = "; ".join(one(f) for f in findings[:SHOWN])
    return text + (f" (+{len(findings) - SHOWN} more)" if len(findings) > SHOWN else "")


def judge(findings: list[Finding], test: str = TEST) -> Gate:
    """Pure: what the findings mean for a qualification run (`test`: the outcome's name)."""
    drains = [f for f in findings if f.level in (Level.DRAIN_NOW, Level.DRAIN_AFTER_JOB)]
    errors = [f for f in findings if f.status is Status.ERROR]
    warnings = [f for f in findings if f.level is Level.WARN]
    drains.sort(key=lambda f: f.level, reverse=True)  # drain now first
    if drains:
        return Gate(findings, Outcome(test, failed=_named(drains)),
                    warnings)
    if errors:
        return Gate(findings, Outcome(test, inconclusive="the node's checks could not look: "
                                                         f"{_named(errors)}"), warnings)
    return Gate(findings, None, warnings)
