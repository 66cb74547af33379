"""Titan's GPU failure history (OLCF, SC20; tests/fixtures/titan/SOURCE.txt) as an operator
would import it, and the reference answers the lemon and reliability figures are scored
against, computed here independently of rsc_health's own code.

gc_full.csv: one row per GPU life span at a node location (SN, location, insert, remove,
duration, out, event); `event` DBE or OTB says the life span ended in that failure, at
`remove`. One GPU per node. The imports made from it:

- events: one sacctmgr-format DOWN per failure (node = location, start = remove, reason the
  failure class), for `healthctl ingest events`;
- checks: the same failures as XID check results (DBE: XID 48, OTB: XID 79, on gpu0), for
  `healthctl ingest checks`;
- inventory: each location in service from its first insert to its last remove, for
  `healthctl ingest inventory`;
- gpus: every life span as a GPU interval (serial, node, gpu0, insert, remove), for
  `healthctl ingest gpus`.
"""

from __future__ import annotations

import json
import os
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats import poisson

# The copy kept as a test fixture (tests/fixtures/titan/SOURCE.txt); RSC_TITAN_DATA for another.
DATA = Path(os.environ.get("RSC_TITAN_DATA", Path(__file__).resolve().parents[1] / "tests"
                           / "fixtures" / "titan" / "gc_full.csv.gz"))
XID = {"DBE": "xid48", "OTB": "xid79"}


def read(path: Path = DATA) -> pd.DataFrame:
    frame = pd.read_csv(path, dtype={"SN": str})
    frame["insert"] = pd.to_datetime(frame["insert"])
    frame["remove"] = pd.to_datetime(frame["remove"])
    return frame


def failures(frame: pd.DataFrame) -> pd.DataFrame:
    """node, time, kind, serial of every DBE/OTB failure."""
    f = frame[frame["event"].isin(list(XID))]
    return pd.DataFrame({"node": f["location"], "time": f["remove"], "kind": f["event"],
                         "serial": f["SN"]}).sort_values(["time", "node"]).reset_index(drop=True)


def write_imports(frame: pd.DataFrame, out: Path) -> dict[str, Path]:
    out.mkdir(parents=True, exist_ok=True)
    fails = failures(frame)
    paths = {"events": out / "events.txt", "checks": out / "checks.jsonl",
             "inventory": out / "inventory.csv", "gpus": out / "gpus.csv"}
    with paths["gpus"].open("w") as fh:
        fh.write("serial,node,slot,from,to\n")
        for r in frame.dropna(subset=["insert"]).itertuples():
            to = "" if pd.isna(r.remove) else f"{r.remove:%Y-%m-%dT%H:%M:%S}"
            fh.write(f"{r.SN},{r.location},gpu0,{r.insert:%Y-%m-%dT%H:%M:%S},{to}\n")
    with paths["events"].open("w") as fh:
        fh.write("NodeName|TimeStart|TimeEnd|State|Reason|Cluster\n")
        for r in fails.itertuples():
            fh.write(f"{r.node}|{r.time:%Y-%m-%dT%H:%M:%S}|"
                     f"{r.time + timedelta(hours=4):%Y-%m-%dT%H:%M:%S}|DOWN|GPU {r.kind}|titan\n")
    with paths["checks"].open("w") as fh:
        for r in fails.itertuples():
            fh.write(json.dumps({"time": r.time.isoformat(), "node": r.node, "check": "xid",
                                 "status": "fail", "code": XID[r.kind], "component": "gpu0",
                                 "detail": f"GPU {r.serial} {r.kind}"}) + "\n")
    life = frame.groupby("location").agg(start=("insert", "min"), end=("remove", "max"))
    with paths["inventory"].open("w") as fh:
        fh.write("node,cluster,partition,from,to\n")
        for node, r in life.iterrows():
            fh.write(f"{node},titan,batch,{r.start:%Y-%m-%dT%H:%M:%S},"
                     f"{r.end:%Y-%m-%dT%H:%M:%S}\n")
    return paths


def node_days(frame: pd.DataFrame, lo: datetime, hi: datetime) -> pd.Series:
    """Per location: its days in service (first insert to last remove) inside [lo, hi)."""
    life = frame.groupby("location").agg(start=("insert", "min"), end=("remove", "max"))
    start = life["start"].clip(lower=pd.Timestamp(lo))
    end = life["end"].clip(upper=pd.Timestamp(hi))
    return ((end - start).dt.total_seconds() / 86400.0).clip(lower=0)


def separate_failures(fails: pd.DataFrame, lo, hi, apart_days: float = 1) -> pd.Series:
    """Per node: its failures in [lo, hi) more than `apart_days` after the node's previous one
    (the first always counts): "separate occasions more than a day apart"."""
    f = fails[(fails["time"] >= lo) & (fails["time"] < hi)].sort_values(["node", "time"])
    prev = f.groupby("node")["time"].shift()
    apart = pd.Timedelta(days=apart_days)
    return f[prev.isna() | (f["time"] - prev > apart)].groupby("node").size()


def bh(p: np.ndarray) -> np.ndarray:
    order = np.argsort(p)
    q = p[order] * len(p) / np.arange(1, len(p) + 1)
    q = np.minimum.accumulate(q[::-1])[::-1]
    out = np.empty(len(p))
    out[order] = np.minimum(q, 1)
    return out


def reference(frame: pd.DataFrame, as_of: datetime, window_days: float) -> dict[str, set[str]]:
    """The answer key at `as_of`, by its own definitions (not rsc_health's):

    target   nodes whose separate failures in the window are far above the fleet's rate: the
             exact Poisson upper tail at the whole fleet's rate in that window (all its
             separate failures per node-day, times the node's days), Bonferroni-corrected
             across every node in service, below 0.001;
    unusual  nodes statistically unusual in the window or over their life to as_of: the same
             tail, Benjamini-Hochberg adjusted across the fleet, below 0.05, in the window or
             over the node's whole service to as_of."""
    fails = failures(frame)
    lo = as_of - timedelta(days=window_days)
    out: dict[str, set[str]] = {"target": set(), "unusual": set()}
    first = frame["insert"].min()
    for name, (a, b) in {"window": (lo, as_of), "life": (first, as_of)}.items():
        days = node_days(frame, a, b)
        days = days[days > 0]
        n = separate_failures(fails, a, b).reindex(days.index, fill_value=0)
        rate = n.sum() / days.sum()
        p = poisson.sf(n.to_numpy() - 1, rate * days.to_numpy())
        if name == "window":
            out["target"] = set(days.index[p * len(p) < 0.001])
        out["unusual"] |= set(days.index[bh(p) < 0.05])
    return out


def quarterly_mtbf(frame: pd.DataFrame) -> pd.DataFrame:
    """System MTBF per calendar quarter, the paper's way as we read it: hours in the quarter
    over DBE+OTB failures in it."""
    fails = failures(frame)
    q = fails["time"].dt.to_period("Q")
    count = fails.groupby(q).size()
    hours = pd.Series({p: (p.end_time - p.start_time).total_seconds() / 3600 for p in count.index})
    hours = hours.round()
    return pd.DataFrame({"failures": count, "hours": hours, "mtbf_h": hours / count})
