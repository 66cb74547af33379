"""Simulated fleets for the validation tests, built once per test run (tests/shared_build.py:
whichever xdist worker needs one first builds it, the others open the same SQLite historian).

Seeds 201-205 are used by no tuning (lemon tuning used 1-10; its held-out seeds are 11-15 and
101-110)."""

from __future__ import annotations

import pickle

import pytest
from validation_harness import validate

from rsc_health.historian import db as hdb
from rsc_health.sim.historian import truth_of
from tests.shared_build import built_once, each_built_once


def _opened(seed: int, directory) -> validate.Fleet:
    """The fleet validate.build_fleet made in `directory`, opened by this worker."""
    (out,) = [p for p in directory.iterdir() if p.is_dir()]
    truth, as_of = truth_of(out)
    return validate.Fleet(seed, out, hdb.connect(f"sqlite:///{out / 'historian.db'}",
                                                 create_missing=True), truth, as_of)


def _build(seed: int, directory, **kw) -> None:
    validate.build_fleet(seed, directory, **kw).engine.dispose()


@pytest.fixture(scope="session")
def fleets(tmp_path_factory):
    dirs = each_built_once(tmp_path_factory, [f"validation-{s}" for s in validate.VALIDATION_SEEDS],
                           lambda name, d: _build(int(name.rsplit("-", 1)[1]), d))
    built = [_opened(s, dirs[f"validation-{s}"]) for s in validate.VALIDATION_SEEDS]
    yield built
    for f in built:
        f.engine.dispose()


@pytest.fixture(scope="session")
def rf_rows(fleets, tmp_path_factory):
    """validate.rf_check of each fleet, computed once per run like the fleets themselves."""
    def build(directory):
        rows = [validate.rf_check(f) for f in fleets]
        (directory / "rf_rows.pickle").write_bytes(pickle.dumps(rows))

    directory = built_once(tmp_path_factory, "validation-rf-rows", build)
    return pickle.loads((directory / "rf_rows.pickle").read_bytes())


@pytest.fixture(scope="session")
def stress_fleet(tmp_path_factory):
    name = f"validation-stress-{validate.STRESS_SEED}"
    dirs = each_built_once(tmp_path_factory, [name], lambda _name, d: _build(
        validate.STRESS_SEED, d, days=validate.STRESS_DAYS,
        rf_per_1000_node_days=validate.STRESS_RF))
    f = _opened(validate.STRESS_SEED, dirs[name])
    yield f
    f.engine.dispose()
