"""The same gather on PostgreSQL: every metric and lemon query the report runs works there."""

from __future__ import annotations

import os
import uuid

import pytest
from sqlalchemy import create_engine, text

from rsc_health.historian.db import connect

from .test_gather import check_gathered, check_shadow_capped, populate

PG_URL = os.environ.get("RSC_HEALTH_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")

pytestmark = pytest.mark.postgres


@pytest.fixture
def pg_engine():
    name = f"rsc_report_{uuid.uuid4().hex[:12]}"
    admin = create_engine(PG_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    base, _, _db = PG_URL.rpartition("/")
    engine = connect(f"{base}/{name}", create_missing=True)
    try:
        yield engine
    finally:
        engine.dispose()
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def test_gather_on_postgresql_matches_sqlite(pg_engine, tmp_path):
    populate(pg_engine)
    check_gathered(pg_engine, tmp_path)


def test_shadow_would_drains_are_capped_on_postgresql(pg_engine, tmp_path):
    check_shadow_capped(pg_engine, tmp_path, inventory=True)
