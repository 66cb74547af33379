"""`healthctl db prune` (a daily timer) on a management host whose clock jumped years ahead (a
bad NTP answer, an RTC reset to a far date): the cut is `retention_days` before *now*, so the
jump deleted the historian's whole memory of the fleet (closed check intervals, actions,
exclusions: the lemon evidence), which no node can send again. The prune now cuts from no
later than the newest row the historian holds plus PRUNE_CLOCK_LEAD (and, on PostgreSQL,
the database server's clock), and says so."""

from __future__ import annotations

import json
from datetime import UTC, timedelta
from unittest import mock

from click.testing import CliRunner
from sqlalchemy import select

from rsc_health.cli import cli
from rsc_health.historian import schema
from rsc_health.historian.retention import PRUNE_CLOCK_LEAD

from .test_retention import NOW, WEEKS, _interval


def _load_live(engine) -> set[str]:
    """A week's sample of closed intervals from 800 to 100 days ago, and the fleet still
    reporting: an interval closed an hour ago. Returns the ids a true-clock prune keeps."""
    rows = [_interval(d, i) for d in WEEKS for i in range(10)]
    fresh = _interval(0, 0) | {"id": "fresh", "time": NOW - timedelta(hours=2),
                               "last_seen": NOW - timedelta(hours=1)}
    with engine.begin() as conn:
        conn.execute(schema.check_results.insert(), [*rows, fresh])
    cut = NOW - timedelta(days=400)
    return {r["id"] for r in [*rows, fresh] if r["last_seen"] >= cut}


def _ids(engine) -> set[str]:
    with engine.connect() as conn:
        return set(conn.execute(select(schema.check_results.c.id)).scalars())


def test_a_prune_under_a_clock_years_ahead_keeps_the_fleets_history(historian, tmp_path):
    kept = _load_live(historian)
    cfg = tmp_path / "config.toml"
    cfg.write_text("[historian]\nretention_days = 400\n")
    jumped = NOW + timedelta(days=3 * 365)
    url = historian.url.render_as_string(hide_password=False)
    with mock.patch("rsc_health.model.utcnow", lambda: jumped.replace(tzinfo=UTC)):
        result = CliRunner().invoke(cli, ["--config", str(cfg), "--db", url, "db", "prune",
                                          "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    left = _ids(historian)
    # At most PRUNE_CLOCK_LEAD of the oldest kept rows may go; nothing younger.
    lead_cut = NOW - timedelta(days=400) + PRUNE_CLOCK_LEAD + timedelta(hours=1)
    assert {i for i in kept if i in left} == left
    young = {r for r in kept if r == "fresh" or _age_ok(r, lead_cut)}
    assert young <= left, sorted(young - left)[:5]
    assert "fresh" in left
    assert doc["as_of"] < jumped.isoformat()
    assert "clock" in doc["note"]


def _age_ok(row_id: str, cut) -> bool:
    day, i = (int(x) for x in row_id[1:].split("-"))
    t = NOW - timedelta(days=800) + timedelta(days=day, minutes=i + 1)
    return t >= cut
