"""A tier's outcomes, judged: each metric against its peers (store.peers) or the imported
baseline, then the run's verdict. A fault the tool itself found, or a metric under its peers'
line, fails the run; otherwise anything that proved nothing makes it inconclusive (retried,
never a pass); only a run where every test ran and every metric was judged passes.

A node is judged by the evidence it owes, not by what it happened to print: a test whose tool
ran on fewer GPUs than [gpu] count (a GPU NVML lists but CUDA cannot use), whose per-GPU
metrics cover fewer, or that lacks a metric its peers measure in the same test (nvbandwidth's
waived device-to-device testcases when P2P is lost, a GPU or HCA missing from the list) proved
less than its peers did: inconclusive, never a pass. A fault found stands either way.

A tool that passed with a warning (DCGM Warn, Outcome.warned) makes the run inconclusive, or
with `warn_passes` ([qualify] dcgm_warn = "pass") lets it pass with the warning in its reason."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from rsc_health.qualify.baseline import Baseline
from rsc_health.qualify.judge import FAIL, INCONCLUSIVE, PASS, Judgement, Rules, judge
from rsc_health.qualify.outcome import Metric, Outcome


@dataclass
class Judged:
    verdict: str
    reason: str
    judgements: list[tuple[str, Judgement, str, bool]] = field(default_factory=list)
    outcomes: list[Outcome] = field(default_factory=list)


def missing(out: Outcome, *, gpus: int = 0,
            expected: set[tuple[str, str]] | None = None) -> str | None:
    """Why `out` proves less than a whole node's worth, or None. `gpus`: [gpu] count (0: not
    said); `expected`: the (metric, index) pairs its peers measure in this test."""
    if gpus and out.devices is not None and out.devices < gpus:
        return f"the tool ran on {out.devices} of {gpus} GPUs ([gpu] count)"
    per_gpu: dict[str, set[str]] = {}
    for m in out.metrics:
        if m.scope == "gpu":
            per_gpu.setdefault(m.name, set()).add(m.index)
    short = sorted(n for n, idx in per_gpu.items() if gpus and len(idx) < gpus)
    if short:
        return f"{short[0]} for {len(per_gpu[short[0]])} of {gpus} GPUs ([gpu] count)"
    have = {(m.name, m.index) for m in out.metrics}
    lacking = sorted((expected or set()) - have)
    if lacking:
        shown = ", ".join(f"{n}:{i}" if i else n for n, i in lacking[:3])
        more = f" and {len(lacking) - 3} more" if len(lacking) > 3 else ""
        return f"no result for {shown}{more}, which its peers measure in this test"
    return None


def judge_run(outcomes: list[Outcome], *, peers_of: Callable[[Metric, str], list[float]],
              baseline: Baseline | None, rules: Rules, gpus: int = 0,
              expected_of: Callable[[str], set[tuple[str, str]]] | None = None,
              warn_passes: bool = False) -> Judged:
    """`peers_of(metric, test)`: the peers' values of that metric measured by that test;
    `gpus`: [gpu] count (0: not said); `expected_of(test)`: the (metric, index) pairs the
    node's peers measure in that test (store.expected); `warn_passes`: a tool's warning
    (Outcome.warned) is noted, not inconclusive."""
    judged = Judged(PASS, "", outcomes=outcomes)
    failed: list[str] = []
    unsure: list[str] = []
    noted: list[str] = []
    for out in outcomes:
        if out.failed:
            failed.append(f"{out.test}: {out.failed}")
            continue
        if out.inconclusive:
            unsure.append(f"{out.test}: {out.inconclusive}")
            continue
        short = missing(out, gpus=gpus,
                        expected=expected_of(out.test) if expected_of else None)
        if short:
            unsure.append(f"{out.test}: {short}")
        if out.warned:
            (noted if warn_passes else unsure).append(f"{out.test}: {out.warned}")
        for metric in out.metrics:
            j = judge(metric, peers_of(metric, out.test),
                      baseline=baseline.get(metric) if baseline else None, rules=rules)
            judged.judgements.append((out.test, j, metric.unit, metric.higher_is_better))
            where = f"{out.test}: {metric.key} {j.reason}"
            if j.status == FAIL:
                failed.append(where)
            elif j.status == INCONCLUSIVE:
                unsure.append(where)
    if failed:
        judged.verdict, judged.reason = FAIL, "; ".join(failed)
    elif unsure:
        judged.verdict, judged.reason = INCONCLUSIVE, "; ".join(unsure)
    elif not outcomes:
        judged.verdict, judged.reason = INCONCLUSIVE, "the tier has no tests"
    if noted:
        said = "passed with warnings: " + "; ".join(noted)
        judged.reason = f"{judged.reason}; {said}" if judged.reason else said
    return judged
