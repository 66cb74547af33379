"""Fixtures of tests/unit: `db`, the historian the qualification command tests run on (a
SQLite file `db upgrade` made, as a deployment's first step does). A file that needs more in
it defines its own `db`."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from rsc_health.cli import cli
from rsc_health.historian.db import connect


@pytest.fixture
def db(tmp_path):
    """(its URL, an engine on it)."""
    url = f"sqlite:///{tmp_path / 'h.db'}"
    assert CliRunner().invoke(cli, ["--db", url, "db", "upgrade"]).exit_code == 0
    engine = connect(url, create_missing=True)
    yield url, engine
    engine.dispose()
