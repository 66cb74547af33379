"""An NVRx relative score of 5e-324 (a denormal: finite, positive, <= 1) passes _positive and
becomes 1/score = inf in step_times (steps.nvrx_rows), though "every value is checked
(finite, positive, bounded)". The row then wins every later upsert for its (job, node,
stage, step) (`excluded.seconds > seconds`) and is dropped by the detector (non-finite)."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta

from click.testing import CliRunner
from sqlalchemy import create_engine, text

from rsc_health.cli import cli


def test_a_denormal_nvrx_score_is_stored_as_an_infinite_time(tmp_path):
    url = f"sqlite:///{tmp_path / 'h.db'}"
    t = (datetime.now(UTC) - timedelta(minutes=5)).strftime("%Y-%m-%dT%H:%M:%SZ")
    line = json.dumps({"job_id": "1", "step": 10, "time": t, "rank_to_node": {"0": "n1"},
                       "gpu_relative_perf_scores": {"0": 5e-324}})
    out = CliRunner().invoke(cli, ["--db", url, "ingest", "steps", "--json", "-"],
                             input=line + "\n")
    assert out.exit_code == 0, out.output
    engine = create_engine(url)
    with engine.connect() as conn:
        stored = [r[0] for r in conn.execute(text("SELECT seconds FROM step_times"))]
    engine.dispose()
    assert all(math.isfinite(s) for s in stored), f"stored {stored}"
