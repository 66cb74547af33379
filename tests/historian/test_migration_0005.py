"""Migration 0005 (check results as intervals) keeps every row: each becomes a closed point,
and the ids, actions and attributions come through whole."""

from __future__ import annotations

import shutil
from datetime import datetime

from sqlalchemy import text

from rsc_health.historian import db, schema


def test_upgrade_from_version_4_turns_every_check_row_into_a_point(historian_url, tmp_path):
    old = tmp_path / "sql"
    old.mkdir()
    for f in db.MIGRATIONS_DIR.glob("*.sql"):
        if int(f.name[:4]) <= 4:
            shutil.copy(f, old / f.name)
    engine = db.engine_for(historian_url)
    try:
        assert db.migrate(engine, 0, old)[-1] == 4
        with engine.begin() as conn:
            for i in range(3):
                conn.execute(text(
                    'INSERT INTO check_results (id, time, node, source, job_id, "check", '
                    "component, status, severity, code, reason) VALUES "
                    f"('r{i}', '2024-03-0{i + 1} 00:00:00', 'n1', 'sweep', NULL, 'xid', "
                    "'gpu0', 'fail', 'drain_now', 'xid79', 'fell off')"))
            conn.execute(text(
                "INSERT INTO node_actions (id, time, node, action, reason, job_id) VALUES "
                "('a1', '2024-03-01 00:00:00', 'n1', 'drain_now', 'xid79', NULL)"))
        assert db.migrate(engine, 4)[0] == 5
        assert db.current_version(engine) == schema.SCHEMA_VERSION
        with engine.connect() as conn:
            rows = conn.execute(text(
                "SELECT id, time, last_seen, is_open FROM check_results ORDER BY id")).all()
            actions = conn.execute(text("SELECT id FROM node_actions")).scalars().all()
        assert [r[0] for r in rows] == ["r0", "r1", "r2"]
        assert all(r[1] == r[2] and not r[3] for r in rows)
        assert actions == ["a1"]
        with engine.begin() as conn:  # ids longer than the old 32 characters now fit
            conn.execute(schema.node_actions.insert().values(
                id="a" * 100, time=datetime(2024, 3, 1), node="n1", action="resume", reason=""))
    finally:
        engine.dispose()
