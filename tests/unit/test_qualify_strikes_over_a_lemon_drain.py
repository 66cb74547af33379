"""Three strikes (Flow.repair) wrote rsc_health:qualify:three_strikes over the lemon verdict's
drain (rsc_health:lemon:...): strike_candidates left out only a person's `healthctl drain`, and
repair() kept only a person's drain, so `qualify auto` (and `qualify start` of the node)
replaced the lemon verdict's reason, the finding an operator reads in `sinfo -R`, with a
second repair drain and a second ticket. The lemon's drain is a repair drain with its own
ticket already: it stays as it is, and no qualification ticket is opened over it."""
from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from click.testing import CliRunner
from sqlalchemy import insert, select

from rsc_health.cli import AppContext, cli
from rsc_health.commands.qualify import qualify
from rsc_health.historian.db import connect
from rsc_health.historian.schema import node_actions, qualify_runs, tickets
from rsc_health.model import ActionKind
from rsc_health.qualify.flow import strike_candidates
from rsc_health.slurm.memory import MemorySlurm

XID79 = "rsc_health:now:xid79:gpu3 fell off the bus"
LEMON = "rsc_health:lemon:drains_30d:drains_30d 4 (min 3)"


@pytest.fixture
def db(tmp_path):
    """gpu042 passed six days ago, then the node path drained it three times in production."""
    url = f"sqlite:///{tmp_path / 'h.db'}"
    assert CliRunner().invoke(cli, ["--db", url, "db", "upgrade"]).exit_code == 0
    engine = connect(url, create_missing=True)
    now = datetime.now(UTC).replace(tzinfo=None)
    with engine.begin() as conn:
        conn.execute(insert(qualify_runs).values(
            run_id=uuid.uuid4().hex, node="gpu042", tier="full",
            started=now - timedelta(days=6, minutes=9), ended=now - timedelta(days=6),
            verdict="pass", reason="", gpu_model="H100", driver="550", job_id="77"))
        for d in (5, 3, 1):
            conn.execute(insert(node_actions).values(
                id=uuid.uuid4().hex, time=now - timedelta(days=d), node="gpu042",
                action=ActionKind.DRAIN_NOW.value, reason=XID79))
        # the lemon verdict's drain and its own ticket
        conn.execute(insert(tickets).values(node="gpu042", opened=now - timedelta(hours=2),
                                            reason=LEMON, source="lemon"))
    yield url, engine
    engine.dispose()


def _obj(url, slurm, tmp_path):
    cfg = tmp_path / "cli.toml"
    cfg.write_text("")
    obj = AppContext(config_path=str(cfg), db_url=url)
    obj.slurm = slurm
    return obj


def _qualify_tickets(engine):
    with engine.connect() as conn:
        return conn.execute(select(tickets.c.reason).where(tickets.c.source == "qualify")).all()


def test_strike_candidates_leave_a_lemon_drain_out():
    class History:
        def strikes(self, node):
            return 3

    slurm = MemorySlurm()
    slurm.add_node("gpu042", "IDLE+DRAIN", LEMON)
    slurm.add_node("gpu043", "IDLE+DRAIN", XID79)
    assert strike_candidates(slurm.nodes(), History(), strikes=3, limit=10) == [("gpu043", 3)]


@pytest.mark.parametrize("argv", [["auto"], ["start", "gpu042"]])
def test_three_strikes_never_writes_over_the_lemon_verdicts_drain(db, tmp_path, argv):
    url, engine = db
    slurm = MemorySlurm()
    slurm.add_node("gpu042", "IDLE+DRAIN", LEMON, when=datetime.now(UTC) - timedelta(hours=2))
    res = CliRunner().invoke(qualify, argv, obj=_obj(url, slurm, tmp_path))
    print(res.output)
    assert slurm.info["gpu042"].reason == LEMON, (
        f"the lemon verdict's drain was rewritten: {slurm.info['gpu042'].reason!r}")
    assert not [c for c in slurm.calls if c[0] in ("drain", "resume", "undrain")]
    assert not slurm.reservations()
    assert _qualify_tickets(engine) == []  # the lemon's own ticket is the repair's
