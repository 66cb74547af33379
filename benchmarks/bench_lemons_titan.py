"""Lemon verdicts on a real fleet's history: Titan's six years of GPU failures (_titan.py),
imported as an operator would (`ingest inventory`, then `ingest events` or `ingest checks`),
scored at several as-of dates against the answer key _titan.reference computes by its own
definitions:

    recall     flagged nodes among the target (separate failures in the window far above the
               fleet's rate: exact Poisson tail, Bonferroni across the fleet, < 0.001)
    precision  flagged nodes that are statistically unusual in the window or over their life
               (Poisson tail, BH across the fleet, < 0.05)

    python3 benchmarks/bench_lemons_titan.py [--dates 2016-01-01,2017-01-01] [--backend sqlite]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import _titan  # noqa: E402
import pandas as pd  # noqa: E402
from sqlalchemy import select  # noqa: E402

from rsc_health.historian import db  # noqa: E402
from rsc_health.historian.ingest import checks, events, inventory, tickets  # noqa: E402
from rsc_health.historian.lemons.features import OutageRules, lemon_features  # noqa: E402
from rsc_health.historian.lemons.verdicts import DEFAULTS, LemonRules, flagged  # noqa: E402
from rsc_health.historian.schema import check_results, node_events  # noqa: E402

DATES = "2015-10-01,2016-01-01,2016-04-01,2016-07-01,2016-10-01,2017-01-01,2017-07-01," \
        "2018-01-01,2018-07-01,2019-01-01,2019-07-01"


def load(url: str, paths: dict[str, Path], mode: str, tz: str | None = None,
         with_tickets: bool = False) -> None:
    engine = db.connect(url, upgrade=True, create_missing=True)
    # Every wall-clock file in the same zone, as an operator passes --tz to each import.
    zone = ZoneInfo(tz) if tz else None
    try:
        inventory.import_csv(engine, paths["inventory"], tz=zone)
        if with_tickets:
            tickets.import_csv(engine, paths["tickets"], tz=zone)
        if mode == "events":
            events.ingest_file(engine, paths["events"], tz=tz)
        else:
            checks.ingest_file(engine, paths["checks"])
    finally:
        engine.dispose()


def score(url: str, frame, dates: list[datetime], rules: dict[str, LemonRules],
          rate_window_days: float, reference=_titan.reference):
    outages = OutageRules.from_config({**DEFAULTS, "rate_window_days": rate_window_days})
    window = outages.rate_window_days
    engine = db.connect(url, create_missing=True)
    rows = []
    try:
        for as_of in dates:
            t0 = time.perf_counter()
            f = lemon_features(engine, as_of, DEFAULTS["window_days"],
                               history_days=DEFAULTS["history_days"], outages=outages)
            took = time.perf_counter() - t0
            key = reference(frame, as_of, window)
            struck = incident_nodes(engine, f)
            in_service = f.attrs["left_out"]["node_days"] / window
            for name, r in rules.items():
                hit = set(f.index[flagged(f, r)])
                rows.append({
                    "as_of": as_of.date().isoformat(), "rules": name, "flagged": len(hit),
                    "target": len(key["target"]),
                    "tp_recall": len(hit & key["target"]),
                    "tp_precision": len(hit & key["unusual"]),
                    "incident_days": len(f.attrs["left_out"]["incident_days"]),
                    # nodes that began an episode on an incident day, how many of them are
                    # flagged, and how many would be at the date's flag rate over the fleet
                    "struck": len(struck), "struck_flagged": len(hit & struck),
                    "struck_flagged_unusual": len(hit & struck & key["unusual"]),
                    "struck_expected": len(struck) * len(hit) / max(in_service, 1.0),
                    "seconds": round(took, 2),
                })
    finally:
        engine.dispose()
    return rows


def incident_nodes(engine, f) -> set[str]:
    """The nodes with an event (node_events start, or a failed XID check) on one of the
    incident days the features left out, in the incident's peer group."""
    days = {(d["group"], d["day"]) for d in f.attrs["left_out"]["incident_days"]}
    if not days:
        return set()
    lo = min(pd.Timestamp(d) for _, d in days)
    hi = max(pd.Timestamp(d) for _, d in days) + pd.Timedelta(days=1)
    with engine.connect() as conn:
        rows = conn.execute(
            select(node_events.c.node, node_events.c.start)
            .where(node_events.c.start >= lo, node_events.c.start < hi)
            .union_all(select(check_results.c.node, check_results.c.time).where(
                check_results.c.check == "xid", check_results.c.status == "fail",
                check_results.c.time >= lo, check_results.c.time < hi))).all()
    group = f["peer_group"]
    return {n for n, t in rows if n in group.index
            and (group[n], pd.Timestamp(t).date().isoformat()) in days}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dates", default=DATES)
    ap.add_argument("--data", type=Path, default=_titan.DATA)
    ap.add_argument("--rate-window", default="90,365",
                    help="[lemon] rate_window_days to score, comma-separated")
    args = ap.parse_args(argv)
    frame = _titan.read(args.data)
    dates = [datetime.fromisoformat(d) for d in args.dates.split(",")]
    base = LemonRules.from_config()
    rules = {
        "defaults": base,
        "rate only": LemonRules(
            {k: (v if k == "rate_surprise" else 0.0) for k, v in base.thresholds.items()},
            min_signals=99, strong=("rate_surprise",)),
        "paper rules": LemonRules.from_config({"rate_surprise": 0, "peer_q": 1.0}),
    }
    with tempfile.TemporaryDirectory() as tmp:
        paths = _titan.write_imports(frame, Path(tmp))
        for mode in ("events", "checks"):
            url = f"sqlite:///{tmp}/{mode}.db"
            t0 = time.perf_counter()
            load(url, paths, mode)
            print(f"titan {mode}: loaded in {time.perf_counter() - t0:.1f} s")
            for w in (float(x) for x in args.rate_window.split(",")):
                report(f"titan_{mode}_w{w:g}", score(url, frame, dates, rules, w))
    return 0


