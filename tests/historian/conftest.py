"""Historian fixtures: every test that takes `historian` runs on SQLite and on PostgreSQL.

PostgreSQL comes from $RSC_HEALTH_TEST_PG (an admin URL); each test gets a fresh database
with a unique name, dropped afterwards, so parallel runs never see each other's rows.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from rsc_health.historian.db import connect

FIXTURES = Path(__file__).parent / "fixtures"
PG_ADMIN_URL = os.environ.get(
    "RSC_HEALTH_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)


@pytest.fixture
def pg_url():
    """A new, empty PostgreSQL database; dropped after the test."""
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    name = f"rsc_test_{uuid.uuid4().hex[:12]}"
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = admin.url.set(database=name).render_as_string(hide_password=False)
    try:
        yield url
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def historian_url(request, tmp_path):
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'history.db'}"
    return request.getfixturevalue("pg_url")


@pytest.fixture
def historian(historian_url):
    engine = connect(historian_url, create_missing=True)
    yield engine
    engine.dispose()
