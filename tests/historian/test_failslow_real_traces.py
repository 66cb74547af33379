"""The fail-slow detector on real per-rank traces: ByteDance's straggler study's three sample
jobs (tests/fixtures/failslow/README.md): the worker slowed on purpose is the one suspect; a
job slowed by its sequence lengths or by a long last stage has none. Also as NVRx straggler
reports would score them, through the job-side writer, `healthctl ingest steps` and `detect`."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from rsc_health.config import load_config
from rsc_health.historian.failslow import detect_frame
from rsc_health.historian.failslow.core import Rules

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from _straggler_traces import nvrx_reports, step_frame  # noqa: E402

RULES = Rules.from_config(load_config(None))


@pytest.mark.parametrize("stage_known", [True, False])
def test_the_worker_slowed_on_purpose_is_the_only_suspect(stage_known):
    steps, members = step_frame("AR", RULES.slot_s)
    if not stage_known:
        steps, members = steps.assign(stage=""), members.drop(columns="stage")
    found = detect_frame(None, members, steps, RULES)
    assert [(e.node, e.source, e.job_ids) for e in found] == [("AR-dp0-pp0", "steps", ("AR",))]
    assert found[0].value / found[0].peer_median > 2.0


@pytest.mark.parametrize("trace", ["SE", "ST"])
@pytest.mark.parametrize("stage_known", [True, False])
def test_workload_imbalance_makes_no_suspect(trace, stage_known):
    steps, members = step_frame(trace, RULES.slot_s)
    if not stage_known:
        steps, members = steps.assign(stage=""), members.drop(columns="stage")
    assert detect_frame(None, members, steps, RULES) == []


def test_the_long_last_stage_trace_with_its_stages_known_is_not_judged_at_all():
    """ST runs dp 2 x pp 4: two workers a stage, under min_nodes, so with the stages known no
    group is judged and "no suspect" says nothing; ST is a test of the detector only without
    its stages (every worker one group), as NVRx's scores and a drop file without stages are."""
    from rsc_health.historian.failslow.core import judged

    steps, members = step_frame("ST", RULES.slot_s)
    assert members.groupby("stage")["node"].nunique().max() < RULES.min_nodes
    assert judged(None, members, steps, RULES).empty
    assert len(judged(None, members.drop(columns="stage"), steps.assign(stage=""), RULES)) == 256


@pytest.mark.parametrize("trace, truth", [("AR", {"AR-dp0-pp0"}), ("SE", set()), ("ST", set())])
def test_the_traces_as_nvrx_reports_through_the_writer_ingest_and_detect(
        trace, truth, historian, tmp_path):
    """Each traced step as the report NVRx would make of it (a section's score: the fastest
    rank's median time over the rank's, here the step's compute time), written by
    rsc_health/nvrx_lines.py, ingested and judged by `detect` from the historian. NVRx names
    no pipeline stage, so the traces are judged as jobs without stages. The truth is the
    study's (AR's slowed worker; SE and ST are workload imbalance), not the detector's."""
    from datetime import UTC, datetime, timedelta

    from sqlalchemy import insert

    from rsc_health.historian import schema
    from rsc_health.historian.failslow import detect
    from rsc_health.historian.ingest import steps
    from rsc_health.nvrx_lines import report_lines

    now = datetime.now(UTC).replace(tzinfo=None, microsecond=0)
    reports = list(nvrx_reports(trace))
    start = now - timedelta(seconds=RULES.slot_s * (len(reports) + 2))
    lines = []
    for k, (step, report) in enumerate(reports):
        when = start + timedelta(seconds=RULES.slot_s * k + RULES.slot_s // 2)
        lines += report_lines(report, step=step, job_id=trace, when=when)
    (tmp_path / f"{trace}.jsonl").write_text("".join(line + "\n" for line in lines))
    loaded = steps.ingest_path(historian, tmp_path / f"{trace}.jsonl",
                               steps.Limits.from_config(load_config(None)))
    nodes = sorted({n for _, r in reports for n in r["rank_to_node"].values()})
    assert loaded.bad == [] and loaded.read == len(lines) == len(nodes) * len(reports)
    with historian.begin() as conn:
        pk = conn.execute(insert(schema.jobs).values(
            job_id=trace, job_id_display=trace, state="RUNNING", submit=start, start=start,
            end=None, nnodes=len(nodes), instance_key=f"{trace}:{start}")
            .returning(schema.jobs.c.id)).scalar_one()
        conn.execute(insert(schema.job_nodes), [{"job_pk": pk, "node": n} for n in nodes])
    site = tmp_path / "config.toml"
    site.write_text(f"[failslow]\nlookback_min = {5 * (len(reports) + 3)}\n")
    found = detect(historian, now, load_config(site))
    assert {e.node for e in found} == truth
    assert all(e.source == "steps" and e.job_ids == (trace,) for e in found)
