"""Lemon verdicts with the packaged defaults on simulated fleets the tuning never saw.

The whole pipeline runs: simulate (rsc_health.sim) -> ingest the real-format files -> attribute
-> features -> rules. The defaults were chosen by `healthctl tune-lemons` on seeds 1-10; seeds
101-103 are among its held-out seeds. Over all 15 held-out fleets it measured precision 0.89,
recall 0.78, FPR 0.0016 (the issue's goal is 0.9 / 0.85); these three fleets measured 0.91 /
0.83 / 0.0013. The floors below sit under that, so a broken feature, attribution or ingest
fails here; when the simulator's failure model changes on purpose, re-run tune-lemons and
update the [lemon] defaults and these numbers together.
"""

from __future__ import annotations

from rsc_health.historian.lemons.tune import labelled_from_sim, score
from rsc_health.historian.lemons.verdicts import LemonRules


def test_defaults_keep_precision_and_recall_on_held_out_seeds(tmp_path):
    fleets = [labelled_from_sim(seed, tmp_path, nodes=256, days=90) for seed in (101, 102, 103)]
    s = score(fleets, LemonRules.from_config())
    assert s.tp + s.fn == 12, s.to_dict()  # 1.5% of 256 nodes, three fleets
    assert s.precision >= 0.8, s.to_dict()
    assert s.recall >= 0.75, s.to_dict()
    assert s.fpr <= 0.003, s.to_dict()
