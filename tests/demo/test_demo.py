"""`healthctl demo` runs the whole product end to end on an embedded SQLite historian."""

from __future__ import annotations

import json

from click.testing import CliRunner

from rsc_health.cli import cli


def test_demo_writes_report_and_compares_with_ground_truth(tmp_path):
    out = tmp_path / "demo"
    result = CliRunner().invoke(
        cli, ["demo", "--out", str(out), "--nodes", "48", "--days", "20", "--seed", "3", "--json"]
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    truth = json.loads((out / "sim" / "truth.json").read_text())

    assert doc["lemons_planted"] == sorted(truth["lemon_nodes"])
    assert doc["jobs"] > 1000 and doc["job_instances"] >= doc["jobs"]
    assert (out / "report" / "report.html").stat().st_size > 0
    assert (out / "report" / "summary.txt").read_text().strip()
    assert doc["database_url"] == f"sqlite:///{out / 'historian.db'}"
    # The demo reads back what it ingested, not numbers of its own.
    assert doc["rf_node_days"] > 0
    assert doc["rf_ci_per_1000"][0] <= doc["rf_est_per_1000"] <= doc["rf_ci_per_1000"][1]
    # Issue 24: what qualification prevented in the fleet model, two lines.
    first, second = doc["qualification"]
    assert "with qualification + lemon drains" in first and "schedulable" in first
    prevented, failed = (int(x) for x in second.split("prevented: ")[1].split(" (")[0]
                         .split(" of "))
    assert 0 < prevented <= failed


def test_demo_historian_charges_goodput_to_the_preemptions_failure_requeues_caused(tmp_path):
    """Fig. 8: a big job requeued after a failure preempts jobs that ran two hours; the
    historian's goodput metric finds them (ended PREEMPTED as the requeue started, on its
    nodes) among what it charges to preemption."""
    from rsc_health.historian import db
    from rsc_health.historian.metrics.goodput import goodput_lost

    out = tmp_path / "demo"
    result = CliRunner().invoke(
        cli, ["demo", "--out", str(out), "--nodes", "128", "--days", "30", "--seed", "3",
              "--json"]
    )
    assert result.exit_code == 0, result.output
    truth = json.loads((out / "sim" / "truth.json").read_text())
    victims = {j for f in truth["failures"] for j in f["preempted_jobs"]}
    assert victims
    engine = db.connect(json.loads(result.output)["database_url"])
    try:
        lost = goodput_lost(engine)
    finally:
        engine.dispose()
    pre = lost[lost["kind"] == "preemption"]
    assert pre["jobs"].sum() >= len(victims)
    assert pre["gpu_hours_lost"].sum() > 0
