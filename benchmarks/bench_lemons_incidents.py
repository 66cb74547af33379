"""Nodes flagged on fleet-wide incident days (issue 23's target: no more than the statistically
expected number), on LANL's public failure data (_lanl.py), imported as
bench_lemons_lanl.py does, events alone and with the outages as tickets too, at each year end.

Per as-of date, over the incident days the features left out (f.attrs["left_out"]): the nodes
that began an episode on one ("struck") and how many of them are flagged; then three ways to
say how many should be:

    group share   each struck node flagged with its peer group's flagged share of its nodes
                  (the per-node flag probability), summed; its Poisson-binomial 95th and 99th
                  percentiles over every struck node of every date
    ep-weighted   the same with the group's share of (non-incident) episodes held by flagged
                  nodes: a node that fails often is struck more often (size-biased), so this
                  is the expectation if an incident strikes nodes as an ordinary day does
    caused        the counterfactual: flagged with the incident days' rows (node_events,
                  tickets of the group's nodes that UTC day) deleted from a copy of the
                  database; `caused` are struck nodes flagged only with the rows in
and `already`: struck and flagged nodes that were already flagged at 00:00 of their first
incident day (a lemon before the incident).

    python3 benchmarks/bench_lemons_incidents.py [--rate-window 90,365]
"""

from __future__ import annotations

import argparse
import shutil
import sqlite3
import sys
import tempfile
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _lanl  # noqa: E402
import bench_lemons_titan as bench  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from rsc_health.historian import db  # noqa: E402
from rsc_health.historian.lemons.features import OutageRules, lemon_features  # noqa: E402
from rsc_health.historian.lemons.verdicts import DEFAULTS, LemonRules, flagged  # noqa: E402


def _flags(url: str, as_of: datetime, outages: OutageRules, rules: LemonRules):
    engine = db.connect(url, create_missing=True)
    try:
        f = lemon_features(engine, as_of, DEFAULTS["window_days"],
                           history_days=DEFAULTS["history_days"], outages=outages,
                           host_jobs=False)
        struck = bench.incident_nodes(engine, f)
    finally:
        engine.dispose()
    return f, set(f.index[flagged(f, rules)]), struck


def poisson_binomial_quantile(ps: list[float], q: float) -> int:
    dist = np.array([1.0])
    for p in ps:
        dist = np.convolve(dist, [1 - p, p])
    return int(np.searchsorted(np.cumsum(dist), q))


def _without_incident_rows(src: str, dst: Path, days: list[dict], group: pd.Series) -> str:
    shutil.copy(src, dst)
    con = sqlite3.connect(dst)
    try:
        for d in days:
            lo = pd.Timestamp(d["day"])
            bounds = (f"{lo:%Y-%m-%d %H:%M:%S}", f"{lo + pd.Timedelta(days=1):%Y-%m-%d %H:%M:%S}")
            for node in group.index[group == d["group"]]:
                con.execute("DELETE FROM node_events WHERE node = ? AND start >= ? AND start < ?",
                            (node, *bounds))
                con.execute("DELETE FROM tickets WHERE node = ? AND opened >= ? AND opened < ?",
                            (node, *bounds))
        con.commit()
    finally:
        con.close()
    return f"sqlite:///{dst}"


def measure(url: str, dates: list[datetime], outages: OutageRules, rules: LemonRules,
            tmp: Path, label: str) -> dict:
    tot = {"struck": 0, "flagged": 0, "group_share": 0.0, "ep_weighted": 0.0, "caused": 0,
           "already": 0}
    ps: list[float] = []
    for as_of in dates:
        f, hit, struck = _flags(url, as_of, outages, rules)
        days = f.attrs["left_out"]["incident_days"]
        if not struck:
            continue
        group = f["peer_group"]
        size = f.groupby("peer_group")["peer_nodes"].first()
        is_hit = pd.Series([n in hit for n in f.index], index=f.index)
        share = is_hit.groupby(group).sum() / size
        ep = f["episodes"]
        held = ep[is_hit].groupby(group[is_hit]).sum().reindex(size.index, fill_value=0)
        wshare = (held / ep.groupby(group).sum().replace(0, np.nan)).fillna(0.0)
        p_group = [float(share.get(group[n], 0.0)) for n in struck]
        p_w = [float(wshare.get(group[n], 0.0)) for n in struck]
        ps += p_group
        cf = _without_incident_rows(url.removeprefix("sqlite:///"), tmp / "cf.db", days, group)
        _, hit_cf, _ = _flags(cf, as_of, outages, rules)
        already = 0
        for node in hit & struck:
            first = min(d["day"] for d in days if d["group"] == group[node])
            already += node in _flags(url, datetime.fromisoformat(first), outages, rules)[1]
        caused = len((hit - hit_cf) & struck)
        print(f"{label} {as_of.date()} incident_days={len(days)} struck={len(struck)} "
              f"flagged={len(hit & struck)} group_share={sum(p_group):.2f} "
              f"ep_weighted={sum(p_w):.2f} caused={caused} already={already}")
        tot["struck"] += len(struck)
        tot["flagged"] += len(hit & struck)
        tot["group_share"] += sum(p_group)
        tot["ep_weighted"] += sum(p_w)
        tot["caused"] += caused
        tot["already"] += already
    tot["group_share_q95"] = poisson_binomial_quantile(ps, 0.95)
    tot["group_share_q99"] = poisson_binomial_quantile(ps, 0.99)
    return tot


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate-window", default="90,365")
    args = ap.parse_args(argv)
    frame = _lanl.read()
    dates = [datetime(y, 1, 1) for y in range(1998, 2006)]
    rules = LemonRules.from_config()
    with tempfile.TemporaryDirectory() as tmp:
        paths = _lanl.write_imports(frame, Path(tmp))
        for with_tickets in (False, True):
            what = "events_tickets" if with_tickets else "events"
            url = f"sqlite:///{tmp}/lanl{int(with_tickets)}.db"
            bench.load(url, paths, "events", tz=_lanl.TZ, with_tickets=with_tickets)
            for w in (float(x) for x in args.rate_window.split(",")):
                outages = OutageRules.from_config({**DEFAULTS, "rate_window_days": w})
                t = measure(url, dates, outages, rules, Path(tmp), f"lanl_{what}_w{w:g}")
                print(f"BENCH\tlanl_{what}_w{w:g}\tflagged_on_incident_days\t{t['flagged']}\t"
                      f"of {t['struck']} struck; expected {t['group_share']:.2f} at the group "
                      f"share (q95 {t['group_share_q95']}, q99 {t['group_share_q99']}), "
                      f"{t['ep_weighted']:.2f} episode-weighted; caused by the incident "
                      f"{t['caused']}; already flagged before it {t['already']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
