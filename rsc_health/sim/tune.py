"""Choose lemon thresholds on ground truth: a grid over the rules, scored by precision, recall
and false-positive rate.

The ground truth is the fleet simulator's (`truth.json`: which nodes are lemons). Tuning seeds
choose the thresholds; held-out seeds report the accuracy, so the numbers we quote were not
fitted. Scoring is pooled over seeds (sum the confusion counts, then divide).

Choice rule: among grid points whose pooled precision reaches `target_precision`, take the
highest recall, then the fewest false positives; among the points still tied, the one nearest
the middle of the tied plateau (robust to the next fleet), then the most conservative. When no
point reaches the target precision, take the best F1.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd

from rsc_health.historian.lemons.verdicts import (
    PEER_GATED_RULES,
    RATE_RULES,
    LemonRules,
    above_peer_rate,
    selective_in_group,
)

# The knobs the tuning moves. Rules not named here are off while tuning (the failure-rate and
# early-fail rules drown in users' own failures: a quarter of single-node jobs fail anyway).
# `strong` lists the rules that make a candidate on their own.
DEFAULT_GRID: dict[str, list] = {
    "min_signals": [1, 2, 3],
    "strong": [(), ("xid_cnt",), ("xid_cnt", "tickets_history")],
    "node_fails": [0, 3, 4],
    "single_node_node_fails": [0, 2],
    "xid_cnt": [0, 4, 5],
    "tickets": [0, 2],
    "out_count": [0, 2, 3],
    "repeat_outs": [0, 2],
    "tickets_history": [0, 2, 3, 4],
    "out_count_history": [0, 3, 4],
    "down_outs_history": [0, 2],
}


@dataclass(frozen=True)
class Labelled:
    """One simulated fleet: its features, the true lemons and every node that existed."""

    features: pd.DataFrame
    lemons: frozenset[str]
    nodes: frozenset[str]


@dataclass
class Score:
    tp: int
    fp: int
    fn: int
    tn: int

    @property
    def precision(self) -> float:
        return self.tp / (self.tp + self.fp) if self.tp + self.fp else 1.0

    @property
    def recall(self) -> float:
        return self.tp / (self.tp + self.fn) if self.tp + self.fn else 1.0

    @property
    def fpr(self) -> float:
        return self.fp / (self.fp + self.tn) if self.fp + self.tn else 0.0

    @property
    def f1(self) -> float:
        p, r = self.precision, self.recall
        return 2 * p * r / (p + r) if p + r else 0.0

    def __add__(self, other: Score) -> Score:
        return Score(self.tp + other.tp, self.fp + other.fp, self.fn + other.fn, self.tn + other.tn)

    def to_dict(self) -> dict:
        return {
            **asdict(self),
            "precision": self.precision,
            "recall": self.recall,
            "fpr": self.fpr,
            "f1": self.f1,
        }


class _Compiled:
    """A fleet's features as numpy arrays, so a grid of thousands of points stays fast."""

    def __init__(self, data: Labelled):
        nodes = sorted(data.nodes | data.lemons | set(data.features.index))
        f = data.features.reindex(nodes).fillna(0)
        self.cols = {c: f[c].to_numpy(dtype=float) for c in f.columns
                     if pd.api.types.is_numeric_dtype(f[c])}
        self.truth = np.array([n in data.lemons for n in nodes])
        self.single_jobs = self.cols.get("single_node_jobs", np.zeros(len(nodes)))
        self.features = f
        self._peers: dict[float, np.ndarray] = {}
        self._selective: dict[tuple[str, float, float], np.ndarray] = {}

    def above_peers(self, ratio: float) -> np.ndarray:
        if ratio not in self._peers:
            self._peers[ratio] = above_peer_rate(self.features, ratio).to_numpy()
        return self._peers[ratio]

    def selective(self, feat: str, threshold: float, count_rule_p: float) -> np.ndarray:
        key = (feat, threshold, count_rule_p)
        if key not in self._selective:
            self._selective[key] = selective_in_group(
                self.features, feat, threshold, count_rule_p).to_numpy()
        return self._selective[key]

    def predict(self, rules: LemonRules) -> np.ndarray:
        hits = np.zeros(len(self.truth), dtype=int)
        strong = np.zeros(len(self.truth), dtype=bool)
        for feat, threshold in rules.thresholds.items():
            if threshold <= 0 or feat not in self.cols:
                continue
            crossed = self.cols[feat] >= threshold
            if feat in RATE_RULES:
                crossed &= self.single_jobs >= rules.min_single_node_jobs
            if feat in PEER_GATED_RULES:
                crossed &= self.above_peers(rules.peer_q) | self.selective(
                    feat, threshold, rules.count_rule_p)
            hits += crossed
            if feat in rules.strong:
                strong |= crossed
        return (hits >= rules.min_signals) | strong

    def score(self, rules: LemonRules) -> Score:
        pred = self.predict(rules)
        t = self.truth
        return Score(
            int((pred & t).sum()),
            int((pred & ~t).sum()),
            int((~pred & t).sum()),
            int((~pred & ~t).sum()),
        )


