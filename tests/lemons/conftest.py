"""Fixtures for the lemon tests: a temp SQLite historian and the Fleet insert helpers."""

from __future__ import annotations

import pytest
from lemon_fleet import Fleet
from sqlalchemy import create_engine

from rsc_health.historian import schema


@pytest.fixture
def engine(tmp_path):
    eng = create_engine(f"sqlite:///{tmp_path / 'historian.db'}")
    schema.metadata.create_all(eng)
    yield eng
    eng.dispose()


@pytest.fixture
def fleet(engine):
    return Fleet(engine)
