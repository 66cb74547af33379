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
    from rsc_health.config import resolve_node_config
    from rsc_health.engine import run
    from rsc_health.node.stage import STAGES, budget

    # The sweep's view: this node's overrides, no partition's (a job's partition may relax).
    node_cfg, _ = resolve_node_config(cfg, node=node)
    return run(node_cfg, root, only=families(node_cfg),
               budget_s=budget(node_cfg, STAGES["sweep"]) * 0.5, save_state=False)


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
