"""Judge a qualification metric against its peers, never against a constant.

Peers are passing results of the same metric from nodes of the same GPU model, driver/firmware
and topology slot (the caller chooses the group and excludes the node itself). Their median and
robust spread (1.4826 x MAD, a standard deviation for normal data that one bad peer cannot
inflate) set the line:

    tolerance = clamp(k x spread / median, min_margin, max_margin)
    fail when value < median x (1 - tolerance)      (higher is better; mirrored otherwise)

k (4) keeps a healthy node's chance of failing under 1 in 10,000 when the spread is normal;
min_margin (2.5%) keeps a metric with almost no spread (HBM copy: 0.02% run to run on the H200
of tests/fixtures/real) from failing on noise a job would never feel; max_margin (5%) is the
relative floor: a node 5% under its peers' median fails however noisy the peers are. With fewer
than min_peers peers an imported fleet baseline (baseline.py) is the median, with its own wider
margin (SuperBench's quick-scan rule: 10%); with neither, the result is inconclusive: never a
pass, never a fail.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from rsc_health.config import packaged_default
from rsc_health.qualify.outcome import Metric

PASS, FAIL, INCONCLUSIVE = "pass", "fail", "inconclusive"
# What a judgement was made against: enough peers, the imported baseline, or nothing yet.
PEERS, BASELINE, UNJUDGED = "peers", "baseline", "unjudged"


@dataclass(frozen=True)
class Rules:
    k: float = packaged_default("qualify.k")
    min_margin: float = packaged_default("qualify.min_margin")
    max_margin: float = packaged_default("qualify.max_margin")
    min_peers: int = packaged_default("qualify.min_peers")
    baseline_margin: float = packaged_default("qualify.baseline_margin")

    @classmethod
    def from_config(cls, cfg) -> Rules:
        return cls(**{f: float(cfg.get(f"qualify.{f}")) if f != "min_peers"
                      else int(cfg.get(f"qualify.{f}")) for f in cls.__dataclass_fields__})


@dataclass(frozen=True)
class Judgement:
    metric: str
    index: str
    value: float
    status: str
    reason: str
    basis: str                 # PEERS | BASELINE | UNJUDGED
    median: float | None = None
    threshold: float | None = None
    percentile: float | None = None   # share of peers at or below this value, 0..100
    peers: int = 0


def robust_spread(values: Sequence[float]) -> float:
    med = statistics.median(values)
    return 1.4826 * statistics.median(abs(v - med) for v in values)


def tolerance(rel_spread: float, k: float, min_margin: float, max_margin: float) -> float:
    """The relative distance from the peers' median at which a value fails: k x the peers'
    relative spread, never under min_margin nor over max_margin (the fail-slow detector,
    rsc_health/historian/failslow, draws its line with this too)."""
    return min(max(k * rel_spread, min_margin), max_margin)


def tolerances(rel_spread, k: float, min_margin, max_margin):
    """tolerance() of each element of arrays (numpy): the fail-slow detector draws a line for
    every node and slot at once."""
    import numpy as np

    return np.minimum(np.maximum(k * np.asarray(rel_spread, dtype=float), min_margin),
                      max_margin)


def judge(metric: Metric, peers: Sequence[float], *, baseline: float | None = None,
          rules: Rules = Rules()) -> Judgement:
    peers = [p for p in peers if p == p and p >= 0]  # a NaN or negative peer is no evidence
    if metric.exact:
        return _judge_count(metric, peers, baseline, rules)
    sign = 1.0 if metric.higher_is_better else -1.0
    if len(peers) >= rules.min_peers:
        med = statistics.median(peers)
        if med <= 0:
            # peers that measured nothing (a tool printing 0.00 fleet-wide) give no line: a
            # 0 would pass against them, and be stored as the next node's passing peer
            return Judgement(metric.name, metric.index, metric.value, INCONCLUSIVE,
                             f"its {len(peers)} peers' median is {med:g} {metric.unit}: "
                             "nothing to judge against", UNJUDGED, peers=len(peers))
        rel = robust_spread(peers) / med
        margin = tolerance(rel, rules.k, rules.min_margin, rules.max_margin)
        basis = PEERS
    elif baseline is not None and baseline > 0:
        med, margin, basis = baseline, rules.baseline_margin, BASELINE
    else:
        return Judgement(metric.name, metric.index, metric.value, INCONCLUSIVE,
                         f"{len(peers)} peer results (need {rules.min_peers}) and no baseline",
                         UNJUDGED, peers=len(peers))
    threshold = med * (1 - sign * margin)
    below = sum(1 for p in peers if p <= metric.value)
    percentile = round(100.0 * below / len(peers), 1) if peers else None
    off = (metric.value - med) / med * 100 if med else 0.0
    failed = metric.value < threshold if sign > 0 else metric.value > threshold
    where = f"{off:+.1f}% vs {basis} median {med:.4g} {metric.unit} (line {threshold:.4g})"
    return Judgement(metric.name, metric.index, metric.value, FAIL if failed else PASS,
                     where, basis, med, threshold, percentile, len(peers))


def _judge_count(metric: Metric, peers: list[float], baseline: float | None,
                 rules: Rules) -> Judgement:
    """A count of what was measured (Metric.exact): fewer than the peers' median (or the
    baseline) is less evidence than theirs, inconclusive; as many or more passes."""
    peer_med = statistics.median(peers) if len(peers) >= rules.min_peers else 0.0
    if peer_med > 0:
        med, basis = peer_med, PEERS
    elif baseline is not None and baseline > 0:
        med, basis = baseline, BASELINE
    else:
        return Judgement(metric.name, metric.index, metric.value, INCONCLUSIVE,
                         f"{len(peers)} peer results (need {rules.min_peers}) and no baseline",
                         UNJUDGED, peers=len(peers))
    if metric.value < med:
        return Judgement(metric.name, metric.index, metric.value, INCONCLUSIVE,
                         f"measured {metric.value:g} {metric.unit} where its {basis} measured "
                         f"{med:g}", basis, med, med, peers=len(peers))
    return Judgement(metric.name, metric.index, metric.value, PASS,
                     f"{metric.value:g} {metric.unit}, as its {basis} ({med:g})", basis, med,
                     med, peers=len(peers))
