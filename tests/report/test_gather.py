"""gather() against a real (SQLite) historian: the producers' frames reach every section."""

from __future__ import annotations

import json
from datetime import datetime, timedelta

import pytest
from sqlalchemy import insert

from rsc_health.historian.db import connect
from rsc_health.historian.schema import (
    attributions,
    check_results,
    job_nodes,
    jobs,
    node_actions,
)
from rsc_health.report.gather import GatherOptions, gather, guard_state
from rsc_health.report.render import write_report

AS_OF = datetime(2024, 6, 30)
# Explicit thresholds, so these tests do not move when the tuned [lemon] defaults do.
LEMON_RULES = {"strong": ["node_fails"], "node_fails": 3, "single_node_node_fails": 2,
               "min_signals": 2}


def _job(conn, pk: int, node: str, state: str, end: datetime, hours: float = 2.0,
         gpus: int = 8) -> None:
    start = end - timedelta(hours=hours)
    conn.execute(insert(jobs).values(
        id=pk, job_id=str(1000 + pk), job_id_display=str(1000 + pk), state=state,
        submit=start - timedelta(minutes=5), eligible=start - timedelta(minutes=5), start=start,
        end=end, nnodes=1, gpus=gpus, nodelist=node, instance_key=f"{1000 + pk}:{pk}:x"))
    conn.execute(insert(job_nodes).values(job_pk=pk, node=node))


def populate(engine) -> None:
    """Three nodes, two weeks of 8-GPU single-node jobs; gpu001 fails four of them on XIDs."""
    with engine.begin() as conn:
        pk = 0
        for day in range(1, 15):
            for node in ("gpu001", "gpu002", "gpu003"):
                pk += 1
                _job(conn, pk, node, "COMPLETED", AS_OF - timedelta(days=day))
        for day in (2, 4, 6, 8):
            pk += 1
            _job(conn, pk, "gpu001", "FAILED", AS_OF - timedelta(days=day, hours=5))
            conn.execute(insert(attributions).values(
                job_pk=pk, node="gpu001", cause="xid", code="xid79", evidence="c1", kind="check"))
        conn.execute(insert(node_actions).values(
            id="a1", time=AS_OF - timedelta(hours=3), node="gpu001", action="drain",
            reason="rsc_health:now:xid79:GPU has fallen off the bus", job_id="1050"))
        conn.execute(insert(node_actions).values(
            id="a2", time=AS_OF - timedelta(days=3), node="gpu002", action="resume",
            reason="", job_id=None))
        # All-clear rows as the node path writes them: gpu and xid ran from the start of the
        # check history, nvlink only from a week before AS_OF (a deployment for Fig. 5).
        for n, (family, days) in enumerate((("gpu", 20), ("xid", 20), ("nvlink", 7))):
            conn.execute(insert(check_results).values(
                id=f"ok{n}", time=AS_OF - timedelta(days=days), node="gpu002", source="sweep",
                check=family, component="*", status="ok", severity="none", code="", reason=""))


@pytest.fixture
def engine(tmp_path):
    engine = connect(f"sqlite:///{tmp_path / 'historian.db'}", create_missing=True)
    populate(engine)
    yield engine
    engine.dispose()


def test_gather_fills_sections_from_the_historian(engine, tmp_path):
    check_gathered(engine, tmp_path)


