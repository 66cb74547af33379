"""Qualification's driver/firmware-change trigger ([qualify] on_driver_change): a node whose
heartbeats said a new driver or GPU firmware since its last pass is due for `qualify auto`
once idle, qualified undrained in its reservation like a suspect; never a busy, drained or
DOWN node, never again after a pass, and not at all with the switch off (the default). On the
shipped MemorySlurm and a real SQLite historian fed through delivery."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta

from click.testing import CliRunner
from sqlalchemy import insert

from rsc_health import spool
from rsc_health.cli import AppContext
from rsc_health.commands.qualify import qualify
from rsc_health.historian.ingest.delivery import deliver
from rsc_health.historian.schema import qualify_runs
from rsc_health.qualify.flow import driver_candidates
from rsc_health.qualify.judge import PASS
from rsc_health.slurm.api import NodeInfo
from rsc_health.slurm.memory import MemorySlurm

NOW = datetime(2026, 11, 26, 12, 0)
CHANGED = datetime(2026, 11, 26, 9, 0)
OLD = "driver=570.133.20 vbios=96.00.AF.00.01"
NEW = "driver=580.95.05 vbios=96.00.AF.00.01"


class History:
    def __init__(self, passed=None, streaks=None):
        self.passed, self.streaks = passed or {}, streaks or {}

    def passed_since(self, node, since):
        return any(t > since for t in self.passed.get(node, ()))

    def inconclusive_streak(self, node):
        return self.streaks.get(node, (0, None))


def due(nodes, changed, hist, limit=10):
    return driver_candidates(nodes, changed, hist, NOW, retry_min=30, retry_max_min=720,
                             limit=limit)


def test_an_idle_node_with_a_new_driver_is_due_once_and_says_what_changed():
    nodes = [NodeInfo("a", "IDLE"), NodeInfo("b", "IDLE")]
    changed = {"a": (CHANGED, OLD, NEW), "b": (CHANGED, OLD, NEW)}
    hist = History(passed={"b": [CHANGED + timedelta(minutes=20)]})  # proved itself since
    assert due(nodes, changed, hist) == [
        ("a", f"driver/firmware changed 2026-11-26 09:00: {OLD} -> {NEW}")]


def test_a_busy_drained_down_or_rebooting_node_is_not_taken():
    nodes = [NodeInfo("busy", "ALLOCATED"), NodeInfo("mixed", "MIXED"),
             NodeInfo("drained", "IDLE+DRAIN", "alice: BIOS"), NodeInfo("down", "DOWN"),
             NodeInfo("reboot", "IDLE+REBOOT_REQUESTED"), NodeInfo("res", "IDLE+RESERVED")]
    changed = {n.name: (CHANGED, OLD, NEW) for n in nodes}
    assert due(nodes, changed, History()) == []


def test_an_inconclusive_run_after_the_change_backs_off_and_the_oldest_change_goes_first():
    nodes = [NodeInfo(n, "IDLE") for n in ("x", "y", "z")]
    changed = {"x": (CHANGED, OLD, NEW), "y": (CHANGED - timedelta(hours=3), OLD, NEW),
               "z": (CHANGED - timedelta(hours=1), OLD, NEW)}
    hist = History(streaks={"x": (2, NOW - timedelta(minutes=59)),   # 60 min: not yet
                            "z": (1, NOW - timedelta(minutes=31))})  # 30 min: due
    assert [n for n, _ in due(nodes, changed, hist)] == ["y", "z"]
    assert [n for n, _ in due(nodes, changed, hist, limit=1)] == ["y"]


def test_a_hostile_version_text_is_cut_in_the_reason():
    changed = {"a": (CHANGED, "driver=" + "9" * 400, "driver=" + "8" * 400)}
    (_, why), = due([NodeInfo("a", "IDLE")], changed, History())
    assert len(why) < 300


# ---- the command, end to end ------------------------------------------------------------------


def _heartbeats(engine, tmp_path, node_versions):
    t0 = datetime.now(UTC) - timedelta(hours=2)
    records = []
    for node, drivers in node_versions.items():
        for k, driver in enumerate(drivers):
            records.append(spool.record(
                "heartbeat", node, t0 + timedelta(minutes=10 * k), source="sweep", level="ok",
                checker_errors=0, duration_s=0.3, families={}, version="t",
                versions={"driver": driver, "vbios": {"0": "96.00.AF.00.01"}}))
    d = tmp_path / "spool"
    d.mkdir()
    spool.append(d, records)
    assert deliver(engine, d).quarantined_count == 0


def test_qualify_auto_takes_a_node_whose_driver_changed_undrained_and_releases_it_on_a_pass(
        db, tmp_path):
    url, engine = db
    _heartbeats(engine, tmp_path, {"gpu050": ["570.133.20", "580.95.05"],
                                   "gpu051": ["580.95.05", "580.95.05"],
                                   "gpu052": ["570.133.20", "580.95.05"]})
    slurm = MemorySlurm()
    for name in ("gpu050", "gpu051", "gpu052"):
        slurm.add_node(name, "IDLE")
    slurm.start_job("gpu052")  # busy: waits for its job to end
    off, on = tmp_path / "off.toml", tmp_path / "on.toml"
    off.write_text("")
    on.write_text("[qualify]\non_driver_change = true\nflow_timeout_s = 30\n")

    def obj(config):
        o = AppContext(config_path=str(config), db_url=url)
        o.slurm = slurm
        return o

    quiet = CliRunner().invoke(qualify, ["auto", "--dry-run"], obj=obj(off))
    assert quiet.exit_code == 0 and "no node is due" in quiet.output, quiet.output
    dry = CliRunner().invoke(qualify, ["auto", "--dry-run"], obj=obj(on))
    assert dry.exit_code == 0, dry.output
    assert "gpu050: driver/firmware changed" in dry.output
    assert "driver=570.133.20 vbios=96.00.AF.00.01 -> driver=580.95.05" in dry.output
    assert "gpu051" not in dry.output and "gpu052" not in dry.output

    def job_passes():  # the qualification job stores its pass, then ends
        job_id = [c[1] for c in slurm.calls if c[0] == "submit"][-1]
        now = datetime.now(UTC).replace(tzinfo=None) + timedelta(seconds=2)
        with engine.begin() as conn:
            conn.execute(insert(qualify_runs).values(
                run_id=uuid.uuid4().hex, node="gpu050", tier="full",
                started=now - timedelta(minutes=9), ended=now, verdict=PASS, reason="",
                gpu_model="NVIDIA H100 80GB HBM3", driver="580.95.05", job_id=job_id))
        slurm.start_job("gpu050", job_id)
        slurm.end_job(job_id)

    slurm.after("submit", job_passes)
    out = CliRunner().invoke(qualify, ["auto"], obj=obj(on))
    assert out.exit_code == 0, out.output
    assert "gpu050: driver/firmware changed" in out.output and "-> pass" in out.output
    n = slurm.node("gpu050")
    assert not n.drain_set and not slurm.reservations()
    assert not [c for c in slurm.calls if c[0] in ("resume", "drain")]  # taken as it was
    again = CliRunner().invoke(qualify, ["auto", "--dry-run"], obj=obj(on))
    assert "no node is due" in again.output, again.output


def test_a_fail_the_guard_held_back_backs_off_like_an_inconclusive_run():
    """The mass-drain guard held a fail's drain back: the node stays in service as it came,
    its stored verdict a fail (no inconclusive streak), its suspect episode open and its
    driver change unproved. It was due again at the very next `qualify auto` (every 10
    minutes), reserved and burned again while the guard stays tripped; now it waits
    retry_min after that run, as after an inconclusive one."""
    from types import SimpleNamespace

    from rsc_health.qualify.flow import suspect_candidates

    nodes = [NodeInfo("a", "IDLE"), NodeInfo("b", "IDLE")]
    held = History(streaks={"a": (0, NOW - timedelta(minutes=10)),   # its held fail: wait
                            "b": (0, NOW - timedelta(minutes=31))})  # past retry_min: due
    changed = {"a": (CHANGED, OLD, NEW), "b": (CHANGED, OLD, NEW)}
    assert [n for n, _ in due(nodes, changed, held)] == ["b"]
    episodes = [SimpleNamespace(node=n, since=CHANGED, metric="step_seconds", source="steps",
                                deviation=3.0,
                                tier="applied") for n in "ab"]
    got = suspect_candidates(nodes, episodes, held, NOW, retry_min=30, retry_max_min=720,
                             limit=10)
    assert [n for n, _ in got] == ["b"]
    # A run from before the trigger says nothing of it: due at once.
    before = History(streaks={"a": (0, CHANGED - timedelta(minutes=5))})
    assert [n for n, _ in due(nodes[:1], changed, before)] == ["a"]


def test_qualify_auto_names_a_due_node_a_persons_reservation_keeps(db, tmp_path):
    """A node due for qualification but in a reservation not qualification's is left alone;
    `qualify auto` said only "no node is due", so a repaired node a technician's forgotten
    reservation kept out of service gave an operator no clue (helper-124). It is named, with
    the reservation, in the text and in --json."""
    url, engine = db
    _heartbeats(engine, tmp_path, {"gpu050": ["570.133.20", "580.95.05"]})
    slurm = MemorySlurm()
    slurm.add_node("gpu050", "IDLE")
    slurm.add_reservation("bob_fw_flash", "gpu050")
    on = tmp_path / "on.toml"
    on.write_text("[qualify]\non_driver_change = true\nflow_timeout_s = 30\n")
    obj = AppContext(config_path=str(on), db_url=url)
    obj.slurm = slurm
    out = CliRunner().invoke(qualify, ["auto", "--dry-run"], obj=obj)
    assert out.exit_code == 0, out.output
    assert "gpu050: driver/firmware changed" in out.output
    assert "left alone: in reservation bob_fw_flash (active)" in out.output
    assert "no node is due" in out.output
    shown = CliRunner().invoke(qualify, ["auto", "--dry-run", "--json"], obj=obj)
    held = json.loads(shown.output)["held"]
    assert [(h["node"], h["held_by"]) for h in held] == [
        ("gpu050", "in reservation bob_fw_flash (active)")]
