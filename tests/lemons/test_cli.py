"""`healthctl lemons` end to end on a hand-built historian: dry run, --json, --apply."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner
from lemon_fleet import AS_OF, drained, fleet_slurm
from sqlalchemy import select

from rsc_health.cli import AppContext
from rsc_health.commands.lemons import lemons, parse_window
from rsc_health.historian.schema import tickets

DAY = timedelta(days=1)


@pytest.fixture
def history(fleet, engine):
    """bad: 6 XID events two days apart (6 episodes); person: a lemon too, but a person drained
    it; good: one job."""
    for node in ("bad", "person"):
        for k in range(6):
            fleet.xid(node, AS_OF - (2 * k + 1) * DAY, "xid79", f"gpu{k}")
    fleet.job(["good"], end=AS_OF - DAY)
    return engine


def history_slurm(nodes=None):
    """The history's nodes (bad, person, good) idle, but for `nodes`."""
    return fleet_slurm({"bad": ("IDLE", ""), "person": ("IDLE", ""), "good": ("IDLE", ""),
                        **(nodes or {})}, size=0)


def _obj(engine, slurm=None):
    # Thresholds spelled out here, so the tuned defaults can move without breaking the test.
    config = Path(engine.url.database).with_name("config.toml")
    config.write_text('[lemon]\nxid_cnt = 3\nstrong = ["xid_cnt"]\n')
    obj = AppContext(config_path=str(config), db_url=str(engine.url))
    if slurm is not None:
        obj.slurm = slurm
    return obj


def _run(engine, *args, slurm=None):
    result = CliRunner().invoke(
        lemons, ["--as-of", AS_OF.strftime("%Y-%m-%d"), *args], obj=_obj(engine, slurm)
    )
    assert result.exit_code == 0 or "cannot drain" in result.output, result.output
    return result


def test_dry_run_lists_candidates_with_evidence_and_touches_nothing(history):
    slurm = history_slurm({"person": ("IDLE+DRAIN", "fan noisy -- alice")})
    out = _run(history, slurm=slurm).output
    assert "2 of 3 nodes (dry run)" in out
    assert "bad: xid_cnt=6>=" in out
    assert "action: would_drain: rsc_health:lemon:xid_cnt:" in out
    assert "action: skip: human reason kept: fan noisy -- alice" in out
    assert "xid_events:" in out and "gpu0 xid79" in out
    assert drained(slurm) == []


def test_json_carries_verdicts_crossings_evidence_and_actions(history):
    doc = json.loads(_run(history, "--json", slurm=history_slurm()).output)
    assert doc["nodes"] == 3 and doc["applied"] is False
    by_node = {v["node"]: v for v in doc["verdicts"]}
    assert set(by_node) == {"bad", "person"}
    bad = by_node["bad"]
    assert {"feature": "xid_cnt", "value": 6.0, "threshold": bad["crossings"][0]["threshold"]} in (
        bad["crossings"]
    )
    assert len(bad["evidence"]["xid_events"]) == 6
    assert bad["action"]["action"] == "would_drain"


def test_apply_drains_and_opens_tickets_but_keeps_the_human_drain(history):
    slurm = history_slurm({"person": ("IDLE+DRAIN", "fan noisy -- alice")})
    _run(history, "--apply", slurm=slurm)
    assert [n for n, _ in drained(slurm)] == ["bad"]
    with history.connect() as conn:
        rows = conn.execute(select(tickets.c.node, tickets.c.source)).all()
    assert rows == [("bad", "lemon")]


def dead_slurm():
    slurm = history_slurm()
    slurm.stop()  # slurmctld not responding
    return slurm


def test_apply_refuses_when_slurm_is_unreachable_and_a_dry_run_still_lists(history):
    result = _run(history, "--apply", slurm=dead_slurm())
    assert result.exit_code != 0
    assert "cannot drain: Unable to contact slurm controller" in result.output
    out = _run(history, slurm=dead_slurm()).output
    assert "bad: xid_cnt" in out and "Slurm not consulted" in out


def test_window_shrinks_what_is_counted(history):
    doc = json.loads(_run(history, "--json", "--window", "3d", slurm=history_slurm()).output)
    assert all(c["value"] == 3 for v in doc["verdicts"] for c in v["crossings"])


@pytest.mark.parametrize("text,days", [("28d", 28), ("4w", 28), ("36h", 1.5), ("7", 7)])
def test_parse_window(text, days):
    assert parse_window(text) == days
