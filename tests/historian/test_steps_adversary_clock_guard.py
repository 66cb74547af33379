"""A user's step line stamped at a jumped clock's time disarms the clock-jump guard
(freshness.believed_now) that keeps `healthctl suspects apply` from expiring every suspect
episode when the management host's clock jumps a year ahead.

believed_now trusts the host clock up to "an hour past the newest row the historian holds",
and counts max(step_times.time) among those rows. step_times.time is user-written: ingest
steps accepts any time up to the (jumped) host clock + 5 min. A drop file with lines stamped
every hour for the coming year(s) (refused until their time "comes") gets its line at the
jumped time ingested, and the guard then believes the jump."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime, timedelta
from unittest import mock

import pytest
from click.testing import CliRunner
from sqlalchemy import insert

from rsc_health.cli import cli
from rsc_health.commands.suspects import suspects as suspects_cmd
from rsc_health.historian import db, schema
from rsc_health.historian import suspects as hs
from rsc_health.historian.failslow.evidence import TELEMETRY, SuspectEvidence
from rsc_health.model import SuspectState
from tests.historian.test_suspects import TRUSTED, _obj, fleet


@pytest.mark.parametrize("with_drop", [False, True], ids=["control-no-drop", "drop"])
def test_a_users_step_line_at_the_jumped_time_lets_the_jump_expire_every_suspect(tmp_path,
                                                                                 with_drop):
    url = f"sqlite:///{tmp_path / 'h.db'}"
    engine = db.connect(url, create_missing=True)
    now = datetime.now(UTC).replace(tzinfo=None, microsecond=0)
    ev = SuspectEvidence(node="node07", metric="sm_clock_ratio", value=0.62, peer_median=0.98,
                         deviation=9.5, since=now - timedelta(minutes=10), last=now,
                         job_ids=("101",), source=TELEMETRY, detail="gpu3")
    hs.record(engine, [ev], now, expire_after=timedelta(hours=24))
    with engine.begin() as conn:
        conn.execute(insert(schema.node_runs).values(
            node="node07", source="sweep", last_seen=now - timedelta(minutes=1), level="ok"))
        # nobody's own 2-node job (the owner filter is on, the default)
        pk = conn.execute(insert(schema.jobs).values(
            job_id="555", job_id_display="555", state="COMPLETED", submit=now, start=now,
            end=now + timedelta(minutes=30), nnodes=2, user="nobody",
            instance_key="555:x").returning(schema.jobs.c.id)).scalar_one()
        conn.execute(insert(schema.job_nodes), [{"job_pk": pk, "node": n}
                                                for n in ("node01", "node02")])
    slurm = fleet()
    applied = CliRunner().invoke(suspects_cmd, ["apply"], obj=_obj(engine, slurm, tmp_path))
    assert applied.exit_code == 0, applied.output
    assert TRUSTED not in slurm.info["node07"].features

    # nobody's drop file: one line an hour for the next 400 days (each pass refuses the
    # future ones, "ahead of the historian's clock", and reads the file again next pass)
    drop = tmp_path / "drop"
    drop.mkdir()
    f = drop / "555.jsonl"
    with f.open("w") as fh:
        for h in range(0, 400 * 24):
            t = now + timedelta(hours=h)
            fh.write(json.dumps({"job_id": "555", "rank": 0, "node": "node01", "step": h,
                                 "seconds": 1.0, "time": t.strftime("%Y-%m-%dT%H:%M:%SZ")})
                     + "\n")
    os.chown(f, 65534, 65534)
    os.chmod(f, 0o644)

    jumped = now + timedelta(days=365)

    class Jumped(datetime):
        @classmethod
        def now(cls, tz=None):
            return jumped.replace(tzinfo=UTC) if tz is not None else jumped

    # the ingest timer runs on the same (jumped) host
    if with_drop:
        with mock.patch("rsc_health.historian.ingest.steps.datetime", Jumped):
            out = CliRunner().invoke(cli, ["--db", url, "ingest", "steps", "--json",
                                           str(drop)])
        assert out.exit_code == 0, out.output
        assert json.loads(out.output)["written"] > 0

    with mock.patch("rsc_health.commands.suspects._now", lambda: jumped):
        again = CliRunner().invoke(suspects_cmd, ["apply"], obj=_obj(engine, slurm, tmp_path))
    assert again.exit_code == 0, again.output
    # without the drop file (tests/historian/test_suspects_clock_jump.py) the pass says
    # "clock", keeps node07's episode open and its feature off
    assert "clock" in again.output, again.output
    [ep] = hs.active(engine)
    assert ep.node == "node07" and ep.state is SuspectState.SUSPECT
    assert TRUSTED not in slurm.info["node07"].features
    engine.dispose()
