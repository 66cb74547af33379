"""bench_suspect_tier.py stays runnable at a tiny scale and its model answers sanely: the tier
keeps big jobs off suspects far more than no tier, and leaves suspects open to small jobs
(draining does not)."""

from __future__ import annotations

from tests.benchmarks.test_benchmarks_stay_runnable import _bench


def test_bench_suspect_tier_runs_and_its_ratios_are_sane():
    bench = _bench("bench_suspect_tier.py", "--nodes", "64", "--days", "3", "--seeds", "1")
    for mode in ("tier", "tier-timer"):
        jobs, unit = bench[f"{mode} exposure fall (jobs)"]
        assert unit == "ratio" and 0.5 <= jobs <= 1.0
        assert 0.98 <= bench[f"{mode} open to small jobs"][0] <= 1.0
