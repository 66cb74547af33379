"""Small simulated fleets shared by the simulator tests (simulated once per session)."""

from __future__ import annotations

import csv
import json
import pickle
from pathlib import Path

import pytest

from rsc_health.sim import SimConfig, simulate
from tests.shared_build import built_once


def read_sacct(path: Path) -> list[dict[str, str]]:
    """A plain `--parsable2` reader: '|' separated, first line is the header, no quoting."""
    with path.open(encoding="utf-8", newline="") as fh:
        return list(csv.DictReader(fh, delimiter="|", quoting=csv.QUOTE_NONE))


@pytest.fixture(scope="session")
def fleet(tmp_path_factory) -> dict:
    """256 nodes x 60 days: big enough for the paper's job-mix shares to settle. Simulated once
    per test run, whichever xdist worker needs it first (tests/shared_build.py); the tests only
    read its files."""
    def build(directory: Path) -> None:
        result = simulate(SimConfig(nodes=256, days=60, seed=11), directory / "fleet")
        (directory / "result.pickle").write_bytes(pickle.dumps(result))

    shared = built_once(tmp_path_factory, "sim-fleet-256x60-seed11", build)
    out = shared / "fleet"
    result = pickle.loads((shared / "result.pickle").read_bytes())
    return {
        "dir": out,
        "result": result,
        "rows": read_sacct(out / "sacct.txt"),
        "truth": json.loads((out / "truth.json").read_text()),
    }