def report(label: str, rows: list[dict]) -> None:
    print(f"-- {label}")
    print(f"{'as_of':<11} {'rules':<12} {'flagged':>7} {'target':>6} "
          f"{'recall':>6} {'precision':>9} {'incidents':>9} {'struck':>6} "
          f"{'flagged':>7} {'expected':>8} {'s':>5}")
    totals: dict[str, list[float]] = {}
    for r in rows:
        rec = r["tp_recall"] / r["target"] if r["target"] else 1.0
        prec = r["tp_precision"] / r["flagged"] if r["flagged"] else 1.0
        print(f"{r['as_of']:<11} {r['rules']:<12} {r['flagged']:>7} {r['target']:>6} "
              f"{rec:>6.2f} {prec:>9.2f} {r['incident_days']:>9} {r['struck']:>6} "
              f"{r['struck_flagged']:>7} {r['struck_expected']:>8.2f} {r['seconds']:>5}")
        t = totals.setdefault(r["rules"], [0, 0, 0, 0, 0, 0, 0])
        for i, k in enumerate(("flagged", "target", "tp_recall", "tp_precision",
                               "struck_flagged", "struck_expected", "struck_flagged_unusual")):
            t[i] += r[k]
    for name, (fl, tg, tpr, tpp, sf, se, su) in totals.items():
        # Incident episodes count in no node's rate test, so a struck node is flagged on its
        # other episodes: the key says whether it is unusual anyway (the naive expectation,
        # struck nodes x the date's flag share, ignores that lemons fail on more days).
        print(f"BENCH\t{label}_{name.replace(' ', '_')}\tflagged_on_incident_days\t{sf:g}\t"
              f"naive expectation {se:.2f}; {su:g} of them unusual by the key")
        rec, prec = (tpr / tg if tg else 1.0), (tpp / fl if fl else 1.0)
        print(f"BENCH\t{label}_{name.replace(' ', '_')}\trecall\t{rec:.3f}\t")
        print(f"BENCH\t{label}_{name.replace(' ', '_')}\tprecision\t{prec:.3f}\t")
        print(f"BENCH\t{label}_{name.replace(' ', '_')}\ttargets\t{tg}\t")


if __name__ == "__main__":
    sys.exit(main())
