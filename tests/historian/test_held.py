"""Which nodes keep a drain verdict held back (historian.held): what `healthctl status` names."""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import create_engine, insert

from rsc_health.config import load_config
from rsc_health.historian import db
from rsc_health.historian.held import held_verdicts, held_within
from rsc_health.historian.schema import node_actions
from rsc_health.model import ActionKind

NOW = datetime(2026, 11, 26, 12, 0)


def test_held_until_a_drain_carries_the_verdict_out_and_only_while_it_is_still_said(tmp_path):
    engine = create_engine(f"sqlite:///{tmp_path / 'h.db'}")
    db.create(engine)
    within = held_within(load_config("/dev/null"))
    assert within == timedelta(minutes=90, seconds=2700)  # 1.5 x 60 min retries + delivery
    rows = [
        # guard-held, then drained in the same second (the retry that got through)
        ("g1", NOW - timedelta(minutes=5), ActionKind.GUARD_TRIPPED),
        ("g1", NOW - timedelta(minutes=5), ActionKind.DRAIN_NOW),
        # held under a person's drain; the person resumed it: still held
        ("p1", NOW - timedelta(minutes=30), ActionKind.HELD_UNDER_DRAIN),
        ("p1", NOW - timedelta(minutes=20), ActionKind.RESUME),
        # drained once, later held by the guard
        ("d1", NOW - timedelta(hours=2), ActionKind.DRAIN_AFTER_JOB),
        ("d1", NOW - timedelta(minutes=1), ActionKind.GUARD_TRIPPED),
        # said long ago and never since: the node no longer says so
        ("o1", NOW - within - timedelta(minutes=1), ActionKind.HELD_UNDER_DRAIN),
    ]
    with engine.begin() as conn:
        conn.execute(insert(node_actions), [
            dict(id=f"a{i}", time=t, node=n, action=a.value, reason=f"{n} {a}")
            for i, (n, t, a) in enumerate(rows)])
    held = held_verdicts(engine, NOW, within)
    assert [(h.node, h.action) for h in held] == [
        ("d1", "guard_tripped"), ("p1", "held_under_drain")]
    assert held_verdicts(engine, NOW, within, nodes=["p1"])[0].reason == "p1 held_under_drain"
    engine.dispose()
