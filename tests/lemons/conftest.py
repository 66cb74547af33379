"""Fixtures for the lemon tests: a temp SQLite historian and the Fleet insert helpers;
`fleet_any` runs a test on SQLite and on PostgreSQL."""

from __future__ import annotations

import pytest
from lemon_fleet import Fleet
from sqlalchemy import create_engine

from rsc_health.historian import db
from tests.historian.conftest import pg_url  # noqa: F401 -- a fixture, used by fleet_any


@pytest.fixture
def engine(tmp_path):
    eng = create_engine(f"sqlite:///{tmp_path / 'historian.db'}")
    db.create(eng)  # the schema at the newest version, as `healthctl db` makes it
    yield eng
    eng.dispose()


@pytest.fixture
def fleet(engine):
    return Fleet(engine)


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def fleet_any(request, tmp_path):
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'historian.db'}"
    else:
        url = request.getfixturevalue("pg_url")
    eng = db.connect(url, create_missing=True)
    yield Fleet(eng)
    eng.dispose()