def check_gathered(engine, tmp_path) -> None:
    data = gather(engine, AS_OF, GatherOptions(metrics_days=30, lemon=LEMON_RULES))
    data.validate()
    # 8-GPU jobs only (no r_f, no ETTR), no heartbeats and no node events or failing XID
    # rows (no event-based reliability): those five sections say why.
    assert set(data.notes) == {"ettr", "rates", "stale", "node_events", "reliability"}, \
        data.notes
    # the four FAILED jobs have no exit code and no failing check row in the historian
    assert dict(zip(data.triage["label"], data.triage["jobs"], strict=True)) == {
        "host": 0, "user": 0, "unknown": 4}
    by_state = dict(zip(data.outcomes["state"], data.outcomes["jobs"], strict=True))
    assert by_state["COMPLETED"] == 42
    assert sum(by_state.values()) == 46
    assert list(data.causes["cause"]) == ["xid"]
    assert list(data.deployments["check"]) == ["nvlink"]
    assert list(data.deployments["time"]) == [AS_OF - timedelta(days=7)]
    assert set(data.features["node"]) == {"gpu001", "gpu002", "gpu003"}
    assert list(data.lemons["node"]) == ["gpu001"]
    evidence = " | ".join(data.lemons["evidence"].iloc[0])
    assert "single_node_node_fails=4" in evidence and "failed jobs:" in evidence
    # Only the last day's actions, and the guard did not hold anything.
    assert list(data.actions["node"]) == ["gpu001"]
    assert data.guard["state"] == "not triggered"

    assert {"job outcomes", "lemon features", "lemon verdicts"} <= set(data.timings)
    written = write_report(data, tmp_path / "out")
    assert "gpu001" in written.summary.read_text()
    assert json.loads(written.json.read_text())["timings_s"] == data.timings
    assert {f.section for f in written.figures if f.has_data} >= {"outcomes", "causes",
                                                                   "features", "mttf"}


def test_gather_on_an_empty_historian_still_renders(tmp_path):
    engine = connect(f"sqlite:///{tmp_path / 'empty.db'}", create_missing=True)
    data = gather(engine, AS_OF)
    engine.dispose()
    assert data.lemons.empty and data.actions.empty
    written = write_report(data, tmp_path / "out")
    assert "Lemon candidates: 0" in written.summary.read_text()


def test_guard_state_names_the_nodes_it_held():
    import pandas as pd

    actions = pd.DataFrame({"time": [AS_OF] * 3, "node": ["a", "b", "c"],
                            "action": ["drain_now", "guard_tripped", "guard_tripped"],
                            "reason": [""] * 3,
                            "job_id": [None] * 3})
    state = guard_state(actions, 24)
    assert state["state"] == "triggered" and state["held"] == 2
    assert "a" not in state["detail"].split(": ")[1] and "b, c" in state["detail"]


def test_ettr_section_averages_runs_by_size_with_a_t_interval():
    import pandas as pd

    from rsc_health.report.gather import ettr_section

    runs = pd.DataFrame({
        "gpus": [1024, 1024, 1024, 2048, 20],
        "measured_ettr": [0.8, 0.9, 1.0, 0.85, 0.95],
        "expected_ettr": [0.9, 0.9, 0.9, 0.8, 0.97],
    })
    out = ettr_section(runs).set_index("gpus")
    assert list(out.index) == [32, 1024, 2048]  # 20 GPUs -> 24 -> the 32 bucket
    assert out.at[1024, "measured"] == pytest.approx(0.9)
    # t(0.95, 2) = 2.919986; sd = 0.1; n = 3
    assert out.at[1024, "ci_high"] - 0.9 == pytest.approx(2.919986 * 0.1 / 3**0.5, rel=1e-5)
    assert out.at[1024, "runs"] == 3 and out.at[1024, "expected"] == pytest.approx(0.9)
    assert out.at[2048, "ci_low"] != out.at[2048, "ci_low"]  # one run: no interval (NaN)


def test_rolling_section_drops_the_partial_windows_at_the_start():
    import pandas as pd

    from rsc_health.report.gather import rolling_section

    dates = pd.date_range("2024-01-01", periods=90, freq="D")
    wide = pd.DataFrame({"date": dates, "node_days": 10.0, "total": 3.0, "xid": 1.0,
                         "mount": 2.0})
    long = rolling_section(wide, days=30)
    assert long["time"].min() == dates[29]
    assert set(long["mode"]) == {"xid", "mount"} and len(long) == 2 * 61
    short = rolling_section(wide.head(40), days=30)  # too short to trim: keep everything
    assert short["time"].min() == dates[0]


def test_skipped_sections_are_not_gathered_and_say_so(engine, tmp_path):
    opts = GatherOptions.from_config({"skip": ["goodput", "features"]}, LEMON_RULES)
    data = gather(engine, AS_OF, opts)
    assert data.notes["goodput"] == "skipped by [report] skip" and data.goodput.empty
    assert data.features.empty and data.lemons.empty
    assert "goodput lost" not in data.timings
    assert not data.outcomes.empty
    written = write_report(data, tmp_path)
    note = {f.section: f.note for f in written.figures}["goodput"]
    assert note == "skipped by [report] skip"
    assert "skipped by [report] skip" in written.html.read_text()


