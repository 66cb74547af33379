"""`healthctl metrics export` against a historian that holds its queries: the export ends in
its own bound (not the ingests' 15-minute statement timeout) with `rsc_health_historian_up 0`
in the file, so node_exporter never serves the last good numbers as current for long."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest

from rsc_health.historian.db import connect

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.postgres


def test_an_export_held_by_a_locked_table_ends_at_its_own_timeout(pg_url, tmp_path):
    connect(pg_url, create_missing=True).dispose()
    out = tmp_path / "fleet.prom"
    out.write_text("rsc_health_historian_up 1\n")  # the last good export
    libpq = pg_url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(libpq) as holder:
        # what a long migration or a stuck maintenance holds: no read gets through
        holder.execute("LOCK TABLE node_runs IN ACCESS EXCLUSIVE MODE")
        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "rsc_health.cli", "--config", os.devnull, "--db", pg_url,
             "metrics", "export", "--out", str(out), "--statement-timeout", "2"],
            env=dict(os.environ, PYTHONPATH=str(REPO)), capture_output=True, text=True,
            timeout=120)
        took = time.monotonic() - started
        holder.rollback()
    assert done.returncode == 1, done.stderr
    assert took < 30, took
    assert "historian unreachable" in done.stderr and "Traceback" not in done.stderr
    assert "rsc_health_historian_up 0.0" in out.read_text()


def test_the_export_bound_defaults_to_minutes_not_the_ingests_quarter_hour():
    from click.testing import CliRunner

    from rsc_health.cli import cli

    shown = CliRunner().invoke(cli, ["metrics", "export", "--help"]).output
    assert "--statement-timeout" in shown and "120" in shown
