"""Simulated fleets for the validation tests, built once per session.

Seeds 201-205 are used by no tuning (lemon tuning used 1-10; its held-out seeds are 11-15 and
101-110)."""

from __future__ import annotations

import pytest
from validation_harness import validate


@pytest.fixture(scope="session")
def fleets(tmp_path_factory):
    work = tmp_path_factory.mktemp("validation")
    built = [validate.build_fleet(s, work) for s in validate.VALIDATION_SEEDS]
    yield built
    for f in built:
        f.engine.dispose()


@pytest.fixture(scope="session")
def rf_rows(fleets):
    return [validate.rf_check(f) for f in fleets]


@pytest.fixture(scope="session")
def stress_fleet(tmp_path_factory):
    f = validate.build_fleet(validate.STRESS_SEED, tmp_path_factory.mktemp("stress"),
                             days=validate.STRESS_DAYS,
                             rf_per_1000_node_days=validate.STRESS_RF)
    yield f
    f.engine.dispose()
