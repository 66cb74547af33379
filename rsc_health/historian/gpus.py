"""GPU identity: failures attributed to the GPU by serial as well as to the node.

A failure (lemons.features / metrics.reliability: a node's own outage or XID event) at time t
on node N belongs to the GPU whose interval on N covers t (start <= t <= end: a GPU removed
for the failure leaves at its time). With a slot on both sides (the XID's component, gpu3)
the slot must match too; without, every GPU then in the node is a suspect, so only nodes with
one suspect give the GPU a failure.

A GPU that failed in two or more nodes is a repeat offender: the fault travelled with it. The
nodes it left are not blamed for its failures there (`moved_gpu_failures`).
"""

from __future__ import annotations

from datetime import datetime

import pandas as pd
from sqlalchemy import Engine, select

from rsc_health.historian.schema import gpu_inventory as G


def gpu_intervals(engine: Engine, nodes=None) -> pd.DataFrame:
    stmt = select(G.c.serial, G.c.node, G.c.slot, G.c.start, G.c.end)
    with engine.connect() as conn:
        frame = pd.DataFrame(conn.execute(stmt).all(),
                             columns=["serial", "node", "slot", "start", "end"])
    if nodes is not None:
        frame = frame[frame["node"].isin(set(nodes))]
    frame["start"] = pd.to_datetime(frame["start"])
    frame["end"] = pd.to_datetime(frame["end"])
    return frame


def attribute(failures: pd.DataFrame, intervals: pd.DataFrame) -> pd.DataFrame:
    """`failures` (node, time, optional component) with the serial of the GPU each belongs
    to (rows whose GPU cannot be told are dropped)."""
    if failures.empty or intervals.empty:
        return failures.iloc[0:0].assign(serial=pd.Series(dtype=object))
    f = failures.reset_index(names="_row")
    f["time"] = pd.to_datetime(f["time"])
    m = f.merge(intervals, on="node", how="inner")
    inside = (m["start"] <= m["time"]) & (m["end"].isna() | (m["time"] <= m["end"]))
    m = m[inside]
    if "component" in m:
        slotted = (m["slot"] != "") & m["component"].fillna("").ne("")
        m = m[~slotted | (m["slot"] == m["component"])]
    one = m.groupby("_row")["serial"].transform("nunique") == 1
    out = m[one].drop_duplicates("_row").set_index("_row")[[*failures.columns, "serial"]]
    out.index.name = failures.index.name
    return out


def repeat_gpus(attributed: pd.DataFrame) -> pd.DataFrame:
    """serial, nodes (sorted), failures: the GPUs with failures in two or more nodes."""
    if attributed.empty:
        return pd.DataFrame(columns=["serial", "nodes", "failures"])
    g = attributed.groupby("serial").agg(
        nodes=("node", lambda s: sorted(set(s))), failures=("node", "size"))
    g = g[g["nodes"].map(len) >= 2].reset_index()
    return g.sort_values(["failures", "serial"], ascending=[False, True]).reset_index(drop=True)


def moved_gpu_failures(engine: Engine, failures: pd.DataFrame, as_of: datetime,
                       rules=None) -> pd.Series:
    """Boolean per row of `failures` (node, time): the failure belongs to a GPU that failed
    in two or more nodes before `as_of` (its whole history: metrics.reliability.failures); the
    node is not blamed for it. All False without a GPU inventory."""
    from rsc_health.historian.metrics.reliability import failures as own_failures

    intervals = gpu_intervals(engine)
    none = pd.Series(False, index=failures.index)
    if intervals.empty or failures.empty:
        return none
    history = own_failures(engine, datetime(1970, 1, 1), as_of, rules)
    movers = set(repeat_gpus(attribute(history[["node", "time"]], intervals))["serial"])
    if not movers:
        return none
    blamed = attribute(failures[["node", "time"]], intervals[intervals["serial"].isin(movers)])
    return pd.Series(failures.index.isin(blamed.index), index=failures.index)
