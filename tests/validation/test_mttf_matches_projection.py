"""MTTF by job size (Fig. 7) against the projection 1/(N_nodes r_f) from the simulator's truth.

Truth per bucket: the bucket's job runtime over its expected injected failures (each job's nodes
times their intensity from truth.json, plus the lemons' own single-node job kills). Buckets with
at least 5 failures are held to their 90% Gamma interval, allowing the misses a Binomial(n, 0.1)
exceeds with 1% probability."""

from __future__ import annotations

import pandas as pd
from scipy import stats
from validation_harness import validate


def test_measured_mttf_per_size_inside_its_interval_around_the_projection(fleets, rf_rows):
    m = pd.concat([validate.mttf_check(f, r["rf_est"] / 1000)
                   for f, r in zip(fleets, rf_rows, strict=True)])
    tested = m[m["failures"] >= 5]
    assert len(tested) >= 5 * len(fleets), tested  # most buckets of every fleet are tested
    misses = tested[~tested["inside"]]
    allowed = int(stats.binom.ppf(0.99, len(tested), 1 - validate.CONFIDENCE))
    assert len(misses) <= allowed, misses.to_string()
    # The paper's law: MTTF falls as 1/N. Largest bucket fails at least 32x as often as 8 GPUs.
    for _, per_seed in tested.groupby("seed"):
        by = per_seed.set_index("gpus")["mttf_hours"]
        assert by[by.index.max()] * 32 <= by[by.index.min()], per_seed.to_string()
