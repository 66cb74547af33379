"""The simulator's outages that are no node's fault: maintenance drains with maintenance
reasons, and fleet-wide "Not responding" events; the rest of a fleet is untouched by them."""

from __future__ import annotations

import re

from rsc_health.historian.lemons.features import OUTAGE_DEFAULTS
from rsc_health.sim import SimConfig, simulate


def _events(path):
    header, *rows = path.read_text().splitlines()
    names = header.split("|")
    return [dict(zip(names, r.split("|"), strict=True)) for r in rows]


def test_maintenance_drains_and_fleet_events_are_written_and_nothing_else_moves(tmp_path):
    base = simulate(SimConfig(nodes=64, days=20, seed=3), tmp_path / "base")
    disrupted = simulate(SimConfig(nodes=64, days=20, seed=3, maintenance_drains=3,
                                   fleet_events=2), tmp_path / "disrupted")
    for name in ("sacct.txt", "checks.jsonl", "tickets.csv"):
        assert (base.out_dir / name).read_bytes() == (disrupted.out_dir / name).read_bytes()
    before, after = _events(base.out_dir / "events.txt"), _events(disrupted.out_dir / "events.txt")
    added = [e for e in after if e not in before]
    assert len(after) == len(before) + len(added)
    patterns = [re.compile(p) for p in OUTAGE_DEFAULTS["maintenance_reason_patterns"]]
    maint = [e for e in added if e["State"] == "DRAIN"]
    fleet = [e for e in added if e["State"] == "DOWN"]
    assert maint and all(any(p.search(e["Reason"]) for p in patterns) for e in maint)
    assert {e["Reason"] for e in fleet} == {"Not responding"}
    assert len(fleet) >= 2 * int(0.3 * 64)  # two events, each 30-80% of the fleet
