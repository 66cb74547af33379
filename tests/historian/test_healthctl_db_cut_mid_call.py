"""`healthctl` reading the historian while `db upgrade` holds a table (a migration's ACCESS
EXCLUSIVE lock) or while PostgreSQL drops the connection mid-call (a restart, a killed
backend): the operator gets one line and exit 1 within the statement timeout, never a
traceback and never a wait for ever. Measured as it is (cli.main's net): these pass as they
stand, kept so a command that catches less cannot bring the traceback back."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from rsc_health.historian.db import connect, engine_for

REPO = Path(__file__).parents[2]
pytestmark = pytest.mark.postgres


@pytest.mark.parametrize("cut", [False, True], ids=["statement-timeout", "backend-killed"])
def test_healthctl_reading_a_historian_held_by_a_migration_or_cut_off_says_one_line(
        pg_url, tmp_path, cut):
    connect(pg_url, create_missing=True).dispose()
    config = tmp_path / "config.toml"
    config.write_text("[historian]\nstatement_timeout_s = 3\n")
    holder, admin = engine_for(pg_url), create_engine(pg_url, isolation_level="AUTOCOMMIT")
    conn = holder.connect()
    trans = conn.begin()
    try:
        conn.execute(text("LOCK TABLE jobs, check_results, job_exclusions "
                          "IN ACCESS EXCLUSIVE MODE"))  # as a migration would
        started = time.monotonic()
        proc = subprocess.Popen(
            [sys.executable, "-m", "rsc_health.cli", "--config", str(config), "--db", pg_url,
             "lemons", "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "PYTHONPATH": str(REPO)})
        killed = []
        while cut and not killed and proc.poll() is None and time.monotonic() - started < 30:
            time.sleep(0.1)
            with admin.connect() as a:
                killed = a.execute(text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND wait_event_type = 'Lock'")).all()
        out, err = proc.communicate(timeout=60)
    finally:
        trans.rollback()
        conn.close()
        holder.dispose()
        admin.dispose()
    assert not cut or killed
    assert proc.returncode == 1, (out, err)
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert err.startswith("healthctl: error: ")
    assert ("terminating connection" if cut else "statement timeout") in err
