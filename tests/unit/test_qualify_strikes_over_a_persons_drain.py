"""Three strikes (Flow.repair) writes rsc_health:qualify:three_strikes over a drain that is a
person's: (a) `qualify start` of a node a person drained with `healthctl drain`
(rsc_health:manual:..., which _kept_drain, auto_candidates and strike_candidates all treat as a
person's); (b) `qualify auto`, whose repair uses the node table read before the per-node
strikes queries: a person's drain set meanwhile is overwritten without a re-read."""
from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from click.testing import CliRunner
from sqlalchemy import insert

from rsc_health.cli import AppContext, cli
from rsc_health.commands.qualify import qualify
from rsc_health.historian.db import connect
from rsc_health.historian.schema import node_actions, qualify_runs
from rsc_health.model import ActionKind
from rsc_health.slurm.memory import MemorySlurm

XID79 = "rsc_health:now:xid79:gpu3 fell off the bus"
MANUAL = "rsc_health:manual:manual:rack 12 PSU swap by bob"
PERSON = "bob: rack 12 PSU swap, keep out"


@pytest.fixture
def db(tmp_path):
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
    yield url, engine
    engine.dispose()


def _obj(url, slurm, tmp_path):
    cfg = tmp_path / "cli.toml"
    cfg.write_text("")
    obj = AppContext(config_path=str(cfg), db_url=url)
    obj.slurm = slurm
    return obj


def test_qualify_start_never_rewrites_a_healthctl_drain(db, tmp_path):
    url, _ = db
    slurm = MemorySlurm()
    slurm.add_node("gpu042", "IDLE+DRAIN", MANUAL)
    res = CliRunner().invoke(qualify, ["start", "gpu042"], obj=_obj(url, slurm, tmp_path))
    print(res.output)
    assert slurm.info["gpu042"].reason == MANUAL, (
        f"a person's healthctl drain was rewritten: {slurm.info['gpu042'].reason!r}")


def test_qualify_auto_never_rewrites_a_persons_drain_set_after_its_listing(db, tmp_path):
    url, _ = db
    slurm = MemorySlurm()
    slurm.add_node("gpu042", "IDLE+DRAIN", XID79)
    # A person drains the node with a reason of theirs after `qualify auto` read the table.
    slurm.after("nodes", lambda: slurm.set_state("gpu042", "IDLE+DRAIN", PERSON, user="bob"))
    res = CliRunner().invoke(qualify, ["auto"], obj=_obj(url, slurm, tmp_path))
    print(res.output)
    assert slurm.info["gpu042"].reason == PERSON, (
        f"a person's drain was rewritten: {slurm.info['gpu042'].reason!r}")
