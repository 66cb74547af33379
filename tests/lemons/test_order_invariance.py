"""Lemon verdicts are the history's, not the order it was imported in: an operator's event and
check exports come sorted by node, by time, or not at all (slurmdbd dumps, a merge of several
clusters' files, a re-import after a gap), and the database hands rows back in its own order.
Titan's real history (tests/fixtures/titan) imported with its lines shuffled gives the same
features and the same flagged nodes as imported in order."""

from __future__ import annotations

import random
import sys
from datetime import datetime
from pathlib import Path

import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import _titan  # noqa: E402
import bench_lemons_titan as bench  # noqa: E402

from rsc_health.historian import db  # noqa: E402
from rsc_health.historian.lemons.features import lemon_features  # noqa: E402
from rsc_health.historian.lemons.verdicts import LemonRules, flagged  # noqa: E402
from rsc_health.historian.outages import OutageRules  # noqa: E402

DATES = [datetime(2016, 1, 1), datetime(2018, 1, 1)]


def _shuffled(path: Path, out: Path, seed: int, header: bool) -> Path:
    lines = path.read_text().splitlines(keepends=True)
    head, body = (lines[:1], lines[1:]) if header else ([], lines)
    random.Random(seed).shuffle(body)
    out.write_text("".join(head + body))
    return out


def _features(url: str) -> list[pd.DataFrame]:
    engine = db.connect(url, create_missing=True)
    outages = OutageRules.from_config({**bench.DEFAULTS, "rate_window_days": 365})
    try:
        return [lemon_features(engine, d, bench.DEFAULTS["window_days"],
                               history_days=bench.DEFAULTS["history_days"], outages=outages)
                for d in DATES]
    finally:
        engine.dispose()


@pytest.mark.parametrize("mode", ["events", "checks"])
def test_a_shuffled_import_gives_the_same_lemons(tmp_path, mode):
    frame = _titan.read()
    paths = _titan.write_imports(frame, tmp_path / "in_order")
    mixed = dict(paths)
    mixed["inventory"] = _shuffled(paths["inventory"], tmp_path / "inventory.csv", 1, True)
    mixed[mode] = _shuffled(paths[mode], tmp_path / f"{mode}.mixed", 2, mode == "events")
    got = []
    for name, p in (("a", paths), ("b", mixed)):
        url = f"sqlite:///{tmp_path / f'{name}.db'}"
        bench.load(url, p, mode)
        got.append(_features(url))
    rules = LemonRules.from_config()
    for a, b in zip(*got, strict=True):
        a, b = a.sort_index(), b.sort_index()
        assert set(a.index[flagged(a, rules)]) == set(b.index[flagged(b, rules)])
        pd.testing.assert_frame_equal(a, b[a.columns], check_like=True)
    assert any(flagged(f, rules).any() for f in got[0])  # there is something to agree on