def score(fleets: Sequence[Labelled], rules: LemonRules) -> Score:
    total = Score(0, 0, 0, 0)
    for fleet in fleets:
        total = total + _Compiled(fleet).score(rules)
    return total


def grid_points(base: LemonRules, grid: Mapping[str, Iterable]) -> Iterable[dict]:
    keys = list(grid)
    for values in itertools.product(*(list(grid[k]) for k in keys)):
        yield dict(zip(keys, values, strict=True))


def tuning_base(rules: LemonRules) -> LemonRules:
    """The configured rules with every threshold off: the grid turns on what it tries."""
    return rules.with_thresholds(**{k: 0.0 for k in rules.thresholds})


def rules_for(base: LemonRules, point: Mapping) -> LemonRules:
    thresholds = {k: float(v) for k, v in point.items() if k in base.thresholds}
    rules = base.with_thresholds(**thresholds)
    return replace(
        rules,
        min_signals=int(point.get("min_signals", rules.min_signals)),
        strong=tuple(point.get("strong", rules.strong)),
    )


def run_grid(
    fleets: Sequence[Labelled], base: LemonRules, grid: Mapping[str, Iterable] = DEFAULT_GRID
) -> pd.DataFrame:
    """One row per grid point: the point's values, then pooled tp/fp/fn/tn, precision, recall,
    fpr and f1."""
    compiled = [_Compiled(f) for f in fleets]
    rows = []
    for point in grid_points(base, grid):
        rules = rules_for(base, point)
        total = Score(0, 0, 0, 0)
        for c in compiled:
            total = total + c.score(rules)
        rows.append({**point, **total.to_dict()})
    return pd.DataFrame(rows)


def _conservative_key(column: pd.Series) -> pd.Series:
    """Order a grid column from trigger-happy to conservative. 0 means "rule off": fewer rules
    can fire, so it is the most conservative value of all; fewer strong rules is more careful."""
    if column.name == "strong":
        return -column.map(len)
    return column.replace(0, np.inf)


def choose(results: pd.DataFrame, grid_keys: Sequence[str], target_precision: float = 0.9):
    """The chosen row (see the module docstring for the rule).

    With few lemons per fleet many grid points tie; taking the edge of that plateau (e.g. the
    highest XID threshold that still catches the same lemons) overfits the tuning seeds. So the
    tie goes to the point nearest the middle of the tied set, key by key in rank units, and
    only then to the most conservative point."""
    ok = results[results["precision"] >= target_precision]
    if ok.empty:
        return results.sort_values("f1", ascending=False, kind="stable").iloc[0]
    best = ok[ok["recall"] == ok["recall"].max()]
    best = best[best["fp"] == best["fp"].min()]
    distance = pd.Series(0.0, index=best.index)
    for k in grid_keys:
        order = _conservative_key(results[k])
        ranks = order.rank(method="dense")
        span = max(ranks.max() - 1, 1)
        tied_ranks = ranks.loc[best.index]
        distance += (tied_ranks - tied_ranks.median()).abs() / span
    ranked = best.assign(
        _d=distance, **{f"_c{i}": _conservative_key(best[k]) for i, k in enumerate(grid_keys)}
    )
    order = ["_d"] + [f"_c{i}" for i in range(len(grid_keys))]
    asc = [True] + [False] * len(grid_keys)
    return ranked.sort_values(order, ascending=asc, kind="stable").iloc[0][results.columns]


def labelled_from_sim(
    seed: int,
    workdir: Path,
    *,
    nodes: int = 256,
    days: float = 90,
    window_days: float = 28,
    history_days: float = 90,
    progress=None,
    outages=None,
    **sim_settings,
) -> Labelled:
    """Simulate one fleet, ingest it into a fresh SQLite historian, attribute the failures and
    compute the features at the end of the simulated period (as a nightly run would).
    `sim_settings` go to SimConfig (e.g. maintenance_drains, fleet_events); `outages` (an
    OutageRules) to the features."""
    from rsc_health.sim.config import SimConfig
    from rsc_health.sim.historian import simulated_historian

    fleet = simulated_historian(SimConfig(nodes=nodes, days=days, seed=seed, **sim_settings),
                                Path(workdir) / f"seed{seed}", progress=progress)
    return labelled_from_historian(fleet, window_days=window_days, history_days=history_days,
                                   outages=outages)


def labelled_from_historian(fleet, *, window_days: float = 28, history_days: float = 90,
                            outages=None) -> Labelled:
    """The features of a simulated historian (`rsc_health.sim.historian.simulated_historian`)
    at the end of its period, labelled with its truth. One fleet may be labelled under several
    `outages` rules without simulating and ingesting it again."""
    from rsc_health.historian import db as hdb
    from rsc_health.historian.lemons.features import lemon_features
    from rsc_health.hostlist import expand

    engine = hdb.connect(fleet.url, create_missing=True)
    try:
        features = lemon_features(engine, fleet.as_of, window_days, history_days=history_days,
                                  outages=outages)
    finally:
        engine.dispose()
    truth = fleet.truth
    every = {n for hosts in truth["partitions"].values() for n in expand(hosts)}
    return Labelled(features, frozenset(truth["lemon_nodes"]), frozenset(every))
