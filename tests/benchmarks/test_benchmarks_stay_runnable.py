"""Benchmarks that import the product's internals run at a tiny scale and print sane BENCH
lines, so a change inside the product cannot break them unnoticed (the delivery refactor of
session 9 broke bench_historian_volume, found only when it was next run)."""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _bench(script: str, *args: str, timeout: float = 300) -> dict[str, tuple[float, str]]:
    env = dict(os.environ, RSC_BENCH_QUICK="1", PYTHONPATH=os.pathsep.join(
        [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]))
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / script), *args],
                          capture_output=True, text=True, env=env, timeout=timeout, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = {}
    for line in proc.stdout.splitlines():
        parts = line.split("\t")
        if parts[0] == "BENCH":
            assert len(parts) == 5, line
            out[parts[2]] = (float(parts[3]), parts[4])
    assert out, proc.stdout[-3000:]
    return out


def test_bench_historian_volume_delivers_a_small_fleet_into_sqlite():
    bench = _bench("bench_historian_volume.py", "--backend", "sqlite", "--nodes", "20",
                   "--hours", "0.5", "--big-spool-lines", "2000")
    lines, unit = bench["20n_lines_measured"]
    assert unit == "lines" and lines > 0
    assert 0 < bench["flush_peak_rss_measured"][0] < 1024
    assert all(math.isfinite(v) and v >= 0 for v, _ in bench.values())


@pytest.mark.slurm  # its own slurmctld: run in the Slurm group (tests/conftest.py)
@pytest.mark.skipif(shutil.which("slurmctld") is None or shutil.which("munged") is None,
                    reason="Slurm is not installed")
def test_bench_guard_load_measures_a_real_slurmctld_and_the_backoffs_saving():
    bench = _bench("bench_guard_load.py", "--nodes", "500", "--hours", "1", "--reads", "3")
    assert bench["500 nodes ms per table read"][0] > 0
    before, now = bench["500 nodes 1 h before"][0], bench["500 nodes 1 h now"][0]
    assert 0 < now < before  # fewer, cheaper tries: by arithmetic, not by timing luck


def test_bench_failslow_scores_a_small_simulated_fleet_and_the_real_traces():
    bench = _bench("bench_failslow.py", "--jobs", "20", "--seeds", "0", "--held-out", "101")
    for name in ("tuning", "held_out"):
        assert 0 <= bench[f"{name}_f1"][0] <= 1 and bench[f"{name}_f1"][1] == "ratio"
    assert bench["real_AR_stage_known_suspects"] == (1.0, "nodes")
    assert bench["real_SE_stage_known_suspects"] == (0.0, "nodes")
    # the study's truth as NVRx would score it: AR's one slowed worker, none in SE or ST
    assert bench["real_AR_as_NVRx_scores_suspects"] == (1.0, "nodes")
    assert bench["real_SE_as_NVRx_scores_suspects"] == (0.0, "nodes")
    assert bench["real_ST_as_NVRx_scores_suspects"] == (0.0, "nodes")


def test_bench_exporter_telemetry_keeps_the_aggregate_series_flat_as_the_fleet_grows():
    bench = _bench("bench_exporter_telemetry.py", "--nodes", "400")
    assert bench["aggregate_series_10x_fleet"] == (1.0, "ratio")
    assert bench["400_nodes_per_node_series"] == (2.0, "series")  # its 2 suspects alone


def test_bench_fleet_qualify_calibrates_a_small_fleet_to_the_papers_before_point():
    bench = _bench("bench_fleet_qualify.py", "--nodes", "256", "--jobs", "1000", "--shares", "0.2")
    none, unit = bench["bad20_big_job_fail_none"]
    assert unit == "%" and abs(none - 14.0) < 1.0  # the calibration point
    for name in ("lemon", "qualify"):
        assert 0 < bench[f"bad20_big_job_fail_{name}"][0] < none
    assert 90 < bench["bad20_schedulable_qualify"][0] <= 100


def test_bench_failslow_recurring_scores_a_small_fleet_history_and_its_guards():
    bench = _bench("bench_failslow_recurring.py")
    for variant in ("rule", "every_job", "node_set", "no_place", "fixed_count"):
        assert 0 <= bench[f"{variant}_recall"][0] <= 1
        assert bench[f"{variant}_false_per_1000_node_days"][0] >= 0
    # the rule flags a subset of what its count alone flags (the same placements, a chance
    # test on top): never more slow nodes, never more healthy ones
    assert bench["rule_recall"][0] <= bench["fixed_count_recall"][0]
    assert (bench["rule_false_per_1000_node_days"][0]
            <= bench["fixed_count_false_per_1000_node_days"][0])
