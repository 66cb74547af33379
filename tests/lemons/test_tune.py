"""Threshold tuning on labelled features: pooled scores by hand, and the choice rule."""

from __future__ import annotations

import pandas as pd
import pytest

from rsc_health.historian.lemons.verdicts import LemonRules
from rsc_health.sim.tune import Labelled, choose, run_grid, score


def _fleet(rows: dict[str, dict], lemons: set[str], extra_nodes: int = 0) -> Labelled:
    cols = ("node_fails", "xid_cnt", "single_node_jobs", "tickets")
    f = pd.DataFrame.from_dict(
        {n: {c: r.get(c, 0) for c in cols} for n, r in rows.items()}, orient="index"
    )
    nodes = set(rows) | {f"quiet{k}" for k in range(extra_nodes)}
    return Labelled(f, frozenset(lemons), frozenset(nodes))


def _rules(**kw) -> LemonRules:
    base = {
        k: 0
        for k in (
            "multi_node_node_fails",
            "single_node_node_fails",
            "single_node_node_failure_rate",
            "single_node_fail_rate_any",
            "early_fails",
            "out_count",
            "repeat_outs",
            "tickets",
            "xid_cnt",
        )
    }
    return LemonRules.from_config({**base, "strong": ["node_fails"], **kw})


FLEET_A = _fleet(
    {
        "lemon1": {"node_fails": 5},
        "lemon2": {"node_fails": 2, "xid_cnt": 4},
        "noisy": {"node_fails": 3},
        "fine": {"node_fails": 1},
    },
    {"lemon1", "lemon2", "never_seen_lemon"},
    extra_nodes=6,
)


def test_pooled_score_counts_unseen_lemons_as_misses_and_quiet_nodes_as_negatives():
    s = score([FLEET_A], _rules(node_fails=3))
    # flagged: lemon1, noisy. lemons: lemon1, lemon2, never_seen_lemon.
    assert (s.tp, s.fp, s.fn) == (1, 1, 2)
    # negatives: noisy, fine and six quiet nodes = 8, one of them flagged
    assert s.tn == 7
    assert s.precision == pytest.approx(0.5)
    assert s.recall == pytest.approx(1 / 3)
    assert s.fpr == pytest.approx(1 / 8)
    doubled = score([FLEET_A, FLEET_A], _rules(node_fails=3))
    assert (doubled.tp, doubled.fp, doubled.fn, doubled.tn) == (2, 2, 4, 14)


def test_choice_prefers_recall_at_the_target_precision_then_conservative_thresholds():
    grid = {"node_fails": [2, 3, 4, 5, 6], "xid_cnt": [0, 3, 4]}
    results = run_grid([FLEET_A], _rules(), grid)
    assert len(results) == 15
    best = choose(results, list(grid), target_precision=0.9)
    # node_fails is strong: at 4..6 it flags lemon1 alone (precision 1, recall 1/3); at 2..3 it
    # also flags noisy. xid_cnt is one weak rule, below min_signals=2, so it never adds a node.
    # Among the precision-1 points recall ties at 1/3: node_fails 4 or 5 (6 misses lemon1's 5)
    # times xid_cnt 0 (off), 3 or 4. The middle of that plateau is xid_cnt 4 (in the order
    # 3 < 4 < off); node_fails 4 and 5 are equally central, so the more conservative 5 wins.
    assert best["precision"] == 1.0
    assert best["recall"] == pytest.approx(1 / 3)
    assert (best["node_fails"], best["xid_cnt"]) == (5, 4)


def test_min_signals_lets_two_weak_rules_catch_what_one_strong_rule_misses():
    grid = {"node_fails": [5], "xid_cnt": [3], "min_signals": [1, 2]}
    # a second weak rule: node_fails also counts as a plain rule when min_signals allows it
    results = run_grid([FLEET_A], _rules(), grid).set_index("min_signals")
    # min_signals=1: every crossed rule flags -> lemon1 (node_fails) and lemon2 (xid_cnt)
    assert results.loc[1, "tp"] == 2 and results.loc[1, "fp"] == 0
    assert results.loc[2, "tp"] == 1
