"""benchmarks/bench_pipeline.py at a tiny scale (32 nodes x 14 days, SQLite): every phase runs
and reports sane BENCH lines, so the paper-scale benchmark cannot rot unnoticed."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PHASES = ("ingest", "attribute", "analyze", "metrics", "lemons", "report")


def test_bench_pipeline_prints_sane_bench_lines(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]))
    env.pop("RSC_BENCH_QUICK", None)
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "bench_pipeline.py"), "--nodes", "32",
         "--days", "14", "--backend", "sqlite", "--work", str(tmp_path / "work")],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    bench: dict[tuple[str, str], tuple[float, str]] = {}
    for line in proc.stdout.splitlines():
        parts = line.split("\t")
        if parts[0] == "BENCH":
            assert len(parts) == 5, line
            bench[(parts[1], parts[2])] = (float(parts[3]), parts[4])
    assert bench[("pipeline", "nodes")] == (32.0, "nodes")
    assert bench[("pipeline", "sacct_rows")][0] > 1000
    for group, phases in (("pipeline_files", ("simulate", "read_csv")),
                          ("pipeline_sqlite", PHASES)):
        for name in phases:
            wall, unit = bench[(group, f"{name}_wall")]
            cpu, _ = bench[(group, f"{name}_cpu")]
            rss, rss_unit = bench[(group, f"{name}_peak_rss")]
            assert unit == "s" and rss_unit == "MiB"
            assert 0 <= wall < 60 and 0 <= cpu < 60, (name, wall, cpu)
            assert 20 < rss < 2000, (name, rss)  # a whole Python process, not the parent's
    ratio, unit = bench[("pipeline_sqlite", "ingest_vs_read_csv")]
    assert unit == "x" and math.isfinite(ratio) and 0 < ratio < 1000
    assert ("pipeline_postgres", "ingest_wall") not in bench  # --backend sqlite
    assert "pipeline: 32 nodes x 14 days" in proc.stdout
    assert not (tmp_path / "work").exists()  # the scratch directory is removed