def test_unknown_skip_name_is_refused():
    with pytest.raises(ValueError, match="goodputt"):
        GatherOptions.from_config({"skip": ["goodputt"]}, {})


def test_evidence_lists_each_failed_job_once_with_all_its_causes():
    from types import SimpleNamespace

    from rsc_health.report.gather import lemon_evidence_lines

    verdict = SimpleNamespace(
        repeat_offender=False, resumed_at=None,
        crossings=[SimpleNamespace(feature="node_fails", value=4.0, threshold=3.0)],
        evidence={"failed_jobs": [
            {"job_id": "7", "state": "NODE_FAIL", "cause": "pcie"},
            {"job_id": "7", "state": "NODE_FAIL", "cause": "xid"},
            {"job_id": "9", "state": "FAILED", "cause": None},
        ]},
    )
    assert lemon_evidence_lines(verdict) == [
        "node_fails=4 >= 3", "failed jobs: 7 NODE_FAIL (pcie, xid), 9 FAILED"]


def test_a_young_cluster_report_says_why_ettr_is_empty_without_a_traceback(tmp_path, caplog):
    """Issue 14: the ETTR section of a cluster with no large job yet showed a ValueError and
    logged a traceback; it now says why, and logs nothing as a failure."""
    import logging

    engine = connect(f"sqlite:///{tmp_path / 'young.db'}", create_missing=True)
    with caplog.at_level(logging.WARNING):
        data = gather(engine, AS_OF)
    engine.dispose()
    assert data.notes["ettr"].startswith("no ETTR yet")
    assert "Error" not in data.notes["ettr"]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING and "ettr" in r.msg]


def _fabric_event_in_shadow_mode(engine, inventory: bool) -> None:
    """20 nodes of partition gpu; a fabric event: 12 of them say would_drain at the same
    sweep, and again at the next (shadow mode records every sweep's)."""
    from rsc_health.historian.schema import node_inventory, node_runs

    with engine.begin() as conn:
        for i in range(20):
            if inventory:
                conn.execute(insert(node_inventory).values(
                    node=f"n{i:02d}", partition="gpu", start=AS_OF - timedelta(days=30)))
            else:
                conn.execute(insert(node_runs).values(
                    node=f"n{i:02d}", source="sweep", last_seen=AS_OF - timedelta(minutes=2)))
        for sweep in (0, 5):
            for i in range(12):
                conn.execute(insert(node_actions).values(
                    id=f"w{sweep}-{i}", time=AS_OF - timedelta(hours=2, minutes=-sweep,
                                                              seconds=-i),
                    node=f"n{i:02d}", action="would_drain",
                    reason="rsc_health:job:ib_link:mlx5_0/1 link down"))


@pytest.mark.parametrize("inventory", [True, False])
def test_shadow_would_drains_in_a_fabric_event_are_capped_as_the_live_guard_would(
        tmp_path, inventory):
    """Shadow mode records would_drain for every node, and the guard was never applied: an
    operator saw 12 of 20 nodes drained where the live product (10% per 15 min) drains 2 and
    holds 10. The report applies the guard's arithmetic to the would-drains."""
    engine = connect(f"sqlite:///{tmp_path / 'historian.db'}", create_missing=True)
    try:
        check_shadow_capped(engine, tmp_path, inventory)
    finally:
        engine.dispose()


def check_shadow_capped(engine, tmp_path, inventory: bool) -> None:
    _fabric_event_in_shadow_mode(engine, inventory)
    data = gather(engine, AS_OF, GatherOptions(guard_max_share=0.10, guard_window_min=15))
    counts = data.actions["action"].value_counts().to_dict()
    assert counts == {"would_drain": 2, "would_be_held": 10}, counts
    assert list(data.actions[data.actions["action"] == "would_drain"]["node"]) == ["n00", "n01"]
    assert data.guard["shadow_held"] == 10
    assert "would have held 10" in data.guard["detail"]
    written = write_report(data, tmp_path / "out")
    summary = written.summary.read_text()
    assert "2 would_drain" in summary and "10 would_be_held" in summary
