"""Fixtures for the lemon tests: a temp SQLite historian and the Fleet insert helpers."""

from __future__ import annotations

import pytest
from lemon_fleet import Fleet
from sqlalchemy import create_engine

from rsc_health.historian import db


@pytest.fixture
def engine(tmp_path):
    eng = create_engine(f"sqlite:///{tmp_path / 'historian.db'}")
    db.create(eng)  # the schema at the newest version, as `healthctl db` makes it
    yield eng
    eng.dispose()


@pytest.fixture
def fleet(engine):
    return Fleet(engine)
