"""The historian's figures are the history's, not the order it was fed in: sacct dumps come
per partition or per user and get concatenated, slurmdbd event exports and health-check files
are merged from several hosts, tickets come from a spreadsheet sorted any way. A simulated
fleet's files ingested with every file's lines shuffled give the same attribution, failure
rate, outcomes, causes, MTTF, ETTR runs, goodput loss and lemon verdicts as in order."""

from __future__ import annotations

import random
import re
import shutil
import uuid
from pathlib import Path

import pandas as pd
import pytest
from sqlalchemy import create_engine, text

from rsc_health.config import load_config
from rsc_health.historian import db as hdb
from rsc_health.historian.attribute import Window as AttributionWindow
from rsc_health.historian.attribute import attribute
from rsc_health.historian.lemons.features import lemon_features
from rsc_health.historian.lemons.verdicts import DEFAULTS, LemonRules, lemon_verdicts
from rsc_health.historian.metrics._sql import Window
from rsc_health.historian.metrics.goodput import goodput_lost
from rsc_health.historian.metrics.mttf import mttf_by_size
from rsc_health.historian.metrics.rates import causes, failure_rate, outcomes
from rsc_health.historian.metrics.runs import job_runs
from rsc_health.sim.config import SimConfig
from rsc_health.sim.core import simulate
from rsc_health.sim.historian import ingest_fleet, truth_of

HEADED = {"sacct.txt": True, "events.txt": True, "tickets.csv": True, "checks.jsonl": False,
          "exclusions.jsonl": False}


def _shuffle(src: Path, dst: Path, seed: int) -> None:
    shutil.copytree(src, dst)
    for name, header in HEADED.items():
        lines = (src / name).read_text().splitlines(keepends=True)
        head, body = (lines[:1], lines[1:]) if header else ([], lines)
        random.Random(seed).shuffle(body)
        (dst / name).write_text("".join(head + body))


def _text(x) -> str:
    """A figure as text, whole: a frame with its rows in one order, anything else as repr;
    numbers to 9 significant digits (PostgreSQL's SUM adds in the order it reads rows, and
    1/3 + 1/3 + 1/3 is not 1 in the last bit)."""
    if isinstance(x, str):
        out = x
    elif isinstance(x, pd.DataFrame):
        x = x.reset_index(drop=True)
        out = x.sort_values(list(x.columns)).to_csv(index=False) if len(x.columns) else ""
    else:  # a frame indexed by node is sorted by the caller
        out = repr(x)
    return re.sub(r"\d+\.\d+(?:e[-+]?\d+)?", lambda m: f"{float(m.group()):.9g}", out)


def _figures(sim_dir: Path, url: str) -> dict:
    cfg = load_config(None)
    engine = hdb.connect(url, upgrade=True, create_missing=True)
    try:
        ingest_fleet(engine, sim_dir, gpus_per_node=8)
        attribute(engine, window=AttributionWindow.from_config(cfg))
        _truth, as_of = truth_of(sim_dir)
        window = Window(until=as_of)
        fr = failure_rate(engine, window, 128)
        section = {**DEFAULTS, **cfg.section("lemon")}
        features = lemon_features(engine, as_of, float(section["window_days"]),
                                  history_days=float(section["history_days"]))
        verdicts = lemon_verdicts(engine, features, as_of, LemonRules.from_config(section),
                                  window_days=float(section["window_days"]),
                                  history_days=float(section["history_days"]))
        return {
            "failure_rate": _text(fr),
            "outcomes": _text(outcomes(engine, window)),
            "causes": _text(causes(engine, window)),
            "mttf": _text(mttf_by_size(engine, window, r_f=fr.r_f)),
            "goodput": _text(goodput_lost(engine, window)),
            "runs": _text(job_runs(engine, fr.r_f, window)),
            "features": _text(features.sort_index().to_csv()),
            "lemons": sorted(_text(v) for v in verdicts),
        }
    finally:
        engine.dispose()


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgresql",
                                                             marks=pytest.mark.postgres)])
def test_a_fleet_ingested_with_its_files_shuffled_gives_the_same_figures(tmp_path, request,
                                                                         backend):
    cfg = SimConfig.from_config(load_config(None), nodes=64, days=45, seed=4)
    simulate(cfg, tmp_path / "in_order")
    _shuffle(tmp_path / "in_order", tmp_path / "shuffled", 7)
    urls = [f"sqlite:///{tmp_path / 'a.db'}", f"sqlite:///{tmp_path / 'b.db'}"]
    if backend == "postgresql":  # PostgreSQL hands rows back in an order of its own: both there
        urls = [request.getfixturevalue("pg_url"), _second_pg_database(request)]
    a = _figures(tmp_path / "in_order", urls[0])
    b = _figures(tmp_path / "shuffled", urls[1])
    for key in a:
        assert a[key] == b[key], key
    # there is something to agree on: failures, ETTR runs, a lemon
    assert re.search(r"failures=[1-9]", a["failure_rate"]) and a["runs"].count("\n") > 5
    assert a["lemons"]


def _second_pg_database(request) -> str:
    """Another empty PostgreSQL database, dropped after the test (pg_url gives one a test)."""
    from tests.historian.conftest import PG_ADMIN_URL

    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    name = f"rsc_test_{uuid.uuid4().hex[:12]}"
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))

    def drop() -> None:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()

    request.addfinalizer(drop)
    return admin.url.set(database=name).render_as_string(hide_password=False)
