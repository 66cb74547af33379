"""A tier's outcomes, judged: each metric against its peers (store.peers) or the imported
baseline, then the run's verdict. A fault the tool itself found, or a metric under its peers'
line, fails the run; otherwise anything that proved nothing makes it inconclusive (retried,
never a pass); only a run where every test ran and every metric was judged passes."""

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


def judge_run(outcomes: list[Outcome], *, peers_of: Callable[[Metric], list[float]],
              baseline: Baseline | None, rules: Rules) -> Judged:
    judged = Judged(PASS, "", outcomes=outcomes)
    failed: list[str] = []
    unsure: list[str] = []
    for out in outcomes:
        if out.failed:
            failed.append(f"{out.test}: {out.failed}")
            continue
        if out.inconclusive:
            unsure.append(f"{out.test}: {out.inconclusive}")
            continue
        for metric in out.metrics:
            j = judge(metric, peers_of(metric),
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
    return judged
