"""Issue 24's pairwise tests need a known-good peer: chosen in the historian, on SQLite and
PostgreSQL alike, among nodes whose newest run passed and that are not being qualified now."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from click.testing import CliRunner
from sqlalchemy import insert

from rsc_health.cli import cli
from rsc_health.historian.db import connect
from rsc_health.historian.schema import node_actions, qualify_runs
from rsc_health.qualify import pairwise

MODEL, DRIVER = "NVIDIA H100 80GB HBM3", "550.54.15"


@pytest.fixture
def engine(historian_url):
    url = historian_url
    assert CliRunner().invoke(cli, ["--db", url, "db", "upgrade"]).exit_code == 0
    eng = connect(url, create_missing=True)
    yield eng
    eng.dispose()


def add_run(engine, node, verdict, ended, *, driver=DRIVER):
    with engine.begin() as conn:
        conn.execute(insert(qualify_runs).values(
            run_id=uuid.uuid4().hex, node=node, tier="full", started=ended - timedelta(minutes=9),
            ended=ended, verdict=verdict, reason="", gpu_model=MODEL, driver=driver, job_id="1"))


def test_the_known_good_peer_has_a_recent_pass_and_is_not_being_qualified(engine):
    now = datetime.now(UTC).replace(tzinfo=None)
    add_run(engine, "gpu-001", "pass", now - timedelta(hours=1))
    add_run(engine, "gpu-002", "pass", now - timedelta(hours=2))
    add_run(engine, "gpu-002", "fail", now - timedelta(minutes=30))    # newest run failed
    add_run(engine, "gpu-003", "pass", now - timedelta(minutes=10))   # under qualification now
    add_run(engine, "gpu-004", "pass", now - timedelta(days=200))     # too old
    add_run(engine, "gpu-005", "pass", now - timedelta(hours=3), driver="535.0")  # other driver
    add_run(engine, "gpu-009", "pass", now - timedelta(minutes=5))    # the node under test
    add_run(engine, "-oProxyCommand=x", "pass", now - timedelta(minutes=1))  # hostile name
    add_run(engine, "gpu-006", "inconclusive", now - timedelta(hours=1))
    add_run(engine, "gpu-007", "pass", now - timedelta(hours=5))
    with engine.begin() as conn:
        conn.execute(insert(node_actions).values(
            id=uuid.uuid4().hex[:32], time=now - timedelta(minutes=2), node="gpu-003",
            action="qualify_start", reason="full tier in rsc_health_qualify_gpu-003"))
    with engine.connect() as conn:
        good = pairwise.known_good(conn, node="gpu-009", gpu_model=MODEL, driver=DRIVER,
                                   since=now - timedelta(days=90))
    assert good == ["gpu-001", "gpu-007"]


def test_a_peer_drained_or_suspect_since_its_pass_is_not_known_good(engine):
    """A peer that passed, then was drained (or had a drain held, or only recorded in shadow
    mode) or became a suspect: the pairwise test would measure its bad link, and the healthy
    node paired with it would fail and be drained. It was chosen all the same."""
    from rsc_health.historian.schema import suspects
    from rsc_health.model import ActionKind, SuspectState

    now = datetime.now(UTC).replace(tzinfo=None)
    for i, node in enumerate(("gpu-011", "gpu-012", "gpu-013", "gpu-014", "gpu-015")):
        add_run(engine, node, "pass", now - timedelta(hours=2, minutes=i))
    with engine.begin() as conn:
        for node, action, when in (
                ("gpu-011", ActionKind.DRAIN_AFTER_JOB, now - timedelta(hours=1)),
                ("gpu-012", ActionKind.WOULD_DRAIN, now - timedelta(hours=1)),
                ("gpu-015", ActionKind.DRAIN_NOW, now - timedelta(hours=3))):  # before its pass
            conn.execute(insert(node_actions).values(
                id=uuid.uuid4().hex[:32], time=when, node=node, action=str(action),
                reason="ib_symbol_errors"))
        conn.execute(insert(suspects).values(
            node="gpu-013", state=str(SuspectState.SUSPECT), since=now - timedelta(hours=1),
            last_evidence=now, expires=now + timedelta(hours=24), metric="ib_xmit_wait_rate",
            value=9e6, peer_median=1e5, deviation=12.0, source="telemetry", changed=now))
        conn.execute(insert(suspects).values(
            node="gpu-014", state=str(SuspectState.CLEARED), since=now - timedelta(days=3),
            last_evidence=now - timedelta(days=3), expires=now - timedelta(days=2),
            metric="sm_clock_ratio", value=0.6, peer_median=0.98, deviation=9.0,
            source="telemetry", changed=now - timedelta(days=2)))
    with engine.connect() as conn:
        good = pairwise.known_good(conn, node="gpu-009", gpu_model=MODEL, driver=DRIVER,
                                   since=now - timedelta(days=90))
    assert good == ["gpu-014", "gpu-015"]
