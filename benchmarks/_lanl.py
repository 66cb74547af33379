"""LANL's public failure data (LA-UR-05-7318: 22 systems, 1996-2005; tests/fixtures/lanl/
SOURCE.txt) as an operator would import it, and the answer key for the lemon figures,
computed here independently of rsc_health's code, each node against its own system's rate.

One row per node outage: System, nodenum, Prob Started, Prob Fixed (Los Alamos wall-clock
time: imported with --tz America/Denver), the cause in one of Facilities, Hardware, Human
Error, Network, Undetermined, Software. Imports: events (node lanl<System>-n<nodenum>,
cluster lanl<System>, reason "<category>: <detail>") and an inventory (every node of a system,
the `nodes` count and every node number seen, in service from the system's first record to
its last: the data holds no install dates finer than a month), and the same outages as repair
tickets (a site that imports its ticket system too).
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats import poisson

DATA = Path(os.environ.get("RSC_LANL_DATA", Path(__file__).resolve().parents[1] / "tests"
                           / "fixtures" / "lanl" / "LA-UR-05-7318-failure-data-1996-2005.csv.xz"))
CATEGORIES = ("Facilities", "Hardware", "Human Error", "Network", "Undetermined", "Software")
TZ = "America/Denver"


def read(path: Path = DATA) -> pd.DataFrame:
    raw = pd.read_csv(path)
    raw = raw[raw["nodenum"].notna()]
    cat = raw[list(CATEGORIES)]
    which = cat.notna().idxmax(axis=1)
    detail = [raw.at[i, c] for i, c in zip(raw.index, which, strict=True)]
    fmt = "%m/%d/%Y %H:%M"
    return pd.DataFrame({
        "system": raw["System"].astype(int),
        "size": raw["nodes"],
        "node": [f"lanl{s}-n{int(n)}" for s, n in zip(raw["System"], raw["nodenum"],
                                                      strict=True)],
        "start": pd.to_datetime(raw["Prob Started"], format=fmt),
        "end": pd.to_datetime(raw["Prob Fixed"], format=fmt, errors="coerce"),
        "reason": [f"{c}: {d}" for c, d in zip(which, detail, strict=True)],
    }).reset_index(drop=True)


def inventory(frame: pd.DataFrame) -> pd.DataFrame:
    """node, group (cluster), start, end: every node of every system."""
    rows = []
    for system, g in frame.groupby("system"):
        size = int(g["size"].max()) if g["size"].notna().any() else 0
        nodes = set(g["node"]) | {f"lanl{system}-n{i}" for i in range(size)}
        lo, hi = g["start"].min(), g["start"].max()
        rows += [(n, f"lanl{system}", lo, hi) for n in sorted(nodes)]
    return pd.DataFrame(rows, columns=["node", "group", "start", "end"])


def write_imports(frame: pd.DataFrame, out: Path) -> dict[str, Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = {"events": out / "events.txt", "inventory": out / "inventory.csv",
             "tickets": out / "tickets.csv"}
    with paths["tickets"].open("w") as fh:  # the same outages from the repair-ticket system
        fh.write("node,opened,closed,reason\n")
        for r in frame.itertuples():
            closed = "" if pd.isna(r.end) else f"{r.end:%Y-%m-%dT%H:%M:%S}"
            reason = str(r.reason).replace(",", ";").replace('"', "'")
            fh.write(f"{r.node},{r.start:%Y-%m-%dT%H:%M:%S},{closed},{reason}\n")
    with paths["events"].open("w") as fh:
        fh.write("NodeName|TimeStart|TimeEnd|State|Reason|Cluster\n")
        for r in frame.itertuples():
            end = "Unknown" if pd.isna(r.end) else f"{r.end:%Y-%m-%dT%H:%M:%S}"
            reason = str(r.reason).replace("|", "/")
            fh.write(f"{r.node}|{r.start:%Y-%m-%dT%H:%M:%S}|{end}|DOWN|{reason}|"
                     f"lanl{r.system}\n")
    inv = inventory(frame)
    with paths["inventory"].open("w") as fh:
        fh.write("node,cluster,partition,from,to\n")
        for r in inv.itertuples():
            fh.write(f"{r.node},{r.group},,{r.start:%Y-%m-%dT%H:%M:%S},"
                     f"{r.end:%Y-%m-%dT%H:%M:%S}\n")
    return paths


def _bh(p: np.ndarray) -> np.ndarray:
    order = np.argsort(p)
    q = p[order] * len(p) / np.arange(1, len(p) + 1)
    q = np.minimum.accumulate(q[::-1])[::-1]
    out = np.empty(len(p))
    out[order] = np.minimum(q, 1)
    return out


def reference(frame: pd.DataFrame, as_of: datetime, window_days: float) -> dict[str, set[str]]:
    """As _titan.reference, each node against its own system's rate: target, separate
    outages (more than a day apart) in the window with a Poisson tail at the system's rate,
    Bonferroni across every node in service, below 0.001; unusual, BH below 0.05 in the
    window or over the node's service to as_of. Times are UTC (Denver wall-clock converted)."""
    f = frame.assign(time=frame["start"].dt.tz_localize(TZ, ambiguous="NaT",
                                                      nonexistent="shift_forward")
                     .dt.tz_convert("UTC").dt.tz_localize(None)).dropna(subset=["time"])
    inv = inventory(frame)
    out: dict[str, set[str]] = {"target": set(), "unusual": set()}
    lo = as_of - timedelta(days=window_days)
    for name, (a, b) in {"window": (lo, as_of), "life": (inv["start"].min(), as_of)}.items():
        start = inv["start"].clip(lower=pd.Timestamp(a))
        end = inv["end"].clip(upper=pd.Timestamp(b))
        days = pd.Series(((end - start).dt.total_seconds() / 86400).clip(lower=0).to_numpy(),
                         index=inv["node"])
        group = pd.Series(inv["group"].to_numpy(), index=inv["node"])
        keep = days > 0
        days, group = days[keep], group[keep]
        w = f[(f["time"] >= a) & (f["time"] < b)].sort_values(["node", "time"])
        prev = w.groupby("node")["time"].shift()
        sep = w[prev.isna() | (w["time"] - prev > pd.Timedelta(days=1))].groupby("node").size()
        n = sep.reindex(days.index, fill_value=0)
        rate = n.groupby(group).sum() / days.groupby(group).sum()
        mu = group.map(rate).to_numpy() * days.to_numpy()
        p = poisson.sf(n.to_numpy() - 1, mu)
        if name == "window":
            out["target"] = set(days.index[p * len(p) < 0.001])
        out["unusual"] |= set(days.index[_bh(p) < 0.05])
    return out
