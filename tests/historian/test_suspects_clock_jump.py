"""`healthctl suspects apply` (every minute) on a management host whose clock jumped a year
ahead: every open suspect episode's expiry had passed, so all expired at once and the tier
gave each slow node its trusted feature and weight back (into big jobs again), while the
detector, reading samples up to a year ahead, found none to make them suspects again. The
pass now believes its clock only up to the database server's (PostgreSQL) and an hour past
the newest heartbeat the historian holds, and says so."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from unittest import mock

from click.testing import CliRunner
from sqlalchemy import insert

from rsc_health.commands.suspects import suspects as suspects_cmd
from rsc_health.historian import db, schema
from rsc_health.historian import suspects as hs
from rsc_health.model import SuspectState

from .test_suspects import TRUSTED, _obj, ev, fleet


def test_a_clock_a_year_ahead_expires_no_suspect_and_gives_nothing_back(tmp_path):
    engine = db.connect(f"sqlite:///{tmp_path / 'h.db'}", create_missing=True)
    now = datetime.now(UTC).replace(tzinfo=None, microsecond=0)
    hs.record(engine, [ev("node07", now)], now, expire_after=timedelta(hours=24))
    with engine.begin() as conn:  # the fleet is reporting: a heartbeat a minute ago
        conn.execute(insert(schema.node_runs).values(
            node="node07", source="sweep", last_seen=now - timedelta(minutes=1), level="ok"))
    slurm = fleet()
    applied = CliRunner().invoke(suspects_cmd, ["apply"], obj=_obj(engine, slurm, tmp_path))
    assert applied.exit_code == 0, applied.output
    assert TRUSTED not in slurm.info["node07"].features
    jumped = now + timedelta(days=365)
    with mock.patch("rsc_health.commands.suspects._now", lambda: jumped):
        again = CliRunner().invoke(suspects_cmd, ["apply"], obj=_obj(engine, slurm, tmp_path))
    assert again.exit_code == 0, again.output
    assert "clock" in again.output
    [ep] = hs.active(engine)
    assert ep.node == "node07" and ep.state is SuspectState.SUSPECT
    assert TRUSTED not in slurm.info["node07"].features
    engine.dispose()
